"""Embedded mode's keyword index over chunks: an FTS5 external-content table over ``rag_chunk.text``
kept in step by triggers, with search's tokenizer (webapp.search.sqlite_fts: Porter over unicode61)."""

from __future__ import annotations

from webapp.search.sqlite_fts import TOKENIZE

FTS = "rag_chunk_fts"
_INSERT = f"INSERT INTO {FTS}(rowid, text) VALUES (new.id, new.text);"
_DELETE = f"INSERT INTO {FTS}({FTS}, rowid, text) VALUES ('delete', old.id, old.text);"
TRIGGERS = {
    f"{FTS}_ai": f"CREATE TRIGGER IF NOT EXISTS {FTS}_ai AFTER INSERT ON rag_chunk BEGIN {_INSERT} END",
    f"{FTS}_ad": f"CREATE TRIGGER IF NOT EXISTS {FTS}_ad AFTER DELETE ON rag_chunk BEGIN {_DELETE} END",
    f"{FTS}_au": f"CREATE TRIGGER IF NOT EXISTS {FTS}_au AFTER UPDATE OF text ON rag_chunk BEGIN {_DELETE} {_INSERT} END",
}
CREATE = [f"CREATE VIRTUAL TABLE IF NOT EXISTS {FTS} USING fts5(text, content='rag_chunk', content_rowid='id', "
          f"tokenize='{TOKENIZE}')", *TRIGGERS.values(), f"INSERT INTO {FTS}({FTS}) VALUES ('rebuild')"]
DROP = [*(f"DROP TRIGGER IF EXISTS {name}" for name in TRIGGERS), f"DROP TABLE IF EXISTS {FTS}"]


def search(connection, *, owner_id: int, document_ids: list[int], tokens: list[str], limit: int) -> list[int]:
    """Chunk ids of the owner's documents ``document_ids`` matching any token, best (bm25) first."""
    if not document_ids or not tokens:
        return []
    match = " OR ".join('"' + token.replace('"', '""') + '"' for token in tokens)
    marks = ", ".join(["%s"] * len(document_ids))
    sql = f"""
        SELECT c.id FROM {FTS}
        JOIN rag_chunk c ON c.id = {FTS}.rowid
        JOIN rag_document d ON d.id = c.document_id
        WHERE {FTS} MATCH %s AND d.owner_id = %s AND d.id IN ({marks})
        ORDER BY bm25({FTS}), c.id LIMIT %s"""
    with connection.cursor() as cursor:
        cursor.execute(sql, [match, owner_id, *document_ids, limit])
        return [row[0] for row in cursor.fetchall()]
