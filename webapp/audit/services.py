"""Writing audit entries: ``audit_record`` for a change, ``audit_denied`` for a refusal.

Call them inside the change's transaction (the entry commits or rolls back with it), except for
refusals, which must stay: call ``audit_denied`` outside any transaction that is rolled back.
``snapshot`` turns a model instance into the JSON kept as ``before`` / ``after``.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from uuid import UUID

from django.db import models

from webapp.audit.context import current
from webapp.audit.models import AuditEntry


def _json(value):
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (Decimal, UUID)):
        return str(value)
    if isinstance(value, models.Model):
        return value.pk
    if isinstance(value, (list, tuple, set)):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    return value


SECRET_FIELDS = frozenset({"key_hash", "password"})


def snapshot(instance: models.Model | None, fields: tuple[str, ...] | None = None) -> dict | None:
    """The instance's concrete field values (many-to-many as sorted ids), secrets left out."""
    if instance is None:
        return None
    values = {}
    for field in instance._meta.concrete_fields:
        if field.name in SECRET_FIELDS or (fields is not None and field.name not in fields):
            continue
        values[field.name] = _json(getattr(instance, field.attname))
    if instance.pk is not None:
        for field in instance._meta.many_to_many:
            if fields is None or field.name in fields:
                values[field.name] = sorted(getattr(instance, field.name).values_list("pk", flat=True))
    return values


def _who() -> tuple[str, int | None, str, str | None, str]:
    """(source, actor id, actor name, ip, detail) of the change being made now."""
    context = current()
    if context is None:
        return AuditEntry.Source.CODE, None, "", None, ""
    actor, ip = context.actor, None
    request = context.request
    if request is not None:
        user = getattr(request, "user", None)
        actor = user if user is not None and user.is_authenticated else None
        ip = request.META.get("REMOTE_ADDR") or None
    if actor is not None:
        return context.source, actor.pk, actor.get_username(), ip, context.detail
    return context.source, None, context.actor_label, ip, context.detail


def audit_record(*, action: str, target: models.Model | None = None, before: dict | None = None,
                 after: dict | None = None, detail: str = "", target_type: str = "",
                 target_repr: str = "") -> AuditEntry:
    source, actor_id, actor_name, ip, context_detail = _who()
    return AuditEntry.objects.create(
        source=source, actor_id=actor_id, actor_name=actor_name, ip=ip, action=action,
        target_type=target_type or (target._meta.model_name if target is not None else ""),
        target_id=str(target.pk) if target is not None and target.pk is not None else "",
        target_repr=(target_repr or (str(target) if target is not None else ""))[:300],
        before=_json(before), after=_json(after), detail="\n".join(d for d in (detail, context_detail) if d))


def audit_denied(*, action: str, target: models.Model | None = None, reason: str) -> AuditEntry:
    """A refused attempt (403): who tried what on which target, and why it was refused."""
    return audit_record(action=f"denied:{action}", target=target, detail=reason)
