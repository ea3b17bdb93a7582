"""The two sides of a transport: ``EngineClient`` (the web process) and ``WorkerTransport`` (a worker).

One client logic for every transport; each implementation supplies the few primitives below
(submit, read replies, heartbeats, abort) and a worker side that the engine loop drives.
Implementations live beside this file: redis_transport.py (Redis streams, distributed mode) and
memory_transport.py (an in-process broker, embedded mode); workers/connect.py picks one from the
configuration its caller passes in. This module imports neither of them, nor the engine.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from workers.protocol import (INTERNAL_ERROR, NO_WORKER, WATCH_INTERVAL_S, WORKER_LOST, Chunk,
                              ErrorInfo, GenerateRequest, Reply, WorkerInfo)

logger = logging.getLogger(__name__)

# Unclaimed request and no worker taking requests: how many liveness checks in a row (one per
# WATCH_INTERVAL_S) before giving up. Two, so that a claim already on its way is not mistaken
# for "nobody took it" when the only worker starts draining right after claiming.
_NO_WORKER_STRIKES = 2


class TransportUnreachable(Exception):
    """A worker could not connect to its transport (Redis down, wrong URL)."""


def _unreachable(exc: Exception) -> ErrorInfo:
    return ErrorInfo(INTERNAL_ERROR, f"the request queue is unreachable: {exc}")


class EngineClient(abc.ABC):
    """Async client of the engine workers; safe to share between tasks of an event loop."""

    # Exceptions of the transport itself (Redis unreachable...): they become internal_error chunks.
    transport_errors: tuple[type[Exception], ...] = ()

    async def generate(self, req: GenerateRequest) -> AsyncIterator[Chunk]:
        """Yield the request's chunks; the last has ``finished=True`` (and ``error`` on failure).

        Closing the iterator early (aclose(), cancellation) aborts the request in the engine.
        """
        if not req.reply_to:
            req = dataclasses.replace(req, reply_to=self._reply_address(req.request_id))
        try:
            serving = await self._serving_worker_ids(req.model)
        except self.transport_errors as exc:
            yield Chunk.failure(req.request_id, _unreachable(exc))
            return
        if not serving:
            yield Chunk.failure(req.request_id, ErrorInfo(
                NO_WORKER, f"no live worker serves the model {req.model!r}", "model"))
            return
        ticket = None
        done = False  # a worker sent the last chunk: nothing to withdraw or abort
        try:
            ticket = await self._submit(req)
            worker_id: str | None = None
            strikes = 0
            while True:
                replies = await self._next_replies(req, ticket, WATCH_INTERVAL_S)
                if not replies:
                    error, strikes = await self._check_liveness(req, ticket, worker_id, strikes)
                    if error is not None:
                        yield Chunk.failure(req.request_id, error)
                        return
                    continue
                strikes = 0
                for reply in replies:
                    if reply.kind == "claimed":
                        worker_id = reply.worker_id
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
        if await self._serving_worker_ids(req.model):
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

    # ----------------------------------------------------------------- transport primitives
    @abc.abstractmethod
    def _reply_address(self, request_id: str) -> str: ...

    @abc.abstractmethod
    async def _submit(self, req: GenerateRequest):
        """Open the reply channel, then queue the request; returns a transport ticket."""

    @abc.abstractmethod
    async def _next_replies(self, req: GenerateRequest, ticket, timeout_s: float) -> list[Reply]:
        """Replies that arrived, waiting up to ``timeout_s`` for the first; [] on silence."""

    @abc.abstractmethod
    async def _serving_worker_ids(self, model: str) -> set[str]:
        """Live workers of ``model`` that take new requests (not draining)."""

    @abc.abstractmethod
    async def _is_alive(self, model: str, worker_id: str) -> bool: ...

    @abc.abstractmethod
    async def _claimant(self, req: GenerateRequest, ticket) -> str | None:
        """The worker that took the request off the queue but whose claim has not arrived."""

    @abc.abstractmethod
    async def _close(self, req: GenerateRequest, ticket, finished: bool) -> None:
        """Release the reply channel; when unfinished, also withdraw the request if still queued."""


class WorkerTransport(Protocol):
    """The worker side of a transport, bound to one model and one worker id; the engine loop
    (workers/engine_worker.py) is its only caller, from the worker's own thread."""

    worker_id: str

    def heartbeat(self, info: WorkerInfo) -> None: ...
    def unregister(self) -> None: ...
    def poll_aborts(self) -> list[str]: ...
    def exchange(self, replies: list[tuple[str, Reply]], max_count: int,
                 timeout_s: float) -> list[GenerateRequest]:
        """Send ``replies``, then take up to ``max_count`` new requests, waiting up to
        ``timeout_s`` for the first."""
    def close(self) -> None: ...
