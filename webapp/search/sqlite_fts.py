"""Embedded mode's search: SQLite FTS5 external-content tables over the chat app's tables.

``search_message_fts`` indexes ``chat_message.content`` and ``search_conversation_fts``
``chat_conversation.title``; they hold only the index (the text stays in the chat tables) and
triggers on the chat tables keep them in step. The Porter stemmer over unicode61 matches word
forms ("sailing" finds "sails"), as PostgreSQL's ``english`` configuration does.
"""

from __future__ import annotations

from webapp.search.query import HIT_END, HIT_START, SearchHit, fts5_match, snippet_segments

TOKENIZE = "porter unicode61 remove_diacritics 2"
# (fts table, indexed chat table, column): the migration and the healing below share these.
INDEXES = (("search_message_fts", "chat_message", "content"),
           ("search_conversation_fts", "chat_conversation", "title"))
SNIPPET_TOKENS = 16
# Other apps' FTS5 tables over their own tables, healed here too: (fts table, table, column).
EXTRA_INDEXES = (("rag_chunk_fts", "rag_chunk", "text"),)  # webapp.rag.sqlite_chunks


def _triggers(fts: str, table: str, column: str) -> dict[str, str]:
    insert = f"INSERT INTO {fts}(rowid, {column}) VALUES (new.id, new.{column});"
    delete = f"INSERT INTO {fts}({fts}, rowid, {column}) VALUES ('delete', old.id, old.{column});"
    return {
        f"{fts}_ai": f"CREATE TRIGGER IF NOT EXISTS {fts}_ai AFTER INSERT ON {table} BEGIN {insert} END",
        f"{fts}_ad": f"CREATE TRIGGER IF NOT EXISTS {fts}_ad AFTER DELETE ON {table} BEGIN {delete} END",
        f"{fts}_au": f"CREATE TRIGGER IF NOT EXISTS {fts}_au AFTER UPDATE OF {column} ON {table} "
                     f"BEGIN {delete} {insert} END",
    }


def fts5_missing_reason(connection) -> str | None:
    """None when this SQLite has FTS5; else why search cannot be installed."""
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA compile_options")
        if any(row[0] == "ENABLE_FTS5" for row in cursor.fetchall()):
            return None
        cursor.execute("SELECT sqlite_version()")
        version = cursor.fetchone()[0]
    return (f"this Python's SQLite ({version}) was built without FTS5, which conversation search needs: "
            "use a Python whose sqlite3 has it (python.org and Debian builds do) or PostgreSQL (DATABASE_URL)")


def create_statements(indexes=INDEXES) -> list[str]:
    statements = []
    for fts, table, column in indexes:
        statements.append(f"CREATE VIRTUAL TABLE IF NOT EXISTS {fts} USING fts5({column}, content='{table}', "
                          f"content_rowid='id', tokenize='{TOKENIZE}')")
        statements.extend(_triggers(fts, table, column).values())
        statements.append(f"INSERT INTO {fts}({fts}) VALUES ('rebuild')")  # rows already there
    return statements


def drop_statements(indexes=INDEXES) -> list[str]:
    statements = []
    for fts, table, column in indexes:
        statements.extend(f"DROP TRIGGER IF EXISTS {name}" for name in _triggers(fts, table, column))
        statements.append(f"DROP TABLE IF EXISTS {fts}")
    return statements


def heal_triggers(connection, indexes=INDEXES) -> list[str]:
    """Recreate any missing trigger (and rebuild that index from the chat table); the names recreated."""
    healed = []
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger')")
        present = {row[0] for row in cursor.fetchall()}
        for fts, table, column in indexes:
            if fts not in present or table not in present:
                continue  # the search migration has not run (or was reversed): nothing to heal
            missing = {name: sql for name, sql in _triggers(fts, table, column).items() if name not in present}
            for sql in missing.values():
                cursor.execute(sql)
            if missing:
                cursor.execute(f"INSERT INTO {fts}({fts}) VALUES ('rebuild')")
                healed.extend(missing)
    return healed


def heal_after_migrate(sender, using="default", **kwargs) -> None:
    from django.db import connections

    if connections[using].vendor == "sqlite":
        heal_triggers(connections[using])
        heal_triggers(connections[using], EXTRA_INDEXES)


def search(connection, *, user_id: int, tokens: list[str], limit: int) -> list[SearchHit]:
    match = fts5_match(tokens)
    messages = f"""
        SELECT m.id, m.conversation_id, c.title, m.role,
               snippet(search_message_fts, 0, '{HIT_START}', '{HIT_END}', '…', {SNIPPET_TOKENS}),
               bm25(search_message_fts)
        FROM search_message_fts
        JOIN chat_message m ON m.id = search_message_fts.rowid
        JOIN chat_conversation c ON c.id = m.conversation_id
        WHERE search_message_fts MATCH %s AND c.user_id = %s
        ORDER BY bm25(search_message_fts) LIMIT %s"""
    titles = f"""
        SELECT c.id, c.title, highlight(search_conversation_fts, 0, '{HIT_START}', '{HIT_END}'),
               bm25(search_conversation_fts)
        FROM search_conversation_fts
        JOIN chat_conversation c ON c.id = search_conversation_fts.rowid
        WHERE search_conversation_fts MATCH %s AND c.user_id = %s
        ORDER BY bm25(search_conversation_fts) LIMIT %s"""
    with connection.cursor() as cursor:
        cursor.execute(messages, [match, user_id, limit])
        hits = [SearchHit(conversation_id=cid, conversation_title=title or f"conversation {cid}", message_id=mid,
                          role=role, segments=snippet_segments(snip), score=-rank)
                for mid, cid, title, role, snip, rank in cursor.fetchall()]
        cursor.execute(titles, [match, user_id, limit])
        # bm25 is negative, smaller is better; a title hit counts double (titles are short summaries).
        hits += [SearchHit(conversation_id=cid, conversation_title=title or f"conversation {cid}", message_id=None,
                           role="title", segments=snippet_segments(marked), score=-2 * rank)
                 for cid, title, marked, rank in cursor.fetchall()]
    return hits
