"""Full-text indexes over the chat app's messages and titles, in the database's own dialect.

SQLite: FTS5 external-content tables and the triggers that keep them in step (sqlite_fts.py).
PostgreSQL: GIN indexes over the tsvector expressions the searches use (postgres_fts.py).
Each statement list runs only on its vendor; on the other it is a no-op.
"""

from django.db import migrations

from webapp.search import sqlite_fts


class VendorRunSQL(migrations.RunSQL):
    """RunSQL that runs only when the database is of ``vendor``."""

    def __init__(self, vendor, sql, reverse_sql):
        self.vendor = vendor
        super().__init__(sql, reverse_sql)

    def deconstruct(self):
        name, args, kwargs = super().deconstruct()
        return name, args, {"vendor": self.vendor, **kwargs}

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == self.vendor:
            if self.vendor == "sqlite" and (reason := sqlite_fts.fts5_missing_reason(schema_editor.connection)):
                raise RuntimeError(reason)
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == self.vendor:
            super().database_backwards(app_label, schema_editor, from_state, to_state)


# Written out here rather than imported from postgres_fts, which imports django.contrib.postgres
# (and so psycopg) at import time; the expressions must match what that module queries.
POSTGRES_INDEXES = (("search_message_content_gin", "chat_message", "content"),
                    ("search_conversation_title_gin", "chat_conversation", "title"))


class Migration(migrations.Migration):

    dependencies = [("chat", "0001_initial")]

    operations = [
        VendorRunSQL("sqlite", sqlite_fts.create_statements(), sqlite_fts.drop_statements()),
        VendorRunSQL(
            "postgresql",
            [f"CREATE INDEX IF NOT EXISTS {name} ON {table} "
             f"USING GIN (to_tsvector('english'::regconfig, COALESCE({column}, '')))"
             for name, table, column in POSTGRES_INDEXES],
            [f"DROP INDEX IF EXISTS {name}" for name, _, _ in POSTGRES_INDEXES]),
    ]
