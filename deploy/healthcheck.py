"""Container health checks for docker-compose.yml, with nothing but the image's Python.

    python deploy/healthcheck.py http URL        # 0 when URL answers 2xx (the web's /healthz)
    python deploy/healthcheck.py worker MODEL    # 0 when this host runs a live worker of MODEL

A worker is live while its heartbeat is fresh in Redis ($REDIS_URL): what the web processes route
by, so a worker that is still loading, or whose engine loop died, is not healthy.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.request


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return 200 <= response.status < 300
    except OSError:
        return False


def worker_live(model: str) -> bool:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from workers.connect import get_engine_client

    host = socket.gethostname()
    try:
        return any(w.host == host for w in get_engine_client(os.environ["REDIS_URL"]).live_workers(model))
    except Exception as exc:  # Redis away: not healthy, said in one line rather than a traceback
        print(f"cannot read the workers from Redis: {exc}", file=sys.stderr)
        return False


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("http", "worker"):
        print(__doc__, file=sys.stderr)
        return 2
    kind, target = argv
    return 0 if (http_ok(target) if kind == "http" else worker_live(target)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
