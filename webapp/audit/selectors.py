"""Reads of the audit log: entries filtered by actor, action, target type, source and time."""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from webapp.audit.models import AuditEntry

FILTERS = ("actor", "action", "target_type", "source")
CSV_COLUMNS = ("at", "actor_name", "actor_id", "source", "ip", "action", "target_type", "target_id", "target_repr",
               "before", "after", "detail")


def audit_entries(*, actor: str = "", action: str = "", target_type: str = "", source: str = "",
                  since: datetime | None = None) -> QuerySet[AuditEntry]:
    entries = AuditEntry.objects.all()
    if actor:
        entries = entries.filter(actor_name=actor)
    if action:
        entries = entries.filter(action__startswith=action)
    if target_type:
        entries = entries.filter(target_type=target_type)
    if source:
        entries = entries.filter(source=source)
    if since is not None:
        entries = entries.filter(at__gte=since)
    return entries.order_by("-at", "-id")


def audit_choices() -> dict:
    """The values each filter can take, for the page's selects."""
    return {"actor": sorted(set(AuditEntry.objects.exclude(actor_name="").values_list("actor_name", flat=True))),
            "target_type": sorted(set(AuditEntry.objects.exclude(target_type="").values_list("target_type", flat=True))),
            "source": AuditEntry.Source.values}
