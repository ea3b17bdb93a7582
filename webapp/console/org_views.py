"""The console's organisations page (staff): organisations, their teams (allowed models and
limits) and the teams' members. Every change goes through webapp.orgs.services (audited)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from webapp.console.access import staff_required
from webapp.console.outcome import run_change
from webapp.keys.services import TEAM_LIMIT_FIELDS
from webapp.orgs.models import Membership, Organisation, Team
from webapp.orgs.services import (membership_remove, membership_set, organisation_create, team_create, team_delete,
                                  team_update)
from webapp.registry.models import Model


def _limits(post) -> dict:
    """The limit inputs: empty is unlimited; anything else must be a positive integer (the service
    says so, naming the field)."""
    values = {}
    for field in TEAM_LIMIT_FIELDS:
        raw = (post.get(field) or "").strip()
        values[field] = int(raw) if raw.lstrip("-").isdigit() else (raw or None)
    return values


def _models(post):
    return list(Model.objects.filter(pk__in=[v for v in post.getlist("models") if v.isdigit()]))


def _page(request, status: int = 200):
    organisations = list(Organisation.objects.prefetch_related("teams__models", "teams__memberships__user"))
    for team in (team for org in organisations for team in org.teams.all()):
        team.limit_values = [(field, getattr(team, field)) for field in TEAM_LIMIT_FIELDS]
    return render(request, "console/orgs.html", {
        "organisations": organisations, "models": Model.objects.order_by("slug"), "page": "orgs",
        "users": get_user_model().objects.order_by("username"), "roles": Membership.Role.values,
        "limit_fields": TEAM_LIMIT_FIELDS}, status=status)


@staff_required
def orgs_page(request):
    return _page(request)


def _after(request, ok: bool):
    return redirect("console:orgs") if ok else _page(request, status=400)


@staff_required
@require_POST
def organisation_add(request):
    return _after(request, run_change(request, lambda: organisation_create(actor=request.user,
                                                                           name=request.POST.get("name", "")),
                                      done="Organisation created.", what="Organisation"))


@staff_required
@require_POST
def team_add(request):
    organisation = get_object_or_404(Organisation, pk=request.POST.get("organisation") or 0)
    return _after(request, run_change(request, lambda: team_create(
        actor=request.user, organisation=organisation, name=request.POST.get("name", ""),
        models=_models(request.POST), **_limits(request.POST)), done="Team created.", what="Team"))


@staff_required
@require_POST
def team_edit(request, team_id: int):
    team = get_object_or_404(Team, pk=team_id)
    return _after(request, run_change(request, lambda: team_update(
        actor=request.user, team=team, models=_models(request.POST), **_limits(request.POST)),
        done=f"Team {team.name} saved.", what=f"Team {team.name}"))


@staff_required
@require_POST
def team_remove(request, team_id: int):
    team = get_object_or_404(Team, pk=team_id)
    return _after(request, run_change(request, lambda: team_delete(actor=request.user, team=team),
                                      done=f"Team {team.name} deleted; its keys are revoked.", what="Deleting"))


@staff_required
@require_POST
def member_set(request, team_id: int):
    team = get_object_or_404(Team, pk=team_id)
    user = get_object_or_404(get_user_model(), pk=request.POST.get("user") or 0)
    return _after(request, run_change(request, lambda: membership_set(
        actor=request.user, team=team, user=user, role=request.POST.get("role", "")),
        done=f"{user} is {request.POST.get('role')} of {team.name}.", what="Membership"))


@staff_required
@require_POST
def member_remove(request, team_id: int, user_id: int):
    team = get_object_or_404(Team, pk=team_id)
    user = get_object_or_404(get_user_model(), pk=user_id)
    return _after(request, run_change(request, lambda: membership_remove(actor=request.user, team=team, user=user),
                                      done=f"{user} removed from {team.name}.", what="Removing"))
