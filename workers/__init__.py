"""Serving: engine worker processes (or embedded threads) and the web process's client of them.

protocol.py         the messages (imports no engine: the web process reads it)
transport.py        the transport interfaces: EngineClient (web side), WorkerTransport (worker side)
redis_transport.py  Redis streams (distributed mode): the design, the shared names, the web side's client
redis_worker_transport.py  ... and the worker side
memory_transport.py the in-process broker (embedded mode), both sides
connect.py          get_engine_client(redis_url) / worker_transport(...): picks one from the caller's URL
engine_worker.py    EngineWorker, the engine loop serving one version over a WorkerTransport
embedding_worker.py EmbeddingWorker, the same loop over an embedding model (engine/embedding_engine.py)
serving.py          ModelServer (a model's workers over their lifetime), follow_active_version
embedded.py         embedded mode: a ModelServer per model inside the web process
__main__.py         the worker process: python -m workers --model-path P --model M --redis-url U
replies.py, metrics.py, heartbeat.py       batching of deltas, published metrics, liveness
"""
