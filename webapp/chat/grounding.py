"""A turn's history as the model reads it, its documents pasted whole or retrieved from.

Documents on the path shown that come to at most ``PAGODA_RAG_PASTE_MAX_CHARS`` characters are
pasted whole into their messages (chat.documents.prompt_text), as before. Past that, they are
indexed (webapp.rag.services, inside the turn's transaction) and the answered message carries the
passages retrieved for it (keyword search, fused with vector search when an embedding model is
active: webapp.rag.vectors), numbered [1]..[k], within a quarter of the model's context; the answer
keeps which chunks those were (Message.sources) so that its markers open them.

Knowledge bases attached to the conversation (webapp.rag.knowledge) are always retrieved from, with
the path's own documents, whatever their size: as the user sending the turn, so only the bases that
user may read now take part (a team's, while they are its member); the others are skipped.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings

from webapp.chat.documents import prompt_text
from webapp.rag.prompting import named_only, sources_prompt, sources_record
from webapp.rag.selectors import conversation_document_ids, conversation_knowledge_document_ids, passages_retrieve
from webapp.rag.services import documents_ingest
from webapp.rag.vectors import active_embedder, vector_ranking

logger = logging.getLogger(__name__)

CHARS_PER_TOKEN = 3  # a cautious estimate for the passages' budget; the turn's fit check counts exactly
MAX_PASSAGES = 6
MAX_SOURCE_CHARS = 8000


def grounded_history(*, user, path: list, answered, max_model_len: int | None) -> tuple[list[dict], list[dict]]:
    """(the path as chat messages, the answer's sources: [] when the documents are pasted whole)."""
    with_documents = [m for m in path if m.attachments]
    base_document_ids = conversation_knowledge_document_ids(user_id=user.pk, conversation_id=answered.conversation_id)
    if not base_document_ids and (sum(len(d["text"]) for m in with_documents for d in m.attachments)
                                  <= settings.PAGODA_RAG_PASTE_MAX_CHARS):
        return [{"role": m.role, "content": prompt_text(content=m.content, attachments=m.attachments)}
                for m in path], []
    started = time.perf_counter()
    embedder = active_embedder(owner_id=user.pk)
    for message in with_documents:
        documents_ingest(message=message, embedder=embedder)
    document_ids = conversation_document_ids(owner_id=user.pk, message_ids=[m.pk for m in with_documents])
    document_ids += base_document_ids
    by_vector = None
    if embedder is not None and (query := embedder.embed([answered.content])):
        by_vector = vector_ranking(owner_id=user.pk, document_ids=document_ids, query=query[0],
                                   model_slug=embedder.slug)
    budget = min(MAX_SOURCE_CHARS, (max_model_len or 8192) // 4 * CHARS_PER_TOKEN)
    passages = passages_retrieve(owner_id=user.pk, document_ids=document_ids, question=answered.content,
                                 max_chars=budget, max_passages=MAX_PASSAGES, vector_ranking=by_vector)
    logger.info("retrieval: %d passages in %.1f ms (%s)", len(passages), 1000 * (time.perf_counter() - started),
                f"keyword + vectors of {embedder.slug}" if by_vector is not None else "keyword")
    history = []
    for m in path:
        if m.pk == answered.pk:
            content = sources_prompt(content=m.content, passages=passages)
        elif m.attachments:
            content = named_only(content=m.content, attachments=m.attachments)
        else:
            content = m.content
        history.append({"role": m.role, "content": content})
    return history, sources_record(passages)
