"""The database refuses to change audit entries: PostgreSQL refuses UPDATE and DELETE of a row,
SQLite refuses UPDATE (its DELETE stays open: Django's test flush empties tables with DELETE,
where PostgreSQL's uses TRUNCATE; webapp.audit.models refuses deletes above the database)."""

from django.db import migrations

TABLE = "audit_auditentry"
POSTGRES_UP = [
    """CREATE OR REPLACE FUNCTION audit_entry_append_only() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'audit entries are append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql""",
    f"""CREATE TRIGGER audit_entry_append_only BEFORE UPDATE OR DELETE ON {TABLE}
  FOR EACH ROW EXECUTE FUNCTION audit_entry_append_only()"""]
POSTGRES_DOWN = [f"DROP TRIGGER IF EXISTS audit_entry_append_only ON {TABLE}",
                 "DROP FUNCTION IF EXISTS audit_entry_append_only()"]
SQLITE_UP = [f"""CREATE TRIGGER audit_entry_no_update BEFORE UPDATE ON {TABLE}
BEGIN SELECT RAISE(ABORT, 'audit entries are append-only (UPDATE refused)'); END"""]
SQLITE_DOWN = ["DROP TRIGGER IF EXISTS audit_entry_no_update"]


def _run(sql_by_vendor):
    def run(apps, schema_editor):
        for statement in sql_by_vendor.get(schema_editor.connection.vendor, []):
            schema_editor.execute(statement, params=None)
    return run


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]
    operations = [migrations.RunPython(_run({"postgresql": POSTGRES_UP, "sqlite": SQLITE_UP}),
                                       _run({"postgresql": POSTGRES_DOWN, "sqlite": SQLITE_DOWN}))]
