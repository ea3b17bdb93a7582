"""Embedded mode: engine workers as daemon threads of the web process, over the in-memory broker.

Imported lazily by workers.transport, because it loads the engine (torch).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from workers.engine_loop import EngineWorker, new_worker_id
from workers.memory_transport import MemoryWorkerTransport, default_broker

logger = logging.getLogger(__name__)


@dataclass
class _Embedded:
    worker: EngineWorker
    thread: threading.Thread
    spec: tuple  # (version, path, engine settings): what start() was asked to serve

    @property
    def is_running(self) -> bool:
        return self.thread.is_alive() and not self.worker.is_stopping


_lock = threading.Lock()
_current: dict[str, _Embedded] = {}  # model -> the worker that serves it
_all: list[_Embedded] = []  # every worker started, replaced ones included, until stop_all


def _run(worker: EngineWorker) -> None:
    try:
        worker.run()
    except Exception:
        logger.exception("embedded worker %s for %s crashed", worker.worker_id, worker.model)


def start(model: str, version: str, path: str, engine_settings: dict) -> None:
    """Serve ``model`` from (version, path, settings); a no-op when that is already being served.

    A different version, path or settings loads a new worker while the old one keeps serving;
    once the new one is ready, every other worker of the model drains (see _retire_others).
    """
    spec = (version, path, dict(engine_settings))
    with _lock:
        _all[:] = [e for e in _all if e.thread.is_alive()]
        current = _current.get(model)
        if current is not None and current.is_running and current.spec == spec:
            return
        transport = MemoryWorkerTransport(default_broker(), model, new_worker_id())
        worker = EngineWorker(model, version, path, engine_settings, transport)
        worker.on_ready = lambda: _retire_others(model, worker)
        thread = threading.Thread(target=_run, args=(worker,), name=f"pagoda-engine-{model}",
                                  daemon=True)
        entry = _Embedded(worker, thread, spec)
        _current[model] = entry
        _all.append(entry)
        thread.start()


def _retire_others(model: str, keep: EngineWorker) -> None:
    """The new worker is ready: every worker of ``model`` started before it drains.

    All of them, not only the one serving when ``keep`` was started: a version activated while
    another was still loading replaces both (the loading one stops as soon as it has loaded).
    Never a later one: it is the newer version, still loading.
    """
    with _lock:
        workers = [e.worker for e in _all]
    if keep not in workers:
        return  # stop_all() has forgotten it: it is being stopped too
    for worker in workers[:workers.index(keep)]:
        if worker.model == model:
            worker.request_stop()


def stop(model: str, drain_timeout: float | None = None) -> bool:
    """Every worker of ``model`` drains (a loading one stops once loaded); returns at once.

    True when there was one to stop. Running requests finish within the drain timeout.
    """
    with _lock:
        _current.pop(model, None)
        entries = [e for e in _all if e.worker.model == model and e.thread.is_alive()]
    for entry in entries:
        if drain_timeout is not None:
            entry.worker.drain_timeout = drain_timeout
        entry.worker.request_stop()
    return bool(entries)


def wait_ready(model: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    with _lock:
        entry = _current.get(model)
    if entry is None:
        return False
    while not entry.worker.ready.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
        if not entry.thread.is_alive() or time.monotonic() >= deadline:
            return False
    return True


def stop_all(drain_timeout: float) -> None:
    with _lock:
        entries = list(_all)
        _all.clear()
        _current.clear()
    for entry in entries:
        entry.worker.drain_timeout = drain_timeout
        entry.worker.request_stop()
    deadline = time.monotonic() + drain_timeout + 5.0
    for entry in entries:
        entry.thread.join(max(0.0, deadline - time.monotonic()))
