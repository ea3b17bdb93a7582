"""The console's keys page (staff only): list, create (the secret is shown once), revoke, edit limits,
the right to set priority and the fair-share weight; and the chat limits page: each user's chat
limits, weight and models."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from webapp.console.access import staff_required
from webapp.keys.models import (FAIR_SHARE_WEIGHT_DEFAULT, FAIR_SHARE_WEIGHT_MAX, FAIR_SHARE_WEIGHT_MIN, ApiKey,
                                 ChatLimits)
from webapp.keys.services import (LIMIT_FIELDS, apikey_create, apikey_revoke, apikey_set_limits,
                                  chatlimits_get_or_create, chatlimits_update)
from webapp.orgs.models import Team
from webapp.registry.models import Adapter, Model, ModelVersion

LIMIT_LABELS = {"max_requests_per_minute": "Requests / minute", "max_tokens_per_minute": "Tokens / minute",
                "max_concurrent_requests": "Concurrent requests", "token_budget": "Token budget"}
WEIGHT_RANGE = {"weight_min": FAIR_SHARE_WEIGHT_MIN, "weight_max": FAIR_SHARE_WEIGHT_MAX}  # the pages' inputs
# The keys table's compact limit cells use these (the full label is the input's tooltip).
LIMIT_SHORT_LABELS = {"max_requests_per_minute": "Req/min", "max_tokens_per_minute": "Tok/min",
                      "max_concurrent_requests": "Concurrent", "token_budget": "Budget"}


def _limit_field(name: str) -> forms.IntegerField:
    return forms.IntegerField(label=LIMIT_LABELS[name], required=False, min_value=1,
                              help_text="empty: unlimited")


class LimitsForm(forms.Form):
    max_requests_per_minute = _limit_field("max_requests_per_minute")
    max_tokens_per_minute = _limit_field("max_tokens_per_minute")
    max_concurrent_requests = _limit_field("max_concurrent_requests")
    token_budget = _limit_field("token_budget")
    can_set_priority = forms.BooleanField(label="May set priority", required=False,
                                          help_text="off: a request's priority other than 0 is refused (400)")
    fair_share_weight = forms.FloatField(
        label="Fair-share weight", required=False, min_value=FAIR_SHARE_WEIGHT_MIN, max_value=FAIR_SHARE_WEIGHT_MAX,
        help_text="the owner's share of the engine against other users' requests while both wait "
                  "(2: twice a user at 1); empty: 1")

    def clean_fair_share_weight(self) -> float:
        weight = self.cleaned_data["fair_share_weight"]
        return FAIR_SHARE_WEIGHT_DEFAULT if weight is None else weight


class KeyCreateForm(LimitsForm):
    name = forms.CharField(max_length=200)
    owner = forms.ModelChoiceField(queryset=get_user_model().objects.order_by("username"))
    models = forms.ModelMultipleChoiceField(
        queryset=Model.objects.filter(versions__status=ModelVersion.Status.ACTIVE).distinct().order_by("slug"),
        required=False, help_text="none selected (nor any adapter): every model")
    adapters = forms.ModelMultipleChoiceField(
        queryset=Adapter.objects.filter(is_active=True).select_related("base"), required=False,
        help_text="LoRA adapters, scoped like models (a key scoped to a model alone cannot call its adapters)")
    expires_in_days = forms.IntegerField(required=False, min_value=1, max_value=36500,
                                         help_text="empty: never expires")
    team = forms.ModelChoiceField(queryset=Team.objects.select_related("organisation"), required=False,
                                  help_text="a team's key: within its models and limits; empty: the owner's own")

    field_order = ["name", "owner", "team", "models", "adapters", "expires_in_days", *LIMIT_FIELDS, "can_set_priority",
                   "fair_share_weight"]


def _limits(form: forms.Form) -> dict:
    return {name: form.cleaned_data[name] for name in (*LIMIT_FIELDS, "can_set_priority", "fair_share_weight")}


def _key_rows() -> list[ApiKey]:
    keys = list(ApiKey.objects.select_related("owner", "team").prefetch_related("models", "adapters")
                .order_by("-created_at"))
    for key in keys:
        key.limit_values = [(f, LIMIT_LABELS[f], LIMIT_SHORT_LABELS[f], getattr(key, f)) for f in LIMIT_FIELDS]
    return keys


def _page(request, form: KeyCreateForm, status: int = 200):
    return render(request, "console/keys.html", {
        "keys": _key_rows(), "form": form, "now": timezone.now(), "page": "keys", **WEIGHT_RANGE}, status=status)


@staff_required
@never_cache  # the response to a create carries the secret
def keys_page(request):
    if request.method != "POST":
        return _page(request, KeyCreateForm())
    form = KeyCreateForm(request.POST)
    if form.is_valid():
        days = form.cleaned_data["expires_in_days"]
        try:
            api_key, raw_key = apikey_create(
                owner=form.cleaned_data["owner"], name=form.cleaned_data["name"],
                models=form.cleaned_data["models"], adapters=form.cleaned_data["adapters"],
                team=form.cleaned_data["team"],
                expires_at=timezone.now() + timedelta(days=days) if days else None, **_limits(form))
        except ValidationError as error:
            form.add_error(None, error)
        else:
            # Rendered, not redirected to: nothing can show this secret again.
            return render(request, "console/keys_created.html",
                          {"api_key": api_key, "raw_key": raw_key, "page": "keys"})
    return _page(request, form, status=400)


@staff_required
@require_POST
def key_revoke(request, key_id: int):
    api_key = apikey_revoke(api_key=get_object_or_404(ApiKey, pk=key_id))
    messages.success(request, f"Revoked {api_key}.")
    return redirect("console:keys")


@staff_required
@require_POST
def key_limits(request, key_id: int):
    api_key = get_object_or_404(ApiKey, pk=key_id)
    form = LimitsForm(request.POST)
    _save(request, form, f"Limits of {api_key}", lambda: apikey_set_limits(api_key=api_key, **_limits(form)))
    return redirect("console:keys")


def _save(request, form: forms.Form, what: str, save) -> None:
    """Run ``save`` if the form is valid, and tell the next page how it went."""
    if not form.is_valid():
        problems = "; ".join(f"{LIMIT_LABELS.get(f, f)}: {' '.join(e)}" for f, e in form.errors.items())
        messages.error(request, f"{what} not changed: {problems}")
        return
    try:
        save()
    except ValidationError as error:
        messages.error(request, f"{what} not changed: {' '.join(error.messages)}")
    else:
        messages.success(request, f"{what} saved.")


def _served_models():
    return Model.objects.filter(versions__status=ModelVersion.Status.ACTIVE).distinct().order_by("slug")


class ChatLimitsForm(LimitsForm):
    can_set_priority = None  # chat turns have no priority
    max_sockets = forms.IntegerField(label="Open chat sockets", min_value=1)
    max_message_chars = forms.IntegerField(label="Message size (characters)", min_value=1)
    models = forms.ModelMultipleChoiceField(queryset=Model.objects.order_by("slug"), required=False)


CHAT_FIELDS = (*LIMIT_FIELDS, "max_sockets", "max_message_chars")
CHAT_LABELS = {**LIMIT_SHORT_LABELS, "max_sockets": "Sockets", "max_message_chars": "Msg chars"}


@staff_required
def chat_limits_page(request):
    """Every user's chat limits (made with the defaults when first shown) and the models they may use."""
    users = list(get_user_model().objects.order_by("username"))
    existing = {limits.user_id: limits for limits in ChatLimits.objects.prefetch_related("models")}
    rows = []
    for user in users:
        limits = existing.get(user.pk) or chatlimits_get_or_create(user=user)
        allowed = {model.pk for model in limits.models.all()}
        rows.append({"user": user, "limits": limits, "allowed": allowed,
                     "values": [(f, CHAT_LABELS[f], getattr(limits, f)) for f in CHAT_FIELDS]})
    return render(request, "console/chat_limits.html", {"rows": rows, "models": _served_models(), **WEIGHT_RANGE,
                                                        "page": "chat-limits"})


@staff_required
@require_POST
def chat_limits_save(request, user_id: int):
    limits = chatlimits_get_or_create(user=get_object_or_404(get_user_model(), pk=user_id))
    form = ChatLimitsForm(request.POST)
    _save(request, form, f"Chat limits of {limits.user}", lambda: chatlimits_update(
        limits=limits, models=form.cleaned_data["models"], fair_share_weight=form.cleaned_data["fair_share_weight"],
        **{name: form.cleaned_data[name] for name in CHAT_FIELDS}))
    return redirect("console:chat-limits")
