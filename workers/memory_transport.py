"""Embedded mode's transport: an in-process broker with Redis's semantics, minus the network.

A queue per model that several workers share, one reply channel per request, an abort
broadcast per model, heartbeats with the same TTL and each request's usage report. Worker threads call the worker side;
the client side runs on an asyncio loop. Replies cross threads via
``loop.call_soon_threadsafe`` into an ``asyncio.Queue`` owned by the client's loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import OrderedDict, defaultdict, deque
from dataclasses import dataclass, field

from workers.protocol import HEARTBEAT_TTL_S, USAGE_REPORT_TTL_S, GenerateRequest, Reply, UsageReport, WorkerInfo
from workers.transport import EngineClient, is_serving


@dataclass
class _Worker:
    info: WorkerInfo
    last_beat: float  # time.monotonic()
    aborts: deque[str] = field(default_factory=deque)


@dataclass
class _Sink:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


class MemoryBroker:
    def __init__(self, heartbeat_ttl_s: float = HEARTBEAT_TTL_S):
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._queues: dict[str, deque[GenerateRequest]] = defaultdict(deque)
        self._workers: dict[str, _Worker] = {}
        self._claims: dict[str, str] = {}  # request_id -> worker_id, until the client closes
        self._sinks: dict[str, _Sink] = {}  # reply_to -> the client's queue
        # request_id -> (its usage report, monotonic() it expires), the soonest to expire first.
        # They die with the process, as the embedded worker that wrote them does.
        self._reports: OrderedDict[str, tuple[UsageReport, float]] = OrderedDict()

    def _is_live(self, worker: _Worker) -> bool:
        return time.monotonic() - worker.last_beat < self.heartbeat_ttl_s

    # ----------------------------------------------------------------- client side
    def open_sink(self, reply_to: str, loop: asyncio.AbstractEventLoop) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            self._sinks[reply_to] = _Sink(loop, queue)
        return queue

    def submit(self, req: GenerateRequest, max_queued: int | None = None) -> bool:
        """Queue ``req``; False (not queued) when ``max_queued`` requests of its model wait."""
        with self._lock:
            queue = self._queues[req.model]
            if max_queued is not None and len(queue) >= max_queued:
                return False
            queue.append(req)
            self._arrived.notify_all()
            return True

    def requeue(self, model: str, requests: list[GenerateRequest]) -> None:
        """Put requests a worker took back at the head of the queue, in their order."""
        with self._lock:
            queue = self._queues[model]
            for req in reversed(requests):
                self._claims.pop(req.request_id, None)
                queue.appendleft(req)
            self._arrived.notify_all()

    def withdraw(self, req: GenerateRequest) -> bool:
        """Take ``req`` off its queue; False when a worker has taken it already."""
        with self._lock:
            return self._withdraw(req.model, req.request_id)

    def close_request(self, req: GenerateRequest) -> None:
        with self._lock:
            self._sinks.pop(req.reply_to, None)
            self._claims.pop(req.request_id, None)
            self._withdraw(req.model, req.request_id)

    def _withdraw(self, model: str, request_id: str) -> bool:
        queue = self._queues.get(model)
        found = [r for r in queue if r.request_id == request_id] if queue else []
        for req in found:
            queue.remove(req)
        return bool(found)

    def claimant(self, request_id: str) -> str | None:
        with self._lock:
            return self._claims.get(request_id)

    def live_workers(self, model: str | None = None) -> list[WorkerInfo]:
        with self._lock:
            return [w.info for w in self._workers.values()
                    if self._is_live(w) and model in (None, w.info.model)]

    def is_alive(self, worker_id: str) -> bool:
        with self._lock:
            worker = self._workers.get(worker_id)
            return worker is not None and self._is_live(worker)

    def usage_reports(self, request_ids: list[str]) -> dict[str, UsageReport]:
        with self._lock:
            self._expire_reports(time.monotonic())
            return {r: self._reports[r][0] for r in request_ids if r in self._reports}

    def _expire_reports(self, now: float) -> None:
        while self._reports and next(iter(self._reports.values()))[1] <= now:
            self._reports.popitem(last=False)

    def abort(self, model: str, request_id: str) -> None:
        with self._lock:
            self._withdraw(model, request_id)
            for worker in self._workers.values():
                if worker.info.model == model:
                    worker.aborts.append(request_id)

    # ----------------------------------------------------------------- worker side
    def heartbeat(self, info: WorkerInfo) -> None:
        with self._lock:
            worker = self._workers.get(info.worker_id)
            if worker is None:
                self._workers[info.worker_id] = _Worker(info, time.monotonic())
            else:
                worker.info, worker.last_beat = info, time.monotonic()

    def unregister(self, worker_id: str) -> None:
        with self._lock:
            self._workers.pop(worker_id, None)

    def take(self, model: str, worker_id: str, max_count: int, timeout_s: float
             ) -> list[GenerateRequest]:
        """Up to ``max_count`` queued requests, waiting up to ``timeout_s`` for the first."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            queue = self._queues[model]
            while not queue:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._arrived.wait(left)
            taken = [queue.popleft() for _ in range(min(max_count, len(queue)))]
            for req in taken:
                self._claims[req.request_id] = worker_id
            return taken

    def has_queued(self, model: str) -> bool:
        """Whether requests of ``model`` wait to be taken (a deque's length: no lock needed)."""
        return bool(self._queues.get(model))

    def poll_aborts(self, worker_id: str) -> list[str]:
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                return []
            aborted = list(worker.aborts)
            worker.aborts.clear()
            return aborted

    def report(self, worker_id: str, model: str, replies: list[tuple[str, Reply]]) -> None:
        """Update the usage report of every request a chunk among ``replies`` belongs to."""
        now, wall = time.monotonic(), time.time()
        with self._lock:
            self._expire_reports(now)
            for _reply_to, reply in replies:
                chunk = reply.chunk
                if chunk is None or not chunk.request_id:
                    continue
                held = self._reports.pop(chunk.request_id, None)
                report = held[0] if held else UsageReport(chunk.request_id, worker_id, model)
                report = dataclasses.replace(report, worker_id=worker_id, **UsageReport.fields_of(chunk, wall))
                self._reports[chunk.request_id] = (report, now + USAGE_REPORT_TTL_S)

    def deliver(self, batches: dict[str, list[Reply]]) -> None:
        """Each address's replies onto its client's queue, one wake-up of each client loop for
        them all: a call_soon_threadsafe writes to the loop's self-pipe, and a step at 32 streams
        has 32 addresses. py-spy found 1.6% of the engine thread's samples in those writes; an
        exchange of 32 replies took 110-129 us of the thread's CPU, one call a loop 24-25 us."""
        with self._lock:
            sinks = [(self._sinks.get(reply_to), replies) for reply_to, replies in batches.items()]
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, list[Reply]]]] = {}
        for sink, replies in sinks:
            if sink is not None:  # else the client has gone; like an expiring Redis reply stream
                by_loop.setdefault(sink.loop, []).append((sink.queue, replies))
        for loop, puts in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, puts)
            except RuntimeError:  # the client's loop is closed
                with self._lock:
                    for reply_to in [a for a, sink in self._sinks.items() if sink.loop is loop]:
                        del self._sinks[reply_to]


def _put_all(puts: list[tuple[asyncio.Queue, list[Reply]]]) -> None:
    for queue, replies in puts:
        queue.put_nowait(replies)


_default_broker = MemoryBroker()


def default_broker() -> MemoryBroker:
    """The broker shared by this process's embedded workers and its engine client."""
    return _default_broker


class MemoryEngineClient(EngineClient):
    def __init__(self, broker: MemoryBroker):
        self.broker = broker

    async def abort(self, model: str, request_id: str) -> None:
        self.broker.abort(model, request_id)

    def abort_now(self, model: str, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.broker.abort(model, request_id)

    def usage_reports(self, request_ids: list[str]) -> dict[str, UsageReport]:
        return self.broker.usage_reports(request_ids)

    def live_workers(self, model: str | None = None) -> list[WorkerInfo]:
        return sorted(self.broker.live_workers(model), key=lambda w: (w.model, w.started_at))

    def _reply_address(self, request_id: str) -> str:
        return f"memory:{request_id}"

    async def _submit(self, req: GenerateRequest, max_queued: int) -> asyncio.Queue | None:
        queue = self.broker.open_sink(req.reply_to, asyncio.get_running_loop())
        if not self.broker.submit(req, max_queued):
            self.broker.close_request(req)
            return None
        return queue

    async def _withdraw(self, req: GenerateRequest, ticket) -> bool:
        return self.broker.withdraw(req)

    async def _next_replies(self, req: GenerateRequest, ticket: asyncio.Queue,
                            timeout_s: float) -> list[Reply]:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result of a get that
        # completed in the same loop turn as a cancellation and loses the cancel, so a Stop or a
        # drain arriving with a token would leave the generation running to its end.
        try:
            async with asyncio.timeout(timeout_s):
                replies = list(await ticket.get())
        except TimeoutError:
            return []
        while not ticket.empty():
            replies.extend(ticket.get_nowait())
        return replies

    async def _serving_workers(self, model: str) -> list[WorkerInfo]:
        return [w for w in self.broker.live_workers(model) if is_serving(w)]

    async def _is_alive(self, model: str, worker_id: str) -> bool:
        return self.broker.is_alive(worker_id)

    async def _claimant(self, req: GenerateRequest, ticket) -> str | None:
        return self.broker.claimant(req.request_id)

    async def _close(self, req: GenerateRequest, ticket, finished: bool) -> None:
        self.broker.close_request(req)


class MemoryWorkerTransport:
    """The worker side, bound to one model and one worker id (see transport.WorkerTransport)."""

    def __init__(self, broker: MemoryBroker, model: str, worker_id: str):
        self.broker = broker
        self.model = model
        self.worker_id = worker_id

    def heartbeat(self, info: WorkerInfo) -> None:
        self.broker.heartbeat(info)

    def unregister(self) -> None:
        self.broker.unregister(self.worker_id)

    def poll_aborts(self) -> list[str]:
        return self.broker.poll_aborts(self.worker_id)

    def arrived(self) -> bool:
        return self.broker.has_queued(self.model)

    def exchange(self, replies: list[tuple[str, Reply]], max_count: int,
                 timeout_s: float) -> list[GenerateRequest]:
        """Deliver ``replies``, then take up to ``max_count`` requests (waiting up to timeout_s)."""
        self.broker.report(self.worker_id, self.model, replies)
        by_address: dict[str, list[Reply]] = {}
        for reply_to, reply in replies:
            by_address.setdefault(reply_to, []).append(reply)
        self.broker.deliver(by_address)
        if max_count <= 0:
            return []
        return self.broker.take(self.model, self.worker_id, max_count, timeout_s)

    def requeue(self, requests: list[GenerateRequest]) -> None:
        self.broker.requeue(self.model, requests)

    def reconnect(self) -> None:
        pass  # nothing to lose in-process

    def close(self) -> None:
        pass
