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
