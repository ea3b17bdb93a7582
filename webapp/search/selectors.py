"""The one entry point of search: the database's own full-text search, chosen by its vendor."""

from __future__ import annotations

from django.db import connection

from webapp.search.query import SearchHit, query_tokens

MAX_RESULTS = 30


def conversation_search(*, user, text: str, limit: int = MAX_RESULTS) -> list[SearchHit]:
    """The user's own messages and conversation titles matching ``text``, best first.

    Anything typed is accepted: operators and quotes are not a query language here (see query.py),
    and a query with no word in it finds nothing.
    """
    tokens = query_tokens(text)
    if not tokens or not user.is_authenticated:
        return []
    if connection.vendor == "postgresql":
        from webapp.search import postgres_fts  # imports django.contrib.postgres, which needs psycopg

        hits = postgres_fts.search(user_id=user.pk, tokens=tokens, limit=limit)
    elif connection.vendor == "sqlite":
        from webapp.search import sqlite_fts

        hits = sqlite_fts.search(connection, user_id=user.pk, tokens=tokens, limit=limit)
    else:
        raise NotImplementedError(f"no full-text search for the {connection.vendor} database")
    return _merge_titles(hits)[:limit]


def _merge_titles(hits: list[SearchHit]) -> list[SearchHit]:
    """Best first, one title hit fewer for each conversation that also has message hits (a chat's title is
    usually its first message): the title's score lifts that conversation's best message hit instead."""
    titles = {hit.conversation_id: hit for hit in hits if hit.message_id is None}
    merged = [hit for hit in hits if hit.message_id is not None]
    best: dict[int, SearchHit] = {}
    for hit in merged:
        if hit.conversation_id not in best or hit.score > best[hit.conversation_id].score:
            best[hit.conversation_id] = hit
    for conversation_id, title in titles.items():
        if conversation_id in best:
            best[conversation_id].score = max(best[conversation_id].score, title.score)
        else:
            merged.append(title)
    return sorted(merged, key=lambda hit: -hit.score)
