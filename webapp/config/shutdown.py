"""SIGTERM/SIGINT to the web process (Daphne) drains it instead of dropping requests on the floor.

Daphne stops by stopping its Twisted reactor, which first fires the "before shutdown" triggers
and waits for the Deferreds they return; the event loop keeps running meanwhile, and so do the
requests. Daphne's own trigger cancels every application instance; Django (5.2) answers that by
cancelling only its outer task and leaving the view running, so without this the process would
exit under requests still streaming and their usage records would never be written.

Our trigger, registered when the ASGI application is imported (before Daphne registers its own):

1. ``shutting_down()``: the API refuses new requests (503 server_shutting_down), the chat new turns;
2. embedded mode: the workers in this process drain as a worker process does on SIGTERM, so
   running requests finish within PAGODA_DRAIN_TIMEOUT and the rest end with worker_lost;
3. the generations still running after the drain timeout (API requests and chat turns alike,
   all listed here with ``track``) are cancelled, which records them as aborted; one that does
   not record itself within CANCEL_GRACE_S is ended from here by its ``cut``, so that every
   accepted request has its usage record before the process exits;
4. the drain returns (and Daphne's trigger may cancel the application instances) only once every
   HTTP exchange has handed its response's last message to Daphne (``count_http_exchanges``)
   and the reactor has written them to their sockets (``_writes_flushed``): the reactor's
   shutdown then drops every connection at once, and with it what was still buffered.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from django.conf import settings

logger = logging.getLogger(__name__)

# Embedded workers answer every request within the drain timeout; this covers the last replies.
WORKER_GRACE_S = 5.0
CANCEL_GRACE_S = 5.0  # after cancelling a generation's task, how long it gets to record its usage
# A generation leaves the list once its usage is recorded, a moment before its view's response
# (a 503 worker_lost, say) has been handed to Daphne, whose own trigger, next, cancels every
# application instance (a loaded machine dropped such a response: a connection error in a CI
# run). So the drain ends only once no HTTP exchange is still inside the application
# (``count_http_exchanges``), for at most this long.
FLUSH_LIMIT_S = 5.0
_registered = False
_shutting_down = False
_http_exchanges = 0  # HTTP requests whose application call has not returned (response not all sent)


@dataclass
class Running:
    """A generation whose usage is not recorded yet, and the task now running it."""

    task: asyncio.Task | None
    cut: Callable[[], Awaitable[None]] | None = None  # aborts and records it when cancelling did not
    finishing: bool = False  # its usage record is being written: not cancelled, not cut


_running: dict[str, Running] = {}  # request id -> entry; only touched on the event loop


def shutting_down() -> bool:
    return _shutting_down


def track(request_id: str, task: asyncio.Task | None, *, cut: Callable[[], Awaitable[None]] | None = None,
          until_done: bool = False) -> Running:
    """List a generation for the drain until ``untrack`` (or, ``until_done``, until ``task`` ends)."""
    entry = _running[request_id] = Running(task, cut)
    if until_done and task is not None:
        task.add_done_callback(lambda _: untrack(request_id, entry))
    return entry


def tracked(request_id: str) -> Running | None:
    return _running.get(request_id)


def untrack(request_id: str, entry: Running | None = None) -> None:
    if entry is None or _running.get(request_id) is entry:
        _running.pop(request_id, None)


def count_http_exchanges(app):
    """The ASGI HTTP application, counted in ``_http_exchanges`` while each call runs: Django's
    handler returns once it has passed the response's last message to the server's ``send``."""

    async def counted(scope, receive, send):
        global _http_exchanges
        _http_exchanges += 1
        try:
            return await app(scope, receive, send)
        finally:
            _http_exchanges -= 1

    return counted


async def _wait_until(done: Callable[[], bool], timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not done() and loop.time() < deadline:
        await asyncio.sleep(0.05)


async def _wait_until_none_running(timeout_s: float) -> None:
    await _wait_until(lambda: not _running, timeout_s)


async def drain_running(timeout_s: float) -> int:
    """Give the running generations ``timeout_s`` to end, then cancel the rest: cancelling makes
    one record its own usage as a client going away does; one that does not within CANCEL_GRACE_S
    (a stream cancelled between two events leaves its iterator suspended) is ended by its ``cut``.
    Returns how many were cut."""
    await _wait_until_none_running(timeout_s)
    cut = list(_running.values())
    if cut:
        logger.warning("shutting down: aborting %d requests still running after %.1f s", len(cut), timeout_s)
    for entry in cut:
        if entry.task is not None and not entry.task.done() and not entry.finishing:
            entry.task.cancel()
    await _wait_until_none_running(CANCEL_GRACE_S)
    for entry in [e for e in _running.values() if not e.finishing and e.cut is not None]:
        await entry.cut()
    return len(cut)


def _writes_flushed() -> bool:
    """Whether the reactor has no connection with bytes still to write. Twisted buffers a
    transport's writes and sends them when the socket is writable; its shutdown then calls every
    connection's connectionLost at once (``disconnectAll``), dropping that buffer: a response
    handed to Daphne a moment before arrived as a connection error (seen in a CI run)."""
    reactor = sys.modules.get("twisted.internet.reactor")
    return reactor is None or not reactor.getWriters()


def drain_on_server_shutdown() -> bool:
    """Register the drain with the running server's reactor; False when not served by Daphne."""
    global _registered
    reactor = sys.modules.get("twisted.internet.reactor")  # installed by daphne.server, never imported here
    if reactor is None or _registered:
        return False
    reactor.addSystemEventTrigger("before", "shutdown", _drain_deferred)
    _registered = True
    return True


def _drain_deferred():
    from twisted.internet.defer import Deferred

    return Deferred.fromFuture(asyncio.ensure_future(drain(settings.PAGODA_DRAIN_TIMEOUT)))


async def drain(timeout_s: float) -> None:
    global _shutting_down
    _shutting_down = True
    logger.info("shutting down: draining requests (up to %.1f s)", timeout_s)
    workers = None
    if "workers.embedded" in sys.modules:  # embedded mode; never import the engine just to stop
        from workers.embedded import stop_embedded_workers

        workers = asyncio.get_running_loop().run_in_executor(None, stop_embedded_workers, timeout_s)
    try:
        grace = timeout_s + (WORKER_GRACE_S if workers is not None else 0.0)
        cut = await drain_running(grace)
        if workers is not None:
            await workers
        await _wait_until(lambda: _http_exchanges == 0, FLUSH_LIMIT_S)  # the last responses' sends
        await _wait_until(_writes_flushed, FLUSH_LIMIT_S)  # ... and their bytes on the sockets
    except Exception:  # the server is stopping either way
        logger.exception("draining at shutdown failed")
        return
    logger.info("shutting down: drained (%d requests aborted)", cut)
