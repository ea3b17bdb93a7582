"""Writes to API keys (create, returning the key once; revoke; limits; note use) and to chat users' limits."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from webapp.keys.models import (FAIR_SHARE_WEIGHT_DEFAULT, FAIR_SHARE_WEIGHT_MAX, FAIR_SHARE_WEIGHT_MIN, ApiKey,
                                 ChatLimits)
from webapp.audit.services import audit_record, snapshot
from webapp.orgs.models import Team
from webapp.registry.models import Adapter, Model

KEY_MARKER = "pgd-"
PREFIX_LENGTH = len(KEY_MARKER) + 8
# last_used_at is a hint, not an audit trail (usage records are): write it at most this often.
LAST_USED_RESOLUTION = timedelta(seconds=60)


LIMIT_FIELDS = ("max_requests_per_minute", "max_tokens_per_minute", "max_concurrent_requests", "token_budget")
TEAM_LIMIT_FIELDS = LIMIT_FIELDS[:3]  # a team's budgets are in money (webapp.billing)


CHAT_BOUND_FIELDS = ("max_sockets", "max_message_chars")  # never empty: a socket is always bounded


def validated_limits(limits: dict, allowed: tuple[str, ...] = LIMIT_FIELDS) -> dict:
    unknown = set(limits) - set(allowed)
    if unknown:
        raise ValidationError(f"unknown limits: {', '.join(sorted(unknown))}", code="invalid_limit")
    for name, value in limits.items():
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValidationError(f"{name} must be a positive integer or empty", code="invalid_limit")
    return limits


def _within_team(team: Team, models: list[Model], limits: dict) -> None:
    """A team key may not promise more than its team allows: each of its limits at most the
    team's, its models among the team's (the team's bounds apply to it anyway: this refuses a key
    that would only look larger)."""
    for name in TEAM_LIMIT_FIELDS:
        bound, value = getattr(team, name), limits.get(name)
        if bound is not None and value is not None and value > bound:
            raise ValidationError(f"{name} may be at most the team's {bound}", code="above_team_limit")
    allowed = set(team.models.values_list("pk", flat=True))
    outside = sorted(m.slug for m in models if allowed and m.pk not in allowed)
    if outside:
        raise ValidationError(f"models: the team {team.name!r} may not use {', '.join(outside)}",
                              code="model_not_allowed")


def _validated_weight(weight: object) -> float:
    if (isinstance(weight, bool) or not isinstance(weight, (int, float))
            or not FAIR_SHARE_WEIGHT_MIN <= weight <= FAIR_SHARE_WEIGHT_MAX):
        raise ValidationError(f"fair_share_weight must be a number from {FAIR_SHARE_WEIGHT_MIN:g} to "
                              f"{FAIR_SHARE_WEIGHT_MAX:g}", code="invalid_weight")
    return float(weight)


def hash_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


@transaction.atomic
def apikey_create(*, owner: AbstractBaseUser, name: str, models: Iterable[Model] = (),
                  adapters: Iterable[Adapter] = (), expires_at: datetime | None = None, can_set_priority: bool = False,
                  fair_share_weight: float = FAIR_SHARE_WEIGHT_DEFAULT, team: Team | None = None,
                  **limits: int | None) -> tuple[ApiKey, str]:
    """The new key and its secret, which is returned here and never again.

    ``limits``: any of LIMIT_FIELDS (None or absent: unlimited). ``can_set_priority``: the key's
    requests may ask for a scheduling priority other than 0. ``fair_share_weight``: its owner's
    weight in the engine's fair share across users. ``models`` and ``adapters`` (LoRA adapters)
    scope it; none of either: every model and adapter. ``team``: a team's key, within the team's
    limits and models (None: the owner's own).
    """
    if not name.strip():
        raise ValidationError("an API key needs a name", code="invalid_name")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError("expires_at must be in the future", code="invalid_expiry")
    models = list(models)
    limits = validated_limits(limits)
    if team is not None:
        _within_team(team, models, limits)
    raw_key = KEY_MARKER + secrets.token_urlsafe(32)  # 256 random bits
    api_key = ApiKey.objects.create(owner=owner, team=team, name=name.strip(), prefix=raw_key[:PREFIX_LENGTH],
                                    key_hash=hash_key(raw_key), expires_at=expires_at,
                                    can_set_priority=can_set_priority,
                                    fair_share_weight=_validated_weight(fair_share_weight), **limits)
    api_key.models.set(models)
    api_key.adapters.set(list(adapters))
    audit_record(action="apikey.create", target=api_key, after=snapshot(api_key))
    return api_key, raw_key


def apikey_set_limits(*, api_key: ApiKey, can_set_priority: bool | None = None,
                      fair_share_weight: float | None = None, **limits: int | None) -> ApiKey:
    """Change some of the key's limits (None: unlimited) and, if given, its right to set priority
    and its fair-share weight."""
    fields = list(validated_limits(limits))
    if api_key.team_id is not None:
        _within_team(api_key.team, [], limits)
    before = snapshot(api_key)
    if fair_share_weight is not None:
        api_key.fair_share_weight = _validated_weight(fair_share_weight)
        fields.append("fair_share_weight")
    for name, value in limits.items():
        setattr(api_key, name, value)
    if can_set_priority is not None:
        api_key.can_set_priority = bool(can_set_priority)
        fields.append("can_set_priority")
    with transaction.atomic():
        api_key.save(update_fields=fields)
        audit_record(action="apikey.limits", target=api_key, before={f: before[f] for f in fields},
                     after={f: snapshot(api_key, tuple(fields))[f] for f in fields})
    return api_key


def apikey_revoke(*, api_key: ApiKey) -> ApiKey:
    with transaction.atomic():
        was = api_key.is_revoked
        api_key.is_revoked = True
        api_key.save(update_fields=["is_revoked"])
        audit_record(action="apikey.revoke", target=api_key, before={"is_revoked": was}, after={"is_revoked": True})
    return api_key


def apikey_mark_used(*, api_key: ApiKey, now: datetime | None = None) -> None:
    now = now or timezone.now()
    if api_key.last_used_at is None or now - api_key.last_used_at >= LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now


def chatlimits_get_or_create(*, user) -> ChatLimits:
    """The user's chat limits, made with the defaults (ChatLimits' field defaults) on first use."""
    limits, _ = ChatLimits.objects.get_or_create(user=user)
    return limits


@transaction.atomic
def chatlimits_update(*, limits: ChatLimits, models: Iterable[Model] | None = None,
                      fair_share_weight: float | None = None, **values: int | None) -> ChatLimits:
    """Change a chat user's limits (LIMIT_FIELDS: None is unlimited; max_sockets and
    max_message_chars: positive integers), and if given their fair-share weight and the models
    they may use (none: every model)."""
    bounds = {name: values.pop(name) for name in CHAT_BOUND_FIELDS if name in values}
    for name, value in bounds.items():
        if not isinstance(value, int) or value < 1:
            raise ValidationError(f"{name} must be a positive integer", code="invalid_limit")
    if fair_share_weight is not None:
        bounds["fair_share_weight"] = _validated_weight(fair_share_weight)
    values = validated_limits(values)
    before = snapshot(limits)
    for name, value in {**values, **bounds}.items():
        setattr(limits, name, value)
    limits.save(update_fields=[*values, *bounds] or None)
    if models is not None:
        limits.models.set(list(models))
    audit_record(action="chatlimits.update", target=limits, before=before, after=snapshot(limits))
    return limits
