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
    hits.sort(key=lambda hit: -hit.score)
    return hits[:limit]
