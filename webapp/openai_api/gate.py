"""This web process's own gate in front of a model's queue: a request that the model's workers and
queue cannot take is refused at once (503 server_overloaded, as the queue itself answers), before
the serializer, the tokenizer and the database work of preparing it.

Why: under a burst every request of this process shares its one core (the GIL), so the queue's
own refusal (workers.transport) came only once a request had been prepared like an admitted one;
1,000 streams at once on a 2-core machine had their refusals answered after 16 s (median) to 27 s,
the admitted streams their first token after 17 s (tests/e2e/test_load_shedding.py). The cause
was the CPU each request costs before the queue sees it, not a database thread: Django runs each
request's ``sync_to_async`` calls in a thread of that request's own (``ThreadSensitiveContext``).

A request holds a *place* from here until its view returns (a stream: its first chunk; a
non-streamed answer: its end). The gate refuses once this process holds as many places for the
model as its serving workers can run and queue: the sum of their max_num_seqs plus the queue bound
(Admission.queue_bound), read from the workers' announcements at most every CAPACITY_TTL_S. The
queue stays the authority across web processes (this counts one process): a request let through
here may still be refused there. No serving worker: no bound here (the engine client answers
no_worker).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from asgiref.sync import sync_to_async
from django.conf import settings

from webapp.openai_api import errors
from workers.connect import get_engine_client
from workers.protocol import SERVER_OVERLOADED, ErrorInfo
from workers.transport import RETRY_AFTER_S, is_serving

CAPACITY_TTL_S = 1.0  # how long the workers' capacity, once read, is taken as current
MAX_MODELS = 1000  # capacities kept (any name a client sends is looked up: a typo must not grow it)


class Place:
    """A request's place at the gate; ``release`` is idempotent."""

    def __init__(self, gate: "Gate", model: str) -> None:
        self.gate, self.model, self.held = gate, model, True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.gate.held[self.model] -= 1
            if self.gate.held[self.model] <= 0:
                del self.gate.held[self.model]


class Gate:
    def __init__(self) -> None:
        self.held: Counter[str] = Counter()
        self._capacity: dict[str, tuple[float, int | None]] = {}  # model -> (read at, places or None)
        self._reading: dict[str, asyncio.Future] = {}  # one read per model at a time

    async def enter(self, model: str) -> Place:
        """A place for a request of ``model``; OpenAIError (503 server_overloaded) if none is left."""
        capacity = await self.capacity(model)
        if capacity is not None and self.held[model] >= capacity:
            raise errors.shed(ErrorInfo(SERVER_OVERLOADED, f"the model {model!r} has too many requests "
                                        "waiting; try again shortly", retry_after=RETRY_AFTER_S))
        self.held[model] += 1
        return Place(self, model)

    async def capacity(self, model: str) -> int | None:
        read_at, places = self._capacity.get(model, (None, None))
        if read_at is not None and time.monotonic() - read_at < CAPACITY_TTL_S:
            return places
        reading = self._reading.get(model)
        if reading is None:
            reading = self._reading[model] = asyncio.ensure_future(self._read(model))
            reading.add_done_callback(lambda _: self._reading.pop(model, None))
        return await asyncio.shield(reading)

    async def _read(self, model: str) -> int | None:
        client = get_engine_client(settings.REDIS_URL)
        try:
            workers = await sync_to_async(client.live_workers, thread_sensitive=False)(model)
        except Exception:  # the queue unreachable: the engine client answers for it
            workers = []
        serving = [w for w in workers if is_serving(w)]
        places = None
        if serving:
            places = client.admission.queue_bound(serving) + sum(max(1, w.max_num_seqs) for w in serving)
        if len(self._capacity) >= MAX_MODELS:
            self._capacity.clear()
        self._capacity[model] = (time.monotonic(), places)
        return places


_gate = Gate()


def get_gate() -> Gate:
    return _gate
