"""Embedded mode: the web process serves its models itself, a ModelServer per model, in-process.

The workers are daemon threads of this process and the in-process broker carries their
messages (workers/memory_transport.py); the web process reads them with
``get_engine_client(None)``. Importing this module loads the engine (torch): the webapp
imports it only where embedded mode is on.
"""

from __future__ import annotations

import threading
import time

from workers.serving import ModelServer, ServeSpec

_lock = threading.Lock()
_servers: dict[str, ModelServer] = {}  # model -> its server, kept after stop() for stop_all


def start_embedded_worker(model: str, version: str, path: str, engine_settings: dict) -> None:
    """Serve ``model`` from (version, path, settings); returns before the model is loaded.

    A no-op when that is already served, or when it failed to load (see ModelServer). A new
    version or new settings load while the old worker keeps serving; the old one drains once
    the new one is ready. Bad engine settings raise InvalidParameterError here.
    """
    with _lock:
        server = _servers.get(model)
        if server is None:
            server = _servers[model] = ModelServer(model, redis_url=None)
    server.serve(ServeSpec(version, path, dict(engine_settings)))


def wait_for_embedded_worker(model: str, timeout: float) -> bool:
    """Block until the embedded worker of ``model`` is announced; False on timeout or failure."""
    with _lock:
        server = _servers.get(model)
    return server is not None and server.wait_ready(timeout)


def stop_embedded_worker(model: str, drain_timeout: float | None = None) -> bool:
    """``model``'s workers stop taking requests and drain; returns at once.

    False when this process serves nothing of ``model``. Running requests finish within
    ``drain_timeout`` (default: the deployment's serving.drain_timeout_s).
    """
    with _lock:
        server = _servers.get(model)
    return server is not None and server.stop(drain_timeout)


def stop_embedded_workers(drain_timeout: float = 30) -> None:
    """Stop every embedded worker: no new requests, running ones finish within drain_timeout."""
    with _lock:
        servers = list(_servers.values())
    for server in servers:
        server.stop(drain_timeout)
    deadline = time.monotonic() + drain_timeout + 5.0
    for server in servers:
        server.join(max(0.0, deadline - time.monotonic()))
