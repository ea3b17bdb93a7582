"""With an embedding model active, chunks and the question are embedded and the vector ranking is
fused with the keyword one: a question that shares no word with the passage still finds it. The
embedder here is a stand-in for the model's workers (a bag of concepts), so what is tested is the
storage, the owner-filtered exact cosine ranking and the fusion; a failed embedding leaves keyword
retrieval answering."""

from __future__ import annotations

import re
import zlib

import numpy as np
import pytest

from tests.webapp.test_chat_pages import alice, bob, prepare, smol  # noqa: F401
from tests.webapp.test_rag_retrieval import paged_document
from webapp.rag.models import Chunk, Document
from webapp.rag.vectors import vector_ranking

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]  # full-text search, transactions
SYNONYMS = {"feline": "cat", "kitty": "cat", "named": "called"}
DIMENSIONS = 4096


class BagOfConcepts:
    slug = "minilm"

    def __init__(self, fail: bool = False):
        self.fail, self.calls = fail, 0

    def embed(self, texts: list[str]) -> list[bytes] | None:
        self.calls += 1
        if self.fail:
            return None
        vectors = []
        for text in texts:
            vector = np.zeros(DIMENSIONS, dtype="<f4")
            for word in re.findall(r"\w+", text.lower()):
                vector[zlib.crc32(SYNONYMS.get(word, word).encode()) % DIMENSIONS] += 1
            vectors.append(vector.tobytes())
        return vectors


@pytest.fixture
def embedder(monkeypatch):
    fake = BagOfConcepts()
    monkeypatch.setattr("webapp.chat.grounding.active_embedder", lambda owner_id: fake)
    return fake


def test_vectors_find_a_passage_that_shares_no_keyword_with_the_question(alice, bob, smol, embedder):
    turn = prepare(alice, type="send", content="Which feline?", documents=[paged_document("log.pdf", 23, "A cat.")])

    assert turn.sources and turn.sources[0]["page"] == 23  # "feline": no keyword hit, the vector's
    assert Chunk.objects.filter(embedding_model="minilm").count() == Chunk.objects.count() > 0
    document_ids = list(Document.objects.values_list("id", flat=True))
    query = embedder.embed(["feline"])[0]
    assert vector_ranking(owner_id=alice.pk, document_ids=document_ids, query=query, model_slug="minilm")
    assert vector_ranking(owner_id=bob.pk, document_ids=document_ids, query=query, model_slug="minilm") == []


def test_a_failed_embedding_leaves_keyword_retrieval_answering(alice, smol, monkeypatch):
    failing = BagOfConcepts(fail=True)
    monkeypatch.setattr("webapp.chat.grounding.active_embedder", lambda owner_id: failing)

    turn = prepare(alice, type="send", content="Which cat?", documents=[paged_document("log.pdf", 11, "A cat.")])

    assert failing.calls == 2  # the chunks, then the question
    assert turn.sources[0]["page"] == 11 and Chunk.objects.exclude(embedding=None).count() == 0
