"""Distributed mode's keyword index over chunks: PostgreSQL full-text search, as conversation
search does it (webapp.search.postgres_fts): a GIN index over to_tsvector('english', text)
(migrations/0002_chunk_fts.py) answers the ``@@``; ts_rank orders. Tokens are ORed: a question's
words need not all be in one passage."""

from __future__ import annotations

from django.contrib.postgres.search import SearchQuery, SearchRank, SearchVector
from django.db.models import F

from webapp.rag.models import Chunk

CONFIG = "english"


def search(*, owner_id: int, document_ids: list[int], tokens: list[str], limit: int) -> list[int]:
    if not document_ids or not tokens:
        return []
    query = SearchQuery(" | ".join(tokens), search_type="raw", config=CONFIG)  # tokens are \w+: no operators
    # document_ids: already narrowed to those the user may read (selectors.keyword_ranking)
    return list(Chunk.objects.filter(document_id__in=document_ids)
                .annotate(vector=SearchVector("text", config=CONFIG)).filter(vector=query)
                .annotate(rank=SearchRank(F("vector"), query)).order_by("-rank", "id")
                .values_list("id", flat=True)[:limit])
