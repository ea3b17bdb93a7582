"""``EmbeddingWorker``: the engine worker loop (workers/engine_worker.py) over an embedding model.

The same claims, batching, chunks, aborts, drain and heartbeats as a generation worker; only the
engine differs (engine/embedding_engine.py: an encoder forward and pooling, no KV cache) and what
a request carries (GenerateRequest.task "embed" with its inputs' token ids; the final chunk has
their vectors). A generation request sent here is refused naming the model.
"""

from __future__ import annotations

from engine.embedding_engine import EmbeddingEngine
from engine.errors import InvalidParameterError
from workers.engine_worker import EngineWorker
from workers.protocol import TASK_EMBED, GenerateRequest
from workers.requests import arrival_time


class EmbeddingWorker(EngineWorker):
    def _load_engine(self) -> EmbeddingEngine:
        return EmbeddingEngine(self.config)

    def _shutdown_engine(self) -> None:
        self.engine.shutdown()

    def _add_to_engine(self, req: GenerateRequest) -> None:
        if req.task != TASK_EMBED:
            raise InvalidParameterError("model", f"{self.model!r} is an embedding model; it serves "
                                                 f"/v1/embeddings, not completions")
        self.engine.add_request(req.request_id, req.inputs, arrival_time=arrival_time(req.created_at))

    def _warm_up(self) -> None:
        """One short input through the forward, so the first user does not pay for it."""
        self.engine.embed(["warm up"])
        self.engine.reset_counters()


def worker_class(path: str) -> type[EngineWorker]:
    """The worker for a checkpoint: an embedding model's, or the generation one."""
    from engine.models.registry import is_embedding_checkpoint

    return EmbeddingWorker if is_embedding_checkpoint(path) else EngineWorker
