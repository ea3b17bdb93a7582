"""SIGTERM/SIGINT to the web process (Daphne) drains it instead of dropping requests on the floor.

Daphne stops by stopping its Twisted reactor, which first fires the "before shutdown" triggers
and waits for the Deferreds they return; the event loop keeps running meanwhile, and so do the
requests. Daphne's own trigger cancels every application instance; Django (5.2) answers that by
cancelling only its outer task and leaving the view running, so without this the process would
exit under requests still streaming and their usage records would never be written.

Our trigger, registered when the ASGI application is imported (before Daphne registers its own):

1. the API refuses new requests (503 server_shutting_down);
2. embedded mode: the workers in this process drain as a worker process does on SIGTERM, so
   running requests finish within PAGODA_DRAIN_TIMEOUT and the rest end with worker_lost;
3. the requests still running after the drain timeout are cancelled and recorded as aborted
   (webapp.openai_api.generation.generations_drain), so that every accepted request has its
   usage record before the process exits;
4. the same for other work registered with ``track`` (the chat page's generations): new turns
   are refused while ``shutting_down()``, running ones get the drain timeout, then are
   cancelled, which records them as aborted.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from django.conf import settings

logger = logging.getLogger(__name__)

# Embedded workers answer every request within the drain timeout; this covers the last replies.
WORKER_GRACE_S = 5.0
_registered = False
_shutting_down = False
_tracked: set[asyncio.Task] = set()


def shutting_down() -> bool:
    return _shutting_down


def track(task: asyncio.Task) -> asyncio.Task:
    """Have the server wait for ``task`` when it shuts down (cancelling it after the drain timeout)."""
    _tracked.add(task)
    task.add_done_callback(_tracked.discard)
    return task


async def _drain_tracked(timeout_s: float) -> int:
    """Wait up to ``timeout_s`` for the tracked tasks, then cancel the rest and let them record
    themselves (CANCEL_GRACE_S); returns how many were cancelled."""
    if _tracked:
        await asyncio.wait(set(_tracked), timeout=timeout_s)
    cut = [task for task in _tracked if not task.done()]
    for task in cut:
        task.cancel()
    if cut:
        await asyncio.wait(cut, timeout=WORKER_GRACE_S)
    return len(cut)


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
    from webapp.openai_api.generation import generations_drain

    global _shutting_down
    _shutting_down = True
    logger.info("shutting down: draining requests (up to %.1f s)", timeout_s)
    workers = None
    if "workers.embedded" in sys.modules:  # embedded mode; never import the engine just to stop
        from workers.embedded import stop_embedded_workers

        workers = asyncio.get_running_loop().run_in_executor(None, stop_embedded_workers, timeout_s)
    try:
        grace = timeout_s + (WORKER_GRACE_S if workers is not None else 0.0)
        cut, cut_tracked = await asyncio.gather(generations_drain(grace), _drain_tracked(grace))
        cut += cut_tracked
        if workers is not None:
            await workers
    except Exception:  # the server is stopping either way
        logger.exception("draining at shutdown failed")
        return
    logger.info("shutting down: drained (%d requests aborted)", cut)
