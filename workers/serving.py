"""``ModelServer``: the workers serving one model in this process, over their lifetime.

``serve(spec)`` loads a worker for a version next to the one serving; once the new one is ready
(announced, taking requests) every worker started before it drains: it finishes its running
requests, then stops. ``stop()`` drains them all; ``wait_ready()`` and ``join()`` wait.
Embedded mode keeps one per model (workers/embedded.py, in-process transport); a worker process
runs one, for a fixed version (``python -m workers``) or following the registry's active
version (``follow_active_version``, called by ``manage.py run_engine_worker``), over Redis.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.errors import InvalidParameterError
from workers.config_file import PagodaConfig, load_config
from workers.connect import worker_transport
from workers.embedding_worker import worker_class
from workers.engine_worker import EngineWorker
from workers.transport import TransportUnreachable

# In embedded mode an engine worker is a thread of the web process, and so are the OpenMP threads
# of its native kernels, which it starts and which inherit its nice value. At a lower priority
# the engine takes what the web thread (HTTP, streaming, the database) leaves of the CPU, instead
# of the web thread waiting for a time slice behind two busy kernel threads. Another user's time to
# first token under a flood of 200 streams, p50 of 3 alternated runs each: 93-97 ms at 0, 63-74 ms at
# 5, the flood's tokens/s the same (bench/fair_share.py, docs/performance.md). On by default (5) since
# 2026-12-07. The engine then also yields to every other process of the host: on a shared one set 0
# (the test suite does: its second worker beside a server doubled a tiny model's flooded TTFT).
DEFAULT_EMBEDDED_ENGINE_NICE = 5


def embedded_engine_nice() -> int:
    """PAGODA_EMBEDDED_ENGINE_NICE (default 5; 0: off), 0 to 19; ValueError names a bad one."""
    raw = os.environ.get("PAGODA_EMBEDDED_ENGINE_NICE", str(DEFAULT_EMBEDDED_ENGINE_NICE)).strip()
    if not raw.isdigit() or int(raw) > 19:
        raise ValueError(f"PAGODA_EMBEDDED_ENGINE_NICE must be a whole number from 0 to 19, not {raw!r}")
    return int(raw)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeSpec:
    """What a model's worker should serve: compared whole, so new settings also mean a swap."""

    version: str
    path: str
    engine_settings: dict = field(default_factory=dict)


@dataclass
class _Running:
    spec: ServeSpec
    worker: EngineWorker
    thread: threading.Thread = field(default_factory=threading.Thread)  # set by serve()
    result: int | None = None  # EngineWorker.run()'s exit code once it returned; 1 if it raised


class ModelServer:
    """Serves one model with whatever ``serve()`` was last given, handing over between versions.

    ``redis_url`` picks the transport (workers/connect.py): None is the in-process broker.
    Every method may be called from any thread.
    """

    def __init__(self, model: str, *, redis_url: str | None, drain_timeout: float | None = None):
        # None: the deployment's serving.drain_timeout_s (pagoda.yaml / PAGODA_DRAIN_TIMEOUT),
        # read at the first serve(); an activation's hand-over drains by it as a shutdown does.
        self.model, self.redis_url, self.drain_timeout = model, redis_url, drain_timeout
        self.nice = embedded_engine_nice() if redis_url is None else 0  # its worker threads' nice value
        self._lock = threading.Lock()
        self._workers: list[_Running] = []  # in start order; ended ones pruned by serve()
        self._current: _Running | None = None  # the newest, what serve() was last given
        # A spec that failed (bad settings, or its worker could not load) is not retried until
        # serve() is given another spec or stop() is called; both modes behave the same. The
        # follower calls serve() every poll interval, and a retry would reload a checkpoint that
        # fails the same way each time (missing files, too big for memory, settings the engine
        # refuses) every two seconds, for as long as the version stays active, while the old
        # version keeps serving. What fixes it is a new version or new settings (a new spec),
        # or deactivating and activating again (stop(), then serve()) to retry on purpose.
        # An unreachable transport is not remembered: it is transient, and cheap to retry.
        self._failed: ServeSpec | None = None
        self._config: PagodaConfig | None = None  # pagoda.yaml + environment, read at first serve()

    # ----------------------------------------------------------------- control
    def serve(self, spec: ServeSpec) -> bool:
        """Serve ``spec``; returns at once, before the model is loaded (see ``wait_ready``).

        False, a no-op, when it is already being served (or loading) or failed before. A new
        spec loads while the old workers keep serving; they drain once it is ready. Bad engine
        settings raise InvalidParameterError, an unreachable Redis TransportUnreachable.
        """
        with self._lock:
            self._note_failure()
            self._workers = [r for r in self._workers if r.thread.is_alive()]
            if spec == self._failed or (self._current is not None and self._current.spec == spec
                                        and not self._current.worker.is_stopping):
                return False
            self._failed = None
            try:  # the version's settings over pagoda.yaml's, under the environment's
                self._config = self._config or load_config()
                if self.drain_timeout is None:
                    self.drain_timeout = float(self._config.serving["drain_timeout_s"])
                settings = self._config.engine_settings(spec.engine_settings)
                check_fits(EngineConfig.from_settings(spec.path, settings), settings)  # before connecting
            except InvalidParameterError:
                self._failed = spec
                raise
            logger.info("%s version %s: engine settings %s", self.model, spec.version,
                        self._config.describe(spec.engine_settings))
            worker = worker_class(spec.path)(self.model, spec.version, spec.path, settings,
                                             worker_transport(self.redis_url, self.model),
                                             drain_timeout=self.drain_timeout)
            entry = _Running(spec, worker)
            entry.thread = threading.Thread(target=self._run, args=(entry,), daemon=True,
                                            name=f"pagoda-engine-{self.model}-{spec.version}")
            worker.on_ready = lambda: self._retire_older(worker)
            self._current = entry
            self._workers.append(entry)
            logger.info("%s: loading version %s from %s", self.model, spec.version, spec.path)
            entry.thread.start()
        return True

    def stop(self, drain_timeout: float | None = None, immediate: bool = False) -> bool:
        """Every worker drains (a loading one stops once loaded); returns at once.

        True when one was still serving (or loading) rather than draining already. Running
        requests finish within ``drain_timeout`` (default: this server's); ``immediate`` cuts
        them now. Forgets a failed spec.
        """
        with self._lock:
            self._current, self._failed = None, None
            running = [r for r in self._workers if r.thread.is_alive()]
        was_serving = any(not entry.worker.is_stopping for entry in running)
        for entry in running:
            if drain_timeout is not None:
                entry.worker.drain_timeout = drain_timeout
            entry.worker.request_stop(immediate=immediate)
        return was_serving

    # ----------------------------------------------------------------- waiting
    def wait_ready(self, timeout: float) -> bool:
        """Block until the worker of the last ``serve()`` is announced; False on timeout, on a
        failed load, or when there is none."""
        deadline = time.monotonic() + timeout
        with self._lock:
            entry = self._current
        if entry is None:
            return False
        while not entry.worker.ready.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
            if not entry.thread.is_alive() or time.monotonic() >= deadline:
                return False
        return True

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every worker thread to end; True when none is left."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for entry in list(self._workers):
            entry.thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not self.is_alive

    @property
    def is_alive(self) -> bool:
        return any(entry.thread.is_alive() for entry in list(self._workers))

    @property
    def failed(self) -> ServeSpec | None:
        """The spec whose worker could not start or load, until another is served."""
        with self._lock:
            self._note_failure()
            return self._failed

    # ----------------------------------------------------------------- worker threads
    def _note_failure(self) -> None:
        current = self._current
        if current is not None and current.result == 1:
            logger.error("worker %s could not load %s version %s; the previous one (if any) keeps "
                         "serving", current.worker.worker_id, self.model, current.spec.version)
            self._failed, self._current = current.spec, None

    def _run(self, entry: _Running) -> None:
        worker = entry.worker
        if self.nice:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
        try:
            entry.result = worker.run()
        except Exception:
            logger.exception("worker %s for %s crashed", worker.worker_id, self.model)
            entry.result = 1

    def _retire_older(self, keep: EngineWorker) -> None:
        """``keep`` is ready: every worker started before it drains.

        All of them, not only the one serving when ``keep`` was started: a version activated
        while another was still loading replaces both (the loading one stops as soon as it has
        loaded). Never a later one: it is the newer version, still loading.
        """
        with self._lock:
            workers = [r.worker for r in self._workers]
        if keep not in workers:
            return
        for worker in workers[:workers.index(keep)]:
            logger.info("%s: version %s ready; worker %s (version %s) drains", self.model,
                        keep.version, worker.worker_id, worker.version)
            worker.request_stop()


def exit_now(code: int) -> None:
    """End a worker process that has stopped serving without the interpreter's teardown:
    collecting the engine's objects (torch, Triton, the model) took 2-3 s after the worker had
    stopped (0.2 s from SIGTERM to exit without it, tiny model), time a supervisor waiting to
    restart or replace the process (honcho gives 5 s) ends with SIGKILL on a loaded machine."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def check_fits(config: EngineConfig, settings: dict) -> None:
    """InvalidParameterError with the figures when, on the CPU, the model's weights and KV pool
    at full use (engine/memory/estimate.py) exceed the machine's memory: refused before loading. A
    checkpoint the estimate cannot read is left to the load, which says what is wrong with it."""
    import torch

    from engine.kernels.cpu import cpu_info
    from engine.memory.estimate import MiB, estimate_memory

    if config.device != "cpu" and (config.device != "auto" or torch.cuda.is_available()):
        return  # on CUDA the engine measures what fits (engine/memory/gpu_memory.py)
    try:
        estimate = estimate_memory(config.model, settings, device="cpu")
    except InvalidParameterError:
        raise
    except Exception:  # ModelLoadError, or a header this reader does not know: the load will tell
        return
    total = cpu_info.total_memory_bytes()
    if total and estimate.resident_bytes > total:
        raise InvalidParameterError("engine_settings", (
            f"the model needs {estimate.resident_bytes / MiB:.0f} MiB with these settings, more than "
            f"this machine's {total / MiB:.0f} MiB: {estimate.describe()}"))


@contextlib.contextmanager
def stop_on_signals(server: ModelServer, wake: threading.Event | None = None):
    """SIGTERM/SIGINT: ``server`` drains; a second one: it stops now. Sets ``wake`` either way.

    Only the main thread can install handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signalled: list[int] = []

    def handle(signum, frame):
        logger.info("%s: %s", server.model, signal.Signals(signum).name)
        server.stop(immediate=bool(signalled))
        signalled.append(signum)
        if wake is not None:
            wake.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def follow_active_version(model: str, active: Callable[[], ServeSpec | None], *,
                          redis_url: str, drain_timeout: float | None = None,
                          poll_interval: float = 2.0, stop: threading.Event | None = None) -> int:
    """Serve ``model``'s active version over Redis, following activations, until SIGTERM.

    ``active()`` returns what should be served now (None: nothing); it is called every
    ``poll_interval`` seconds from the calling thread, so a caller may read a database there.
    When the answer changes, the new version loads in this process while the old one keeps
    serving; then the old one finishes its running requests and stops. With no active version
    the workers drain and the process waits (rather than exit, which a process supervisor would
    answer with a restart loop of a command that has nothing to serve). SIGTERM/SIGINT (in the
    main thread) or setting ``stop`` drains and returns 0; a second signal stops at once.
    """
    server = ModelServer(model, redis_url=redis_url, drain_timeout=drain_timeout)
    wake = stop if stop is not None else threading.Event()
    with stop_on_signals(server, wake):
        while not wake.is_set():
            _follow(server, active)
            wake.wait(poll_interval)
        server.stop()  # after a signal: already draining, so no new request is taken meanwhile
        while server.is_alive:  # not join(): signal handlers run only between these waits
            time.sleep(0.1)
    return 0


def _follow(server: ModelServer, active: Callable[[], ServeSpec | None]) -> None:
    try:
        spec = active()
    except Exception:  # the registry's database away for a moment: keep serving
        logger.exception("could not read the active version of %s", server.model)
        return
    if spec is None:
        if server.stop():
            logger.info("%s has no active version any more: draining, then waiting", server.model)
        return
    try:
        server.serve(spec)
    except (InvalidParameterError, TransportUnreachable) as exc:
        logger.error("cannot serve %s version %s: %s", server.model, spec.version, exc)
