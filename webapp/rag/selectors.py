"""Reads of indexed documents: the passages that answer a question, and one cited passage.

Every read names the user asking (``owner_id``): a chunk is found only through documents that user
may read now (``readable_documents``: their own messages' documents, their own knowledge bases',
their teams' knowledge bases'), whatever ids the caller passes (the ownership tests:
tests/webapp/test_rag_retrieval.py, tests/webapp/test_rag_knowledge_bases.py).
Ranking is the database's keyword search (sqlite_chunks / postgres_chunks); a second ranking,
when the caller has one (vectors), joins it by reciprocal rank fusion (fusion.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.db import connection
from django.db.models import Q, QuerySet

from webapp.rag.fusion import reciprocal_rank_fusion
from webapp.rag.models import Chunk, Document, KnowledgeBase
from webapp.orgs.models import Membership

MAX_QUERY_CHARS = 1000
MAX_QUERY_TOKENS = 24
CANDIDATES = 50
_TOKEN = re.compile(r"\w+")
STOPWORDS = frozenset("""a about above after again all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have having he her
here hers him his how i if in into is it its itself just me more most my no nor not now of off on once only or
other our ours out over own same she should so some such than that the their theirs them then there these they
this those through to too under until up very was we were what when where which while who whom why will with
would you your yours tell say says said please document documents""".split())


def readable_knowledge_bases(*, user_id: int) -> QuerySet[KnowledgeBase]:
    """The user's own bases and those of the teams they are a member of now (any role)."""
    teams = Membership.objects.filter(user_id=user_id).values("team_id")
    return KnowledgeBase.objects.filter(Q(owner_id=user_id) | Q(team_id__in=teams))


def readable_documents(*, user_id: int) -> QuerySet[Document]:
    """Every document whose chunks the user may read: their messages' and their readable bases'."""
    return Document.objects.filter(Q(knowledge_base__isnull=True, owner_id=user_id)
                                   | Q(knowledge_base__in=readable_knowledge_bases(user_id=user_id).values("id")))


def readable_ids(*, user_id: int, document_ids: list[int]) -> list[int]:
    """Of ``document_ids``, those the user may read."""
    if not document_ids:
        return []
    return list(readable_documents(user_id=user_id).filter(id__in=document_ids).values_list("id", flat=True))


@dataclass(frozen=True)
class Passage:
    chunk_id: int
    document: str
    page: int | None
    heading: str
    text: str

    def label(self) -> str:
        return self.document + (f", page {self.page}" if self.page else "") + (f", {self.heading}" if self.heading else "")


def question_tokens(text: str) -> list[str]:
    """A question's words worth matching: no stopwords, each once, at most MAX_QUERY_TOKENS."""
    seen: dict[str, None] = {}
    for token in _TOKEN.findall((text or "")[:MAX_QUERY_CHARS].lower()):
        if token not in STOPWORDS and token not in seen:
            seen[token] = None
    return list(seen)[:MAX_QUERY_TOKENS]


def keyword_ranking(*, owner_id: int, document_ids: list[int], question: str, limit: int = CANDIDATES) -> list[int]:
    tokens = question_tokens(question)
    document_ids = readable_ids(user_id=owner_id, document_ids=document_ids)
    if connection.vendor == "postgresql":
        from webapp.rag import postgres_chunks

        return postgres_chunks.search(owner_id=owner_id, document_ids=document_ids, tokens=tokens, limit=limit)
    from webapp.rag import sqlite_chunks

    return sqlite_chunks.search(connection, owner_id=owner_id, document_ids=document_ids, tokens=tokens, limit=limit)


def passages_retrieve(*, owner_id: int, document_ids: list[int], question: str, max_chars: int,
                      max_passages: int, vector_ranking: list[int] | None = None) -> list[Passage]:
    """The user's best readable chunks of ``document_ids`` for ``question`` within ``max_chars`` of text, best first."""
    ranking = keyword_ranking(owner_id=owner_id, document_ids=document_ids, question=question)
    if vector_ranking:
        ranking = reciprocal_rank_fusion(ranking, vector_ranking)
    chunks = Chunk.objects.filter(pk__in=ranking[:CANDIDATES], document__in=readable_documents(user_id=owner_id),
                                  document_id__in=document_ids).select_related("document")
    by_id = {chunk.pk: chunk for chunk in chunks}
    passages, used = [], 0
    for chunk_id in ranking:
        chunk = by_id.get(chunk_id)
        if chunk is None or used + len(chunk.text) > max_chars:
            continue
        passages.append(Passage(chunk.pk, chunk.document.name, chunk.page, chunk.heading, chunk.text))
        used += len(chunk.text)
        if len(passages) >= max_passages:
            break
    return passages


CONTEXT_CHARS = 400


def passage_get(*, owner_id: int, chunk_id: int) -> dict | None:
    """A cited passage as the side panel shows it: the chunk with some text around it; None unless the
    chunk is one the user may read now."""
    chunk = (Chunk.objects.filter(pk=chunk_id, document__in=readable_documents(user_id=owner_id))
             .select_related("document").first())
    if chunk is None:
        return None
    text = chunk.document.text
    page_start = text.rfind("\f", 0, chunk.start) + 1  # the context stays on the chunk's page
    page_end = text.find("\f", chunk.end)
    page_end = len(text) if page_end < 0 else page_end
    return {"chunk": chunk.pk, "document": chunk.document.name, "page": chunk.page, "heading": chunk.heading,
            "start": chunk.start, "end": chunk.end,
            "before": text[max(page_start, chunk.start - CONTEXT_CHARS):chunk.start],
            "text": chunk.text, "after": text[chunk.end:min(page_end, chunk.end + CONTEXT_CHARS)]}


def conversation_document_ids(*, owner_id: int, message_ids: list[int]) -> list[int]:
    return list(Document.objects.filter(owner_id=owner_id, message_id__in=message_ids).values_list("id", flat=True))


def conversation_knowledge_document_ids(*, user_id: int, conversation_id: int) -> list[int]:
    """The documents of the knowledge bases attached to the conversation that the user may read now
    (a base of a team they have left is skipped, not refused: the turn goes on without it)."""
    bases = readable_knowledge_bases(user_id=user_id).filter(conversations__id=conversation_id).values("id")
    return list(Document.objects.filter(knowledge_base__in=bases).values_list("id", flat=True))
