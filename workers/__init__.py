"""Serving: engine worker processes (or embedded threads) and the web process's client of them.

protocol.py     the messages (imports no engine: the web process reads it)
transport.py    EngineClient, get_engine_client(), embedded-mode start/stop (what the webapp uses)
redis_transport.py / memory_transport.py   distributed (Redis streams) and embedded transports
engine_loop.py  the worker's engine loop; engine_worker.py its process entry point (run_worker)
replies.py, metrics.py, heartbeat.py       batching of deltas, published metrics, liveness
celery.py, tasks.py                        background jobs, registered by name
"""
