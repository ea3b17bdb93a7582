"""Distributed mode's search: PostgreSQL full-text search over the chat app's tables.

The tsvector is computed from the column by the expression Django's ``SearchVector`` writes, and
a GIN index over that same expression (created by this app's migration) answers the ``@@``, so
nothing is stored twice and nothing has to be kept in step. ``ts_headline`` marks the hits.
"""

from __future__ import annotations

from django.contrib.postgres.search import SearchHeadline, SearchQuery, SearchRank, SearchVector
from django.db.models import F, Value
from django.db.models.functions import Replace

from webapp.chat.models import Conversation, Message
from webapp.search.query import HIT_END, HIT_START, SearchHit, Segment, tsquery_raw
from webapp.search.query import snippet_segments as _segments

CONFIG = "english"
# ts_headline leaves out whatever its parser reads as an HTML tag ("<b>", "</script>"), so a
# snippet of code would lose text; a zero-width space after every "<" keeps it text, and is taken
# out again below (with any the fragment began with).
TAG_GUARD = "<\u200b"
# GIN indexes over to_tsvector('english', COALESCE(column, '')) -- the expression
# SearchVector(column, config=CONFIG) compiles to -- are created by migrations/0001_fts_indexes.py.


def _shown(column: str):
    return Replace(F(column), Value("<"), Value(TAG_GUARD))


def snippet_segments(marked: str) -> list[Segment]:
    return [Segment(s.text.replace(TAG_GUARD, "<").replace(TAG_GUARD[1], ""), s.is_hit) for s in _segments(marked)]


def search(*, user_id: int, tokens: list[str], limit: int) -> list[SearchHit]:
    query = SearchQuery(tsquery_raw(tokens), search_type="raw", config=CONFIG)
    headline = dict(start_sel=HIT_START, stop_sel=HIT_END, config=CONFIG)
    messages = (Message.objects.filter(conversation__user_id=user_id)
                .annotate(document=SearchVector("content", config=CONFIG)).filter(document=query)
                .annotate(rank=SearchRank(F("document"), query),
                          snippet=SearchHeadline(_shown("content"), query, max_words=24, min_words=8,
                                                 max_fragments=2, fragment_delimiter=" … ", **headline))
                .order_by("-rank", "-id")
                .values_list("id", "conversation_id", "conversation__title", "role", "snippet", "rank")[:limit])
    titles = (Conversation.objects.filter(user_id=user_id)
              .annotate(document=SearchVector("title", config=CONFIG)).filter(document=query)
              .annotate(rank=SearchRank(F("document"), query),
                        marked=SearchHeadline(_shown("title"), query, highlight_all=True, **headline))
              .order_by("-rank", "-id").values_list("id", "title", "marked", "rank")[:limit])
    hits = [SearchHit(conversation_id=cid, conversation_title=title or f"conversation {cid}", message_id=mid,
                      role=role, segments=snippet_segments(snip), score=rank)
            for mid, cid, title, role, snip, rank in messages]
    hits += [SearchHit(conversation_id=cid, conversation_title=title or f"conversation {cid}", message_id=None,
                       role="title", segments=snippet_segments(marked), score=2 * rank)
             for cid, title, marked, rank in titles]
    return hits
