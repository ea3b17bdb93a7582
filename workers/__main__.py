"""An engine worker process: one model version served over Redis until SIGTERM.

    python -m workers.engine_worker --model-path PATH --model NAME [--version V] [--redis-url URL]

``run_worker`` builds the engine, warms it up, announces the worker and runs the engine loop
(workers/engine_loop.py) in this thread. On SIGTERM (or SIGINT) the worker stops taking
requests, finishes the running ones within the drain timeout and exits 0; a second signal
stops it at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.errors import InvalidParameterError
from workers.engine_loop import EngineWorker, engine_config, new_worker_id

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _stop_on_signals(worker: EngineWorker):
    """SIGTERM/SIGINT: drain; a second one: stop now. Only the main thread can install them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum, frame):
        logger.info("worker %s: %s", worker.worker_id, signal.Signals(signum).name)
        worker.request_stop(immediate=worker.is_stopping)

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_worker(model: str, version: str, path: str, engine_settings: dict, *,
               redis_url: str | None, drain_timeout: float = 30.0) -> int:
    """Serve ``model`` from this process over Redis until SIGTERM; returns the exit code.

    ``redis_url`` defaults to $REDIS_URL; without either there is nobody to serve (embedded
    mode runs its worker inside the web process instead), so this returns 2.
    """
    url = redis_url or os.environ.get("REDIS_URL")
    if not url:
        logger.error("an engine worker process needs REDIS_URL (embedded mode needs no worker process)")
        return 2
    import redis

    from workers.redis_transport import RedisWorkerTransport  # redis only in distributed mode

    try:
        engine_config(path, dict(engine_settings))
    except InvalidParameterError as exc:
        logger.error("bad engine settings for %s: %s", model, exc)
        return 2
    try:
        transport = RedisWorkerTransport(url, model, new_worker_id())
    except redis.ConnectionError as exc:
        logger.error("cannot reach Redis at %s: %s", url, exc)
        return 1
    worker = EngineWorker(model, version, path, engine_settings, transport,
                          drain_timeout=drain_timeout)
    with _stop_on_signals(worker):
        try:
            return worker.run()
        except Exception:
            logger.exception("worker %s crashed", worker.worker_id)
            return 1


@dataclass(frozen=True)
class ServeSpec:
    """What a model's worker should serve: compared whole, so new settings also mean a swap."""

    version: str
    path: str
    engine_settings: dict = field(default_factory=dict)


class _Follower:
    """Serves whatever ``active()`` says, swapping engines in this process when it changes.

    The main thread polls; each engine runs in a thread of its own. A new spec loads next to
    the serving engine, whose worker drains (finishes its running requests, then stops) once the
    new one is ready: the same hand-over as embedded mode. No spec: every worker drains and the
    process waits for the next activation.
    """

    def __init__(self, model: str, active: Callable[[], ServeSpec | None], url: str,
                 drain_timeout: float):
        self.model, self.active, self.url, self.drain_timeout = model, active, url, drain_timeout
        self.workers: list[tuple[EngineWorker, threading.Thread]] = []
        self.current: tuple[ServeSpec, EngineWorker] | None = None
        self.failed: ServeSpec | None = None  # not retried until the spec changes
        self.results: dict[str, int] = {}  # worker id -> run()'s exit code
        self.stopping = False

    def poll(self) -> None:
        self.workers = [(w, t) for w, t in self.workers if t.is_alive()]
        if self.current is not None and self.results.get(self.current[1].worker_id) == 1:
            logger.error("worker %s could not load %s; the previous one (if any) keeps serving",
                         self.current[1].worker_id, self.current[0])
            self.failed, self.current = self.current[0], None
        try:
            spec = self.active()
        except Exception:  # the registry's database away for a moment: keep serving
            logger.exception("could not read the active version of %s", self.model)
            return
        if spec is None:
            if self.current is not None:
                logger.info("%s has no active version any more: draining, then waiting", self.model)
                self.current = None
                for worker, _thread in self.workers:
                    worker.request_stop()
            return
        if spec == self.failed or (self.current is not None and self.current[0] == spec):
            return
        self.failed = None
        self._start(spec)

    def _start(self, spec: ServeSpec) -> None:
        import redis

        from workers.redis_transport import RedisWorkerTransport

        try:
            engine_config(spec.path, dict(spec.engine_settings))
            transport = RedisWorkerTransport(self.url, self.model, new_worker_id())
            worker = EngineWorker(self.model, spec.version, spec.path, spec.engine_settings,
                                  transport, drain_timeout=self.drain_timeout)
        except (InvalidParameterError, redis.ConnectionError) as exc:
            logger.error("cannot serve %s version %s: %s", self.model, spec.version, exc)
            self.failed = spec
            return
        worker.on_ready = lambda: self._retire_others(worker)
        thread = threading.Thread(target=self._run, args=(worker,), daemon=True,
                                  name=f"pagoda-engine-{self.model}-{spec.version}")
        logger.info("%s: loading version %s from %s", self.model, spec.version, spec.path)
        self.workers.append((worker, thread))
        self.current = (spec, worker)
        thread.start()

    def _run(self, worker: EngineWorker) -> None:
        try:
            self.results[worker.worker_id] = worker.run()
        except Exception:
            logger.exception("worker %s crashed", worker.worker_id)
            self.results[worker.worker_id] = 1

    def _retire_others(self, keep: EngineWorker) -> None:
        """``keep`` is ready: the workers started before it drain (never a newer, loading one)."""
        workers = [worker for worker, _thread in list(self.workers)]
        if keep not in workers:
            return
        for worker in workers[:workers.index(keep)]:
            logger.info("%s: version %s ready; worker %s (version %s) drains", self.model,
                        keep.version, worker.worker_id, worker.version)
            worker.request_stop()

    def stop(self, immediate: bool = False) -> None:
        self.stopping = True
        for worker, _thread in list(self.workers):
            worker.request_stop(immediate=immediate or worker.is_stopping)

    def alive(self) -> bool:
        return any(thread.is_alive() for _worker, thread in self.workers)


def follow_active_version(model: str, active: Callable[[], ServeSpec | None], *,
                          redis_url: str | None, drain_timeout: float = 30.0,
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
    url = redis_url or os.environ.get("REDIS_URL")
    if not url:
        logger.error("an engine worker process needs REDIS_URL (embedded mode needs no worker process)")
        return 2
    follower = _Follower(model, active, url, drain_timeout)
    wake = stop if stop is not None else threading.Event()
    signalled = []

    def handle(signum, frame):
        logger.info("%s follower: %s", model, signal.Signals(signum).name)
        follower.stop(immediate=bool(signalled))
        signalled.append(signum)
        wake.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not follower.stopping:
            if wake.is_set():
                follower.stop()
                break
            follower.poll()
            wake.wait(poll_interval)
        while follower.alive():
            time.sleep(0.1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _setting(text: str) -> tuple[str, object]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.engine_worker",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--model-path", required=True,
                        help="checkpoint directory, .gguf file or 'smollm2'")
    parser.add_argument("--model", required=True, help="the model name requests are addressed to")
    parser.add_argument("--version", default="local")
    parser.add_argument("--redis-url", default=None, help="default: $REDIS_URL")
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument("--setting", type=_setting, action="append", default=[], metavar="KEY=VALUE",
                        help="an EngineConfig field, e.g. --setting num_kv_blocks=64 (JSON values)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_worker(args.model, args.version, args.model_path, dict(args.setting),
                      redis_url=args.redis_url, drain_timeout=args.drain_timeout)


if __name__ == "__main__":
    sys.exit(main())
