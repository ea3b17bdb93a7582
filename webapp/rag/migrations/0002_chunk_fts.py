"""The keyword index over chunks, in the database's own dialect (as search's 0001_fts_indexes):
SQLite: an FTS5 table and its triggers (sqlite_chunks.py); PostgreSQL: a GIN index over the
tsvector expression postgres_chunks.py queries."""

import importlib

from django.db import migrations

from webapp.rag import sqlite_chunks

VendorRunSQL = importlib.import_module("webapp.search.migrations.0001_fts_indexes").VendorRunSQL


class Migration(migrations.Migration):

    dependencies = [("rag", "0001_initial"), ("search", "0001_fts_indexes")]

    operations = [
        VendorRunSQL("sqlite", sqlite_chunks.CREATE, sqlite_chunks.DROP),
        VendorRunSQL("postgresql",
                     ["CREATE INDEX IF NOT EXISTS rag_chunk_text_gin ON rag_chunk "
                      "USING GIN (to_tsvector('english'::regconfig, COALESCE(text, '')))"],
                     ["DROP INDEX IF EXISTS rag_chunk_text_gin"]),
    ]
