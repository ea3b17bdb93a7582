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
    with _lock:
        current = _current.get(model)
        if current is not None and current.is_running and current.worker.version == version:
            return
        previous = current.worker if current is not None and current.is_running else None
        transport = MemoryWorkerTransport(default_broker(), model, new_worker_id())
        # The old version keeps serving until the new one is ready, then drains.
        worker = EngineWorker(model, version, path, engine_settings, transport,
                              on_ready=previous.request_stop if previous else None)
        thread = threading.Thread(target=_run, args=(worker,), name=f"pagoda-engine-{model}",
                                  daemon=True)
        entry = _Embedded(worker, thread)
        _current[model] = entry
        _all.append(entry)
        thread.start()


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
