"""Reads for a member's own pages: their teams, the keys they see, their usage scope."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from webapp.keys.models import ApiKey
from webapp.orgs.access import MANAGERS
from webapp.orgs.models import Membership, Team


def memberships_of(*, user) -> list[Membership]:
    return list(Membership.objects.filter(user=user).select_related("team__organisation").order_by("team__name"))


def keys_seen_by(*, user) -> QuerySet[ApiKey]:
    """Their own keys and every key of their teams, newest first."""
    teams = Membership.objects.filter(user=user).values("team_id")
    return (ApiKey.objects.filter(Q(owner=user) | Q(team__in=teams)).select_related("owner", "team")
            .prefetch_related("models").order_by("-created_at"))


def managed_team_ids(*, user) -> set[int]:
    return set(Membership.objects.filter(user=user, role__in=MANAGERS).values_list("team_id", flat=True))


def usage_scope_of(*, user) -> Q:
    """The usage records a member may see: their own, and their teams' (by their team keys)."""
    teams = list(Membership.objects.filter(user=user).values_list("team_id", flat=True))
    return Q(user=user) | Q(team_id__in=teams)


def team_members(*, team: Team) -> list[Membership]:
    return list(team.memberships.select_related("user").order_by("user__username"))
