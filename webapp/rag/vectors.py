"""The vector side of retrieval, when an embedding model is active: chunks and questions embedded
by that model's workers (the same GenerateRequest, task "embed", that POST /v1/embeddings sends),
stored as float32 bytes on the chunk, ranked by exact cosine similarity.

Exact search, on both databases: retrieval only ever ranks the chunks of one conversation's
documents (hundreds, at most a few thousand: 300,000 characters a turn), which numpy scores in
well under a millisecond, filtered by owner in SQL first. An approximate index (sqlite-vec's vec0,
pgvector) would rank the whole table and filter afterwards, or need one index per owner, and
pgvector's server extension cannot be installed here; the exact scan has neither problem.
A failed embedding call never fails a turn: the chunks keep no vector and keyword search answers.
"""

from __future__ import annotations

import base64
import logging
import uuid

import numpy as np
from asgiref.sync import async_to_sync
from django.conf import settings

from webapp.keys.tenancy import user_tenant
from webapp.rag.models import Chunk
from webapp.registry.selectors import modelversion_list_active, modelversion_tokenizer
from workers.connect import get_engine_client
from workers.protocol import TASK_EMBED, GenerateRequest

logger = logging.getLogger(__name__)

BATCH = 32
CANDIDATES = 50


class Embedder:
    """One active embedding model: ``embed(texts)`` -> float32 vectors as bytes, or None on failure."""

    def __init__(self, version, tokenizer, owner_id: int):
        self.version, self.tokenizer, self.owner_id = version, tokenizer, owner_id
        self.slug = version.model.slug
        self.max_len = version.engine_settings.get("max_model_len") or tokenizer.embedding["max_seq_length"]

    def embed(self, texts: list[str]) -> list[bytes] | None:
        vectors = []
        try:
            for start in range(0, len(texts), BATCH):
                vectors += async_to_sync(self._request)(texts[start:start + BATCH])
        except Exception as exc:  # a worker gone, a timeout, a refusal: keyword search still answers
            logger.warning("embedding with %s failed, keyword retrieval only: %s", self.slug, exc)
            return None
        return vectors

    async def _request(self, texts: list[str]) -> list[bytes]:
        inputs = [self.tokenizer.encode(text)[:self.max_len] for text in texts]
        request = GenerateRequest(request_id="rag-" + uuid.uuid4().hex, model=self.slug, prompt_token_ids=[],
                                  params={}, task=TASK_EMBED, inputs=inputs, tenant=user_tenant(self.owner_id))
        encoded = None
        async for chunk in get_engine_client(settings.REDIS_URL).generate(request):
            if chunk.error is not None:
                raise RuntimeError(chunk.error.message)
            encoded = chunk.embeddings or encoded
        if encoded is None or len(encoded) != len(texts):
            raise RuntimeError("the worker answered without the vectors")
        return [base64.b64decode(vector) for vector in encoded]


def active_embedder(*, owner_id: int) -> Embedder | None:
    """The first active embedding model (by slug), if retrieval may use one."""
    if not settings.PAGODA_RAG_EMBEDDINGS:
        return None
    for version in modelversion_list_active():
        if version.tokenizer_dir:
            tokenizer = modelversion_tokenizer(version)
            if tokenizer.embedding is not None:
                return Embedder(version, tokenizer, owner_id)
    return None


def vector_ranking(*, owner_id: int, document_ids: list[int], query: bytes, model_slug: str,
                   limit: int = CANDIDATES) -> list[int]:
    """The chunks of ``document_ids`` the user may read embedded by ``model_slug``, most similar to ``query`` first."""
    from webapp.rag.selectors import readable_documents

    rows = list(Chunk.objects.filter(document__in=readable_documents(user_id=owner_id), document_id__in=document_ids,
                                     embedding_model=model_slug, embedding__isnull=False)
                .values_list("id", "embedding"))
    if not rows:
        return []
    q = np.frombuffer(query, dtype="<f4")
    matrix = np.stack([np.frombuffer(bytes(vector), dtype="<f4") for _, vector in rows])  # [num_chunks, dim]
    if matrix.shape[1] != q.shape[0]:
        return []
    scores = matrix @ q / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(q) + 1e-12)
    order = np.argsort(-scores, kind="stable")[:limit]
    return [rows[i][0] for i in order]
