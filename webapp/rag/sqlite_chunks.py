"""Embedded mode's keyword index over chunks: an FTS5 external-content table over ``rag_chunk.text``
kept in step by triggers, made and healed as search's own are (webapp.search.sqlite_fts: the same
Porter over unicode61 tokenizer, and triggers put back after a migration that rebuilds the table)."""

from __future__ import annotations

from webapp.search.sqlite_fts import EXTRA_INDEXES, create_statements, drop_statements

INDEXES = EXTRA_INDEXES  # healed after any migration that rebuilds rag_chunk (search/apps.py)
FTS = INDEXES[0][0]
CREATE = create_statements(INDEXES)
DROP = drop_statements(INDEXES)


def search(connection, *, owner_id: int, document_ids: list[int], tokens: list[str], limit: int) -> list[int]:
    """Chunk ids of ``document_ids`` (already narrowed to those the user may read: selectors.keyword_ranking)
    matching any token, best (bm25) first."""
    if not document_ids or not tokens:
        return []
    match = " OR ".join('"' + token.replace('"', '""') + '"' for token in tokens)
    marks = ", ".join(["%s"] * len(document_ids))
    sql = f"""
        SELECT c.id FROM {FTS}
        JOIN rag_chunk c ON c.id = {FTS}.rowid
        JOIN rag_document d ON d.id = c.document_id
        WHERE {FTS} MATCH %s AND d.id IN ({marks})
        ORDER BY bm25({FTS}), c.id LIMIT %s"""
    with connection.cursor() as cursor:
        cursor.execute(sql, [match, *document_ids, limit])
        return [row[0] for row in cursor.fetchall()]
