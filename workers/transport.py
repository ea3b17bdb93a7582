"""The two sides of a transport: ``EngineClient`` (the web process) and ``WorkerTransport`` (a worker).

One client logic for every transport; each implementation supplies the few primitives below
(submit, read replies, heartbeats, abort) and a worker side that the engine loop drives.
Implementations live beside this file: redis_transport.py and redis_worker_transport.py (Redis
streams, distributed mode) and memory_transport.py (an in-process broker, embedded mode);
workers/connect.py picks one from the configuration its caller passes in. This module imports neither of them, nor the engine.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from typing import Protocol

from workers.protocol import (NO_WORKER, QUEUE_TIMEOUT, QUEUE_UNAVAILABLE, REQUEST_TIMEOUT,
                              SERVER_OVERLOADED, WATCH_INTERVAL_S, WORKER_LOST, Chunk, ErrorInfo,
                              GenerateRequest, Reply, UsageReport, WorkerInfo)

logger = logging.getLogger(__name__)

# Unclaimed request and no worker taking requests: how many liveness checks in a row (one per
# WATCH_INTERVAL_S) before giving up. Two, so that a claim already on its way is not mistaken
# for "nobody took it" when the only worker starts draining right after claiming.
_NO_WORKER_STRIKES = 2
# Reads of a queued request's replies that may time out in a row before it counts as an outage.
_MAX_TRANSIENT_IN_A_ROW = 3


# Default queue bound per model: this many queued requests per sequence the model's serving
# workers can run at once (the max_num_seqs they announce), so a full queue is about two
# batches of waiting: what a worker can start within a generation or two.
QUEUE_SLOTS_PER_SEQ = 2
RETRY_AFTER_S = 2.0  # what a refused client is told to wait: about one slot's turnover
UNREACHABLE_RETRY_AFTER_S = 5.0  # a Redis outage: the time a restart takes


@dataclasses.dataclass(frozen=True)
class Admission:
    """Load shedding on the client side: beyond these a request fails fast, never hangs.

    ``max_queued``: requests of one model waiting for a worker, across every web process (None:
    QUEUE_SLOTS_PER_SEQ x the serving workers' max_num_seqs); one more is refused at once with
    server_overloaded. ``queue_timeout_s``: how long a request may wait for a worker to take it
    (queue_timeout). ``request_timeout_s``: how long it may take overall, queueing included
    (request_timeout; the worker is told to abort it). None disables a deadline.
    """

    max_queued: int | None = None
    queue_timeout_s: float | None = 30.0
    request_timeout_s: float | None = 600.0

    def __post_init__(self):
        if self.max_queued is not None and self.max_queued < 1:
            raise ValueError("max_queued must be at least 1")
        for name in ("queue_timeout_s", "request_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive")

    def queue_bound(self, serving: list[WorkerInfo]) -> int:
        if self.max_queued is not None:
            return self.max_queued
        return max(1, QUEUE_SLOTS_PER_SEQ * sum(max(1, w.max_num_seqs) for w in serving))


class TransportUnreachable(Exception):
    """The transport (Redis) cannot be reached: down, restarting, or a wrong URL."""


def _unreachable(exc: Exception) -> ErrorInfo:
    """A stable message for the client; the driver's text goes to the log."""
    logger.warning("the request queue is unreachable: %s", exc)
    return ErrorInfo(QUEUE_UNAVAILABLE, "the request queue is unreachable; try again shortly",
                     retry_after=UNREACHABLE_RETRY_AFTER_S)


class EngineClient(abc.ABC):
    """Async client of the engine workers; safe to share between tasks of an event loop."""

    # Exceptions of the transport itself (Redis unreachable...): they become queue_unavailable chunks.
    transport_errors: tuple[type[Exception], ...] = ()
    # Of those, the ones that mean "no answer in time" (a read timed out while this process was
    # too busy to read, as under a burst of connections): once a request is queued, a few in a
    # row are taken as silence and the read is tried again from where it stopped.
    transient_errors: tuple[type[Exception], ...] = ()
    admission: Admission = Admission()  # replaced through workers.connect.get_engine_client

    async def generate(self, req: GenerateRequest) -> AsyncIterator[Chunk]:
        """Yield the request's chunks; the last has ``finished=True`` (and ``error`` on failure).

        ``admission`` sheds load: a full queue, a request no worker started within the queue
        deadline or one past the overall deadline ends at once with an error chunk (with
        ``retry_after``). Closing the iterator early (aclose(), cancellation) aborts the request
        in the engine.
        """
        if not req.reply_to:
            req = dataclasses.replace(req, reply_to=self._reply_address(req.request_id))
        try:
            serving = await self._serving_workers(req.model)
        except self.transport_errors as exc:
            yield Chunk.failure(req.request_id, _unreachable(exc))
            return
        if not serving:
            yield Chunk.failure(req.request_id, ErrorInfo(
                NO_WORKER, f"no live worker serves the model {req.model!r}", "model"))
            return
        admission = self.admission
        started = time.monotonic()
        queue_deadline = _deadline(started, admission.queue_timeout_s)
        deadline = _deadline(started, admission.request_timeout_s)
        ticket = None
        done = False  # a worker sent the last chunk: nothing to withdraw or abort
        try:
            ticket = await self._submit(req, admission.queue_bound(serving))
            if ticket is None:
                yield Chunk.failure(req.request_id, ErrorInfo(
                    SERVER_OVERLOADED, f"the model {req.model!r} has too many requests waiting; "
                                       "try again shortly", retry_after=RETRY_AFTER_S))
                return
            worker_id: str | None = None
            strikes = timeouts = 0
            while True:
                now = time.monotonic()
                if worker_id is None and now >= queue_deadline:
                    if await self._withdraw(req, ticket):
                        yield Chunk.failure(req.request_id, ErrorInfo(
                            QUEUE_TIMEOUT, f"no worker started the request within "
                                           f"{admission.queue_timeout_s:g} s; try again shortly",
                            retry_after=RETRY_AFTER_S))
                        return
                    queue_deadline = float("inf")  # a worker has it: its claim is on the way
                if now >= deadline:
                    yield Chunk.failure(req.request_id, ErrorInfo(
                        REQUEST_TIMEOUT, f"the request did not finish within "
                                         f"{admission.request_timeout_s:g} s",
                        retry_after=RETRY_AFTER_S))
                    return  # _clean_up aborts it in the worker
                wait_s = min(WATCH_INTERVAL_S, max(0.01, min(queue_deadline, deadline) - now))
                try:
                    replies = await self._next_replies(req, ticket, wait_s)
                    timeouts = 0
                except self.transient_errors:
                    timeouts += 1
                    if timeouts > _MAX_TRANSIENT_IN_A_ROW:
                        raise
                    logger.warning("request %s: a read of its replies timed out; reading again", req.request_id)
                    continue
                if not replies:
                    if wait_s < WATCH_INTERVAL_S:
                        continue  # woke for a deadline, not after a silent interval
                    error, strikes = await self._check_liveness(req, ticket, worker_id, strikes)
                    if error is not None:
                        yield Chunk.failure(req.request_id, error)
                        return
                    continue
                strikes = 0
                for reply in replies:
                    if reply.kind == "claimed":
                        worker_id = reply.worker_id
                    elif reply.kind == "released":  # handed back by a draining worker
                        worker_id = None
                    elif reply.chunk is not None:
                        done = reply.chunk.finished
                        yield reply.chunk
                        if done:
                            return
        except self.transport_errors as exc:
            yield Chunk.failure(req.request_id, _unreachable(exc))
        finally:
            await self._clean_up(req, ticket, done)

    async def _clean_up(self, req: GenerateRequest, ticket, done: bool) -> None:
        """Release the reply channel; unless a worker finished it, withdraw and abort it."""
        try:
            if ticket is not None:
                await self._close(req, ticket, done)
            if not done:
                await self.abort(req.model, req.request_id)
        except Exception:  # best effort: the client is leaving either way
            logger.warning("could not clean up request %s", req.request_id, exc_info=True)

    async def _check_liveness(self, req: GenerateRequest, ticket, worker_id: str | None,
                              strikes: int) -> tuple[ErrorInfo | None, int]:
        """After a silent WATCH_INTERVAL_S: is anyone still working on (or able to take) it?"""
        if worker_id is None:
            worker_id = await self._claimant(req, ticket)
        if worker_id is not None:
            if await self._is_alive(req.model, worker_id):
                return None, 0
            return ErrorInfo(WORKER_LOST, f"the worker {worker_id} serving this request stopped "
                                          f"sending heartbeats"), 0
        if await self._serving_workers(req.model):
            return None, 0
        if strikes + 1 < _NO_WORKER_STRIKES:
            return None, strikes + 1
        return ErrorInfo(NO_WORKER, f"no live worker serves the model {req.model!r} any more; "
                                    f"the request was not started", "model"), 0

    # ----------------------------------------------------------------- public, per transport
    @abc.abstractmethod
    async def abort(self, model: str, request_id: str) -> None:
        """Tell every worker of ``model`` to drop ``request_id`` (whoever holds it aborts it)."""

    @abc.abstractmethod
    def live_workers(self, model: str | None = None) -> list[WorkerInfo]:
        """Workers with a fresh heartbeat (draining ones included), optionally of one model."""

    # Without an event loop, for a caller that settles requests another process asked for (the
    # usage reconciler): what their workers reported, and aborting them.
    @abc.abstractmethod
    def usage_reports(self, request_ids: list[str]) -> dict[str, UsageReport]:
        """The workers' last reports of these requests (those within USAGE_REPORT_TTL_S of their last chunk)."""

    @abc.abstractmethod
    def abort_now(self, model: str, request_ids: list[str]) -> None:
        """``abort`` for each of ``request_ids``, from synchronous code."""

    # ----------------------------------------------------------------- transport primitives
    @abc.abstractmethod
    def _reply_address(self, request_id: str) -> str: ...

    @abc.abstractmethod
    async def _submit(self, req: GenerateRequest, max_queued: int):
        """Open the reply channel, then queue the request unless ``max_queued`` requests of its
        model wait already (checked and queued atomically, across processes); returns a
        transport ticket, or None when the queue is full."""

    @abc.abstractmethod
    async def _withdraw(self, req: GenerateRequest, ticket) -> bool:
        """Take the request off the queue; False when a worker has taken it already."""

    @abc.abstractmethod
    async def _next_replies(self, req: GenerateRequest, ticket, timeout_s: float) -> list[Reply]:
        """Replies that arrived, waiting up to ``timeout_s`` for the first; [] on silence."""

    @abc.abstractmethod
    async def _serving_workers(self, model: str) -> list[WorkerInfo]:
        """Live workers of ``model`` that take new requests (not draining, engine healthy)."""

    @abc.abstractmethod
    async def _is_alive(self, model: str, worker_id: str) -> bool: ...

    @abc.abstractmethod
    async def _claimant(self, req: GenerateRequest, ticket) -> str | None:
        """The worker that took the request off the queue but whose claim has not arrived."""

    @abc.abstractmethod
    async def _close(self, req: GenerateRequest, ticket, finished: bool) -> None:
        """Release the reply channel; when unfinished, also withdraw the request if still queued."""


def _deadline(start: float, timeout_s: float | None) -> float:
    return float("inf") if timeout_s is None else start + timeout_s


def is_serving(info: WorkerInfo) -> bool:
    """Takes new requests: not draining, and its engine can run them."""
    return not info.draining and info.healthy


class WorkerTransport(Protocol):
    """The worker side of a transport, bound to one model and one worker id; the engine loop
    (workers/engine_worker.py) is its only caller, from the worker's own thread (and its
    heartbeat thread, for heartbeat()).

    Every method but close() raises TransportUnreachable while the transport is down; the
    worker keeps its state, retries with backoff and calls reconnect() before resuming.
    """

    worker_id: str

    def heartbeat(self, info: WorkerInfo) -> None: ...
    def unregister(self) -> None: ...
    def poll_aborts(self) -> list[str]: ...
    def arrived(self) -> bool:
        """Whether requests may wait to be taken, known without a round trip (called between the
        parts of a long step). False may only delay a request to the next exchange."""
    def exchange(self, replies: list[tuple[str, Reply]], max_count: int,
                 timeout_s: float) -> list[GenerateRequest]:
        """Send ``replies``, then take up to ``max_count`` new requests, waiting up to
        ``timeout_s`` for the first."""
    def requeue(self, requests: list[GenerateRequest]) -> None:
        """Put taken requests back at the head of the model's queue, for another worker."""
    def reconnect(self) -> None:
        """After an outage: restore what the transport lost (a restarted Redis forgets the
        consumer group and the abort subscription)."""
    def close(self) -> None: ...
