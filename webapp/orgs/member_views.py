"""Members' own pages (any logged-in user): their keys and their teams' (create a team key within
the team's models and limits, revoke what they may, see last use), their usage and spend, the
budgets that bound them; and a team's page, where its owners and admins manage its members.
Rights come from webapp.orgs.access: an attempt outside them is a 403 and an audit entry."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from webapp.billing.money import format_spend
from webapp.billing.selectors import budget_rows, budgets_of_member
from webapp.console.keys_views import LIMIT_LABELS
from webapp.console.outcome import describe, run_change
from webapp.console.views import period_of
from webapp.keys.models import ApiKey
from webapp.keys.services import TEAM_LIMIT_FIELDS, apikey_create, apikey_revoke
from webapp.orgs.access import can_make_team_key, can_manage_key, can_manage_members, can_see_team, require
from webapp.orgs.models import Membership, Team
from webapp.orgs.selectors import keys_seen_by, managed_team_ids, memberships_of, team_members, usage_scope_of
from webapp.orgs.services import membership_remove, membership_set
from webapp.registry.models import Model, ModelVersion
from webapp.usage.selectors import usage_scoped_totals_by, usage_spend_totals


def _home(request, status: int = 200):
    user = request.user
    days, since = period_of(request)
    managed = managed_team_ids(user=user)
    keys = list(keys_seen_by(user=user))
    for key in keys:
        key.can_revoke = not key.is_revoked and (key.owner_id == user.pk or key.team_id in managed)
    scope = usage_scope_of(user=user)
    usage = usage_scoped_totals_by(group="key", scope=scope, since=since)
    for row in usage:
        row["spend_text"] = format_spend(row["spend"])
    return render(request, "account/home.html", {
        "memberships": memberships_of(user=user), "keys": keys, "usage": usage, "days": days,
        "total_spend": format_spend(usage_spend_totals(since=since, scope=scope)),
        "budgets": budget_rows(budgets=budgets_of_member(user=user)), "limit_fields": [(f, LIMIT_LABELS[f]) for f in TEAM_LIMIT_FIELDS],
        "models": Model.objects.filter(versions__status=ModelVersion.Status.ACTIVE).distinct().order_by("slug"),
        "now": timezone.now(), "page": "home"}, status=status)


@login_required
@never_cache
def account_home(request):
    return _home(request)


def _limit(post, field):
    raw = (post.get(field) or "").strip()
    return int(raw) if raw.lstrip("-").isdigit() else (raw or None)


@login_required
@never_cache  # the answer to a create carries the secret
@require_POST
def key_create(request):
    post = request.POST
    team = get_object_or_404(Team, pk=post.get("team") or 0)
    require(can_make_team_key(actor=request.user, team=team), action="apikey.create", target=team,
            reason=f"{request.user} is not a member of {team}")
    days = (post.get("expires_in_days") or "").strip()
    try:
        if days and (not days.isdigit() or not 1 <= int(days) <= 36500):
            raise ValidationError({"expires_in_days": "expires_in_days must be a whole number from 1 to 36500"})
        api_key, raw_key = apikey_create(
            owner=request.user, team=team, name=post.get("name", ""),
            models=Model.objects.filter(pk__in=[v for v in post.getlist("models") if v.isdigit()]),
            expires_at=timezone.now() + timedelta(days=int(days)) if days else None,
            **{field: _limit(post, field) for field in TEAM_LIMIT_FIELDS})
    except ValidationError as error:
        messages.error(request, f"Key refused: {describe(error)}")
        return _home(request, status=400)
    return render(request, "account/key_created.html", {"api_key": api_key, "raw_key": raw_key})


@login_required
@require_POST
def key_revoke(request, key_id: int):
    api_key = get_object_or_404(ApiKey.objects.select_related("team"), pk=key_id)
    require(can_manage_key(actor=request.user, api_key=api_key), action="apikey.revoke", target=api_key,
            reason=f"{request.user} may not revoke {api_key}")
    apikey_revoke(api_key=api_key)
    messages.success(request, f"Revoked {api_key}.")
    return redirect("account:home")


def _team_page(request, team: Team, status: int = 200):
    return render(request, "account/team.html", {
        "team": team, "members": team_members(team=team), "roles": Membership.Role.values,
        "can_manage": can_manage_members(actor=request.user, team=team)}, status=status)


@login_required
def team_page(request, team_id: int):
    team = get_object_or_404(Team.objects.select_related("organisation"), pk=team_id)
    require(can_see_team(actor=request.user, team=team), action="team.view", target=team,
            reason=f"{request.user} is not a member of {team}")
    return _team_page(request, team)


@login_required
@require_POST
def member_set(request, team_id: int):
    team = get_object_or_404(Team, pk=team_id)
    username = (request.POST.get("username") or "").strip()
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        require(can_manage_members(actor=request.user, team=team), action="membership.set", target=team,
                reason=f"{request.user} manages no members of {team}")
        messages.error(request, f"Membership refused: username: no user named {username!r}")
        return _team_page(request, team, status=400)
    ok = run_change(request, lambda: membership_set(actor=request.user, team=team, user=user,
                                                    role=request.POST.get("role", "")),
                    done=f"{user} is {request.POST.get('role')} of {team.name}.", what="Membership")
    return redirect("account:team", team_id=team.pk) if ok else _team_page(request, team, status=400)


@login_required
@require_POST
def member_remove(request, team_id: int, user_id: int):
    team = get_object_or_404(Team, pk=team_id)
    user = get_object_or_404(get_user_model(), pk=user_id)
    run_change(request, lambda: membership_remove(actor=request.user, team=team, user=user),
               done=f"{user} removed from {team.name}.", what="Removing")
    return redirect("account:team", team_id=team.pk)
