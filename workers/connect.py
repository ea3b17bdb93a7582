"""Which transport to use, from configuration the caller passes in: a Redis URL, or None.

``get_engine_client(redis_url)`` is the web process's client (one per URL, shared by the
process); ``worker_transport(redis_url, model)`` is a new worker's side. A URL means
distributed mode (workers/redis_transport.py); None means embedded mode, where the workers are
threads of this process and the in-process broker carries the messages
(workers/memory_transport.py). Nothing here reads the environment: the web process passes its
Django settings' REDIS_URL, a worker process its --redis-url.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid

from workers.transport import Admission, EngineClient, TransportUnreachable, WorkerTransport


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


_clients: dict[str | None, EngineClient] = {}
_clients_lock = threading.Lock()


_admission = Admission()


def set_admission(admission: Admission) -> None:
    """The queue bound and deadlines of every client of this process, present and future (the
    web process calls it once at startup, from its settings)."""
    global _admission
    with _clients_lock:
        _admission = admission
        for client in _clients.values():
            client.admission = admission


def get_engine_client(redis_url: str | None) -> EngineClient:
    """The process-wide client: Redis streams at ``redis_url``, in-memory when it is None."""
    with _clients_lock:
        client = _clients.get(redis_url)
        if client is None:
            if redis_url:
                from workers.redis_transport import RedisEngineClient  # redis: distributed only
                client = RedisEngineClient(redis_url)
            else:
                from workers.memory_transport import MemoryEngineClient, default_broker
                client = MemoryEngineClient(default_broker())
            client.admission = _admission
            _clients[redis_url] = client
        return client


def worker_transport(redis_url: str | None, model: str) -> WorkerTransport:
    """A new worker's side of the transport, under a fresh worker id.

    Raises TransportUnreachable when Redis cannot be reached.
    """
    if not redis_url:
        from workers.memory_transport import MemoryWorkerTransport, default_broker
        return MemoryWorkerTransport(default_broker(), model, new_worker_id())
    import redis

    from workers.redis_worker_transport import RedisWorkerTransport
    try:
        return RedisWorkerTransport(redis_url, model, new_worker_id())
    except redis.RedisError as exc:
        raise TransportUnreachable(f"cannot reach Redis at {redis_url}: {exc}") from exc
