"""Ingestion: a user message's attached documents chunked and indexed, all or nothing.

``documents_ingest`` runs inside the chat turn's transaction (webapp.chat.services.turn_prepare):
every Document and every Chunk (and, through the triggers, their keyword index) is written there,
so a refused, failed or cancelled turn rolls all of it back, and a message's documents are read
once: a later turn finds them already indexed.
"""

from __future__ import annotations

from django.db import transaction

from webapp.rag.chunking import PAGE_BREAK, chunk_document, document_kind
from webapp.rag.models import Chunk, Document


class IngestError(ValueError):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@transaction.atomic
def documents_ingest(*, message, embedder=None) -> list[Document]:
    """The documents of ``message`` (a user message with attachments) as indexed Documents; with an
    ``embedder`` (vectors.Embedder), their chunks not yet embedded by its model get its vectors."""
    existing = {d.position: d for d in Document.objects.filter(message=message)}
    documents = []
    for position, attachment in enumerate(message.attachments):
        if position in existing:
            documents.append(existing[position])
            continue
        documents.append(_document_create(
            name=attachment["name"], raw_text=attachment["text"], owner_id=message.conversation.user_id,
            conversation_id=message.conversation_id, message=message, position=position))
    if embedder is not None:
        _embed(documents, embedder)
    return documents


def _document_create(*, name: str, raw_text: str, **where) -> Document:
    """One Document and all of its chunks (the caller's transaction makes them all or nothing)."""
    text, spans = chunk_document(name, raw_text)
    if not spans:
        raise IngestError(f"{name} has no text to read.")
    kind = document_kind(name)
    document = Document.objects.create(
        name=name, kind=kind, text=text, **where,
        num_pages=text.count(PAGE_BREAK) + 1 if kind == "pdf" or PAGE_BREAK in text else None)
    Chunk.objects.bulk_create(Chunk(document=document, ordinal=s.ordinal, page=s.page, heading=s.heading,
                                    start=s.start, end=s.end, text=text[s.start:s.end]) for s in spans)
    return document


def _embed(documents: list[Document], embedder) -> None:
    chunks = list(Chunk.objects.filter(document__in=documents).exclude(embedding_model=embedder.slug)
                  .order_by("document_id", "ordinal"))
    vectors = embedder.embed([chunk.text for chunk in chunks]) if chunks else None
    if vectors is None:
        return
    for chunk, vector in zip(chunks, vectors):
        chunk.embedding, chunk.embedding_model = vector, embedder.slug
    Chunk.objects.bulk_update(chunks, ["embedding", "embedding_model"], batch_size=200)
