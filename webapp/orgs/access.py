"""Who may do what in a team: staff everything; a team's owner everything in it; its admins its
members (as members) and its keys; a member their own keys of it. ``require`` refuses the rest
with PermissionDenied (a 403) after writing an audit entry saying who tried what."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied

from webapp.audit.services import audit_denied
from webapp.orgs.models import Membership, Team

Role = Membership.Role
MANAGERS = (Role.OWNER, Role.ADMIN)


def team_role(*, user, team: Team) -> str | None:
    if user is None or not user.is_authenticated:
        return None
    return Membership.objects.filter(user=user, team=team).values_list("role", flat=True).first()


def is_staff(user) -> bool:
    return user is not None and user.is_authenticated and user.is_active and user.is_staff


def can_see_team(*, actor, team: Team) -> bool:
    return is_staff(actor) or team_role(user=actor, team=team) is not None


def can_manage_members(*, actor, team: Team) -> bool:
    return is_staff(actor) or team_role(user=actor, team=team) in MANAGERS


def can_give_role(*, actor, team: Team, role: str, current: str | None) -> bool:
    """Owners (and staff) give any role; admins make and unmake members only."""
    if is_staff(actor):
        return True
    mine = team_role(user=actor, team=team)
    if mine == Role.OWNER:
        return True
    return mine == Role.ADMIN and role == Role.MEMBER and current in (None, Role.MEMBER)


def can_manage_key(*, actor, api_key) -> bool:
    """Its owner, the managers of its team, staff."""
    if is_staff(actor) or (actor is not None and api_key.owner_id == actor.pk):
        return True
    return api_key.team_id is not None and team_role(user=actor, team=api_key.team) in MANAGERS


def can_make_team_key(*, actor, team: Team) -> bool:
    return is_staff(actor) or team_role(user=actor, team=team) is not None


def require(allowed: bool, *, action: str, target=None, reason: str) -> None:
    """PermissionDenied unless ``allowed``, after auditing the attempt (call it outside any
    transaction that the refusal rolls back, or the entry goes with it)."""
    if not allowed:
        audit_denied(action=action, target=target, reason=reason)
        raise PermissionDenied(reason)
