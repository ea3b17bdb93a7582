"""Writes to organisations, teams and memberships, each audited; the actor's right checked first
(webapp.orgs.access: a refusal is a PermissionDenied and an audit entry of its own)."""

from __future__ import annotations

from collections.abc import Iterable

from django.core.exceptions import ValidationError
from django.db import transaction

from webapp.audit.services import audit_record, snapshot
from webapp.keys.models import ApiKey
from webapp.keys.services import TEAM_LIMIT_FIELDS, validated_limits
from webapp.orgs.access import can_give_role, can_manage_members, is_staff, require
from webapp.orgs.models import Membership, Organisation, Team
from webapp.registry.models import Model


def _name(name: str, what: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValidationError({"name": f"a {what} needs a name"}, code="invalid_name")
    return name.strip()


def organisation_create(*, actor, name: str) -> Organisation:
    require(is_staff(actor), action="organisation.create", reason="only staff create organisations")
    name = _name(name, "organisation")
    if Organisation.objects.filter(name=name).exists():
        raise ValidationError({"name": f"an organisation named {name!r} exists"}, code="duplicate")
    with transaction.atomic():
        organisation = Organisation.objects.create(name=name)
        audit_record(action="organisation.create", target=organisation, after=snapshot(organisation))
    return organisation


def team_create(*, actor, organisation: Organisation, name: str, models: Iterable[Model] = (),
                **limits: int | None) -> Team:
    require(is_staff(actor), action="team.create", target=organisation, reason="only staff create teams")
    name = _name(name, "team")
    limits = validated_limits(limits, TEAM_LIMIT_FIELDS)
    if Team.objects.filter(organisation=organisation, name=name).exists():
        raise ValidationError({"name": f"{organisation} already has a team named {name!r}"}, code="duplicate")
    with transaction.atomic():
        team = Team.objects.create(organisation=organisation, name=name, **limits)
        team.models.set(list(models))
        audit_record(action="team.create", target=team, after=snapshot(team))
    return team


def team_update(*, actor, team: Team, models: Iterable[Model] | None = None, **limits: int | None) -> Team:
    """The team's allowed models and limits (staff: they bound the team's own admins too)."""
    require(is_staff(actor), action="team.update", target=team, reason="only staff change a team's models and limits")
    limits = validated_limits(limits, TEAM_LIMIT_FIELDS)
    with transaction.atomic():
        before = snapshot(team)
        for field, value in limits.items():
            setattr(team, field, value)
        team.save(update_fields=list(limits) or None)
        if models is not None:
            team.models.set(list(models))
        audit_record(action="team.update", target=team, before=before, after=snapshot(team))
    return team


def team_delete(*, actor, team: Team) -> int:
    """Delete the team: its keys are revoked and detached first (they stay, revoked, with their
    owners); its usage records keep its name; its memberships and budgets go. Returns the number
    of keys revoked."""
    require(is_staff(actor), action="team.delete", target=team, reason="only staff delete teams")
    with transaction.atomic():
        before = snapshot(team)
        keys = list(ApiKey.objects.filter(team=team).values_list("pk", flat=True))
        ApiKey.objects.filter(pk__in=keys).update(is_revoked=True, team=None)
        audit_record(action="team.delete", target=team, before=before,
                     after={"revoked_keys": keys}, target_repr=str(team))
        team.delete()
    return len(keys)


def membership_set(*, actor, team: Team, user, role: str) -> Membership:
    """Add ``user`` to the team with ``role``, or change their role."""
    if role not in Membership.Role.values:
        raise ValidationError({"role": f"role must be one of {', '.join(Membership.Role.values)}"}, code="invalid_role")
    current = Membership.objects.filter(team=team, user=user).first()
    require(can_manage_members(actor=actor, team=team), action="membership.set", target=team,
            reason=f"{actor} manages no members of {team}")
    require(can_give_role(actor=actor, team=team, role=role, current=current.role if current else None),
            action="membership.set", target=team,
            reason=f"{actor} may not make {user} {role} of {team}" + (f" (now {current.role})" if current else ""))
    with transaction.atomic():
        before = snapshot(current)
        if current is None:
            current = Membership.objects.create(team=team, user=user, role=role)
        else:
            current.role = role
            current.save(update_fields=["role"])
        audit_record(action="membership.set", target=current, before=before, after=snapshot(current))
    return current


def membership_remove(*, actor, team: Team, user) -> None:
    current = Membership.objects.filter(team=team, user=user).first()
    if current is None:
        raise ValidationError({"user": f"{user} is not a member of {team}"}, code="not_member")
    require(can_manage_members(actor=actor, team=team), action="membership.remove", target=team,
            reason=f"{actor} manages no members of {team}")
    require(can_give_role(actor=actor, team=team, role=Membership.Role.MEMBER, current=current.role),
            action="membership.remove", target=team, reason=f"{actor} may not remove the {current.role} {user}")
    with transaction.atomic():
        before = snapshot(current)
        audit_record(action="membership.remove", target=current, before=before, target_repr=str(current))
        current.delete()
