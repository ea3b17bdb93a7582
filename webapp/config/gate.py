"""The gate in front of Django: past this web process's capacity, a generation request is refused
by the ASGI application itself (503 ``server_overloaded``, ``Retry-After``), before Django, the
database or the key check see it.

Why here: a refusal decided inside Django costs what every Django request costs on this process's
one core (the GIL): middleware, the key's database read, the body, a usage record. Under a burst of
1,000 streams every refusal came after 5 s or more (p99 50 s, bench/shedding.py) and the admitted
streams waited behind them. Here a refusal is a counter compared, a request id drawn and a body
written once at start sent: tens of microseconds.

What counts: a POST to a generation endpoint (``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/v1/messages``, ``/v1/responses``),
from the moment the server hands it over until the application returns: its response's last
message handed back (a stream: its end), the client gone (Django cancels the view), or a failure.
Everything else passes uncounted: the other ``/v1`` paths, ``/healthz``, ``/metrics``, the console
and the pages are short, and the chat's WebSocket is another protocol with its own limits (sockets
and running answers per user).

Capacity (``capacity``): ``PAGODA_MAX_REQUESTS_IN_FLIGHT`` when set; else the sequences the
serving workers of every model run at once (their ``max_num_seqs``, summed). No queue allowance by
default: a request admitted to wait for a slot waits a whole generation in a burst of equal
requests, and on a CPU that outlasts the queue timeout (128 SmolLM2 streams of 128 tokens take about
45 s on 2 cores; the queue gives up after 30 s), turning a prompt refusal into a slow one; set the
variable above the sum to let some queue. The capacity is read from the workers' heartbeats in a
thread, at most every CAPACITY_TTL_S, never on a request's path except the process's first (a stale
value serves meanwhile; any request, a readiness probe say, starts the first read). No serving
worker yet: no bound (the engine client answers ``no_worker``); once there was one, a read that
finds none keeps the last bound, so that heartbeats missed under load never open the gate. The
count is this process's own; the queue, checked atomically across processes, stays the authority,
and a request let through here may still be refused there (or by its key's limits: 429, as before).

Places per caller: the gate cannot know tenants (it runs before the key check), but it can tell
callers apart by their ``Authorization`` header (kept as a salted hash, never the key). At capacity,
a caller holding less than an equal part of it (capacity / the callers holding places, itself
counted) still gets a place, up to OVERBOOK x capacity in all; a caller at or over its part is
refused. So one key's flood that fills the gate does not lock every other key out: their requests
go on to the engine, whose scheduler gives them a seat by fair share (engine/scheduling/fair_share.py;
with fair share a worker claims up to 2 x max_num_seqs, the same 2x), while the flood keeps the
rest. Without it, under a 200-stream flood of one key against 128 places, another key's requests
were refused 80 times in 83 (bench/fair_share.py). A user with several keys counts once per key
here; the engine's share is per user.

A refusal here comes before the key is known, so it has no usage record; it is counted in
``pagoda:api_requests_shed_total`` (webapp/monitoring/metrics.py). Its ``X-Request-Id`` is fresh, as
every API answer's, and names nothing stored.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable

from webapp.openai_api.errors import OpenAIError
from webapp.openai_api.timing import ARRIVED
from workers.protocol import SERVER_OVERLOADED
from workers.transport import RETRY_AFTER_S, is_serving

logger = logging.getLogger(__name__)

CAPACITY_TTL_S = 1.0  # the workers' capacity, once read, is taken as current this long
LOG_EVERY_S = 10.0  # at most one log line per this long about refusals (a burst is thousands)
OVERBOOK = 2  # at capacity, callers under their part still get places up to this x capacity in all
OVERLOADED = OpenAIError(
    503, "The server is overloaded: it has as many requests in progress as it can serve; try again shortly.",
    type="server_error", code=SERVER_OVERLOADED, headers={"Retry-After": str(int(RETRY_AFTER_S))})


class InFlightGate:
    """ASGI middleware: counts the requests of ``paths`` (path -> endpoint name) in flight, in all
    and per caller (``Authorization`` header), and refuses those past ``capacity`` unless their
    caller holds less than its part (see the module's docstring).

    ``max_in_flight`` fixes the capacity; None reads it with ``read_capacity`` (blocking, run in a
    thread; None from it: no bound). ``new_request_id(endpoint)`` names a refusal;
    ``on_refused(endpoint)`` counts it; ``error_bodies`` (endpoint -> body) gives an API whose
    errors are not OpenAI's (Anthropic's Messages) its own shape.
    """

    def __init__(self, app, *, paths: dict[str, str], max_in_flight: int | None = None,
                 read_capacity: Callable[[], int | None] | None = None,
                 new_request_id: Callable[[str], str], on_refused: Callable[[str], None],
                 ttl_s: float = CAPACITY_TTL_S, error_bodies: dict[str, dict] | None = None):
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if max_in_flight is None and read_capacity is None:
            raise ValueError("give max_in_flight or read_capacity")
        self.app, self.paths, self.ttl_s = app, paths, ttl_s
        self.max_in_flight, self.read_capacity = max_in_flight, read_capacity
        self.new_request_id, self.on_refused = new_request_id, on_refused
        self.in_flight = 0
        self.held: dict[int, int] = {}  # caller (hash of its Authorization header) -> places it holds
        self.num_refused = 0
        self._capacity: int | None = max_in_flight
        self._read_at: float | None = None  # time.monotonic() of the last read, failed or not
        self._reading: asyncio.Future | None = None
        self._logged_at = float("-inf")
        self._logged_refused = 0
        self._answers = {endpoint: self._answer((error_bodies or {}).get(endpoint, OVERLOADED.to_dict()))
                         for endpoint in set(paths.values())}

    @staticmethod
    def _answer(error: dict) -> tuple[list, bytes]:
        body = json.dumps(error).encode()
        return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"x-content-type-options", b"nosniff"),
                *((name.lower().encode(), value.encode()) for name, value in OVERLOADED.headers.items())], body

    async def __call__(self, scope, receive, send):
        endpoint = self._counted(scope)
        if endpoint is None:
            if self.max_in_flight is None and self._is_stale():
                self._read()  # any request (a readiness probe) readies the capacity for the first burst
            return await self.app(scope, receive, send)
        capacity = self._capacity if self.max_in_flight is not None else await self.capacity()
        caller = hash(next((value for name, value in scope["headers"] if name == b"authorization"), b""))
        held = self.held.get(caller, 0)
        if capacity is not None and self.in_flight >= capacity and not self._is_under_part(held, capacity):
            return await self._refuse(send, endpoint, capacity)
        self.in_flight += 1
        self.held[caller] = held + 1
        scope[ARRIVED] = time.monotonic()  # the request's Server-Timing starts here (openai_api/timing.py)
        try:
            return await self.app(scope, receive, send)
        finally:  # returned, raised, or cancelled (the client left, the server stops)
            self.in_flight -= 1
            if (left := self.held[caller] - 1) > 0:
                self.held[caller] = left
            else:
                del self.held[caller]

    def _is_under_part(self, held: int, capacity: int) -> bool:
        """At capacity: whether a caller holding ``held`` places gets one more (below its equal
        part of the capacity, the callers holding places and itself counted; OVERBOOK x in all)."""
        num_callers = len(self.held) + (held == 0)
        return self.in_flight < OVERBOOK * capacity and held * num_callers < capacity

    def _counted(self, scope) -> str | None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        path = scope["path"]
        root = scope.get("root_path")
        if root and path.startswith(root):
            path = path[len(root):]
        return self.paths.get(path)

    @property
    def last_capacity(self) -> int | None:
        """The capacity as last read (None: no bound, or none read yet); never reads."""
        return self._capacity

    async def capacity(self) -> int | None:
        """The current capacity; waits for a read only when none has succeeded yet."""
        if self.max_in_flight is not None:
            return self.max_in_flight
        if self._read_at is None:
            try:
                await asyncio.shield(self._read())
            except Exception:  # logged by _stored
                pass
        elif self._is_stale():
            self._read()  # in the background: this request takes the value read a moment ago
        return self._capacity

    def _is_stale(self) -> bool:
        return self._read_at is None or time.monotonic() - self._read_at >= self.ttl_s

    def _read(self) -> Awaitable[None]:
        if self._reading is None:
            loop = asyncio.get_running_loop()
            self._reading = loop.run_in_executor(None, self.read_capacity)
            self._reading.add_done_callback(self._stored)
        return self._reading

    def _stored(self, reading: asyncio.Future) -> None:
        self._reading = None
        if reading.cancelled():
            return
        self._read_at = time.monotonic()  # a failed read is tried again after ttl_s, not at once
        if reading.exception() is not None:  # the last capacity read stays (none yet: no bound)
            logger.warning("could not read the serving workers' capacity: %s", reading.exception())
            return
        capacity = reading.result()
        if capacity is None and self._capacity is not None:
            return  # no serving worker seen: a heartbeat missed under load must not open the gate
        if capacity != self._capacity:
            logger.info("in-flight capacity for generation requests: %s (was %s)", capacity, self._capacity)
        self._capacity = capacity

    async def _refuse(self, send, endpoint: str, capacity: int) -> None:
        request_id = self.new_request_id(endpoint)
        head, body = self._answers[endpoint]
        await send({"type": "http.response.start", "status": OVERLOADED.status,
                    "headers": [*head, (b"x-request-id", request_id.encode())]})
        await send({"type": "http.response.body", "body": body})
        self.num_refused += 1
        self.on_refused(endpoint)
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            logger.warning("overloaded: refused %d requests (503 server_overloaded) since the last such line; "
                           "%d in flight, capacity %d", self.num_refused - self._logged_refused, self.in_flight,
                           capacity)
            self._logged_at, self._logged_refused = now, self.num_refused


def serving_capacity() -> int | None:
    """The sequences the serving workers of every model run at once (their max_num_seqs, summed);
    None when none serves. Blocking (a Redis read in distributed mode): the gate calls it in a thread."""
    from django.conf import settings

    from workers.connect import get_engine_client

    serving = [w for w in get_engine_client(settings.REDIS_URL).live_workers() if is_serving(w)]
    return sum(max(1, w.max_num_seqs) for w in serving) if serving else None


def gate_generations(app) -> InFlightGate:
    """``app`` (the HTTP application) behind the gate, as the settings and the URL map configure it."""
    from django.conf import settings
    from django.urls import reverse

    from webapp.monitoring.metrics import observe_api_shed, watch_api_gate
    from webapp.openai_api.anthropic_render import error_body as anthropic_error
    from webapp.openai_api.services import CHAT, COMPLETIONS, EMBEDDINGS, MESSAGES, RESPONSES, new_request_id

    paths = {reverse("chat-completion-create"): CHAT, reverse("completion-create"): COMPLETIONS,
             reverse("embedding-create"): EMBEDDINGS, reverse("message-create"): MESSAGES,
             reverse("response-create"): RESPONSES}
    gate = InFlightGate(app, paths=paths, max_in_flight=settings.PAGODA_MAX_REQUESTS_IN_FLIGHT,
                        read_capacity=serving_capacity, new_request_id=new_request_id, on_refused=observe_api_shed,
                        error_bodies={MESSAGES: anthropic_error(OVERLOADED)})
    watch_api_gate(lambda: gate.in_flight, lambda: gate.last_capacity)
    return gate
