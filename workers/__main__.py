"""An engine worker process: one model version served over Redis until SIGTERM.

    python -m workers --model-path PATH --model NAME [--version V] --redis-url URL

``run_worker`` serves the version with a ModelServer (workers/serving.py): the engine loads,
warms up and is announced, then serves in a thread of this process. On SIGTERM (or SIGINT) the
worker stops taking requests, finishes the running ones within the drain timeout and the process
exits 0; a second signal stops it at once. ``manage.py run_engine_worker`` is the same process
following the registry's active version instead of a fixed one.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from engine.errors import InvalidParameterError
from workers.serving import ModelServer, ServeSpec, exit_now, stop_on_signals
from workers.transport import TransportUnreachable

logger = logging.getLogger("workers")


def run_worker(model: str, version: str, path: str, engine_settings: dict, *,
               redis_url: str | None, drain_timeout: float = 30.0) -> int:
    """Serve ``model`` from this process over Redis until SIGTERM; returns the exit code.

    0 after a clean stop, 1 when Redis is unreachable or the model could not load, 2 for bad
    engine settings or no ``redis_url`` (embedded mode runs its workers inside the web process).
    """
    if not redis_url:
        logger.error("an engine worker process needs --redis-url (embedded mode needs no worker "
                     "process)")
        return 2
    server = ModelServer(model, redis_url=redis_url, drain_timeout=drain_timeout)
    with stop_on_signals(server):
        try:
            server.serve(ServeSpec(version, path, dict(engine_settings)))
        except InvalidParameterError as exc:
            logger.error("bad engine settings for %s: %s", model, exc)
            return 2
        except TransportUnreachable as exc:
            logger.error("%s", exc)
            return 1
        while server.is_alive:  # not join(): signal handlers run only between these waits
            time.sleep(0.1)
    return 1 if server.failed is not None else 0


def _setting(text: str) -> tuple[str, object]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers", description=__doc__.split("\n")[0])
    parser.add_argument("--model-path", required=True,
                        help="checkpoint directory, .gguf file or 'smollm2'")
    parser.add_argument("--model", required=True, help="the model name requests are addressed to")
    parser.add_argument("--version", default="local")
    # The process's own configuration, so the environment is read here and nowhere below.
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL"),
                        help="default: $REDIS_URL")
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument("--setting", type=_setting, action="append", default=[], metavar="KEY=VALUE",
                        help="an EngineConfig field, e.g. --setting num_kv_blocks=64 (JSON values)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_worker(args.model, args.version, args.model_path, dict(args.setting),
                      redis_url=args.redis_url, drain_timeout=args.drain_timeout)


if __name__ == "__main__":
    exit_now(main())
