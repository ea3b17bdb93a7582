"""Reads of API keys and chat limits: find a key by its secret, check a key's or a chat user's model scope."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone

from webapp.keys.models import ApiKey, ChatLimits
from webapp.keys.services import hash_key
from webapp.registry.models import Adapter, Model


def apikey_get_usable(*, raw_key: str) -> ApiKey | None:
    """The key with this secret if it exists, is not revoked, has not expired and its owner is active."""
    api_key = ApiKey.objects.select_related("owner", "team__organisation").filter(key_hash=hash_key(raw_key)).first()
    if api_key is None or api_key.is_revoked or not api_key.owner.is_active:
        return None
    if api_key.expires_at is not None and api_key.expires_at <= timezone.now():
        return None
    return api_key


def apikey_allows_model(*, api_key: ApiKey, model: Model) -> bool:
    """An empty scope (no model, no adapter) means every model; a team key is within its team's
    models too."""
    scoped = set(api_key.models.values_list("pk", flat=True))
    return (model.pk in scoped or not (scoped or api_key.adapters.exists())) and _team_allows(api_key, model)


def apikey_allows_adapter(*, api_key: ApiKey, adapter: Adapter) -> bool:
    """A LoRA adapter is scoped like a model: named in the key's scope, or the scope is empty; a
    team key's adapters are those of its team's models."""
    return ((api_key.adapters.filter(pk=adapter.pk).exists()
             or not (api_key.adapters.exists() or api_key.models.exists()))
            and _team_allows(api_key, adapter.base))


def _team_allows(api_key: ApiKey, model: Model) -> bool:
    """A team's key: the team's models (none: every model). Another key: every model."""
    if api_key.team_id is None:
        return True
    scoped = set(api_key.team.models.values_list("pk", flat=True))
    return not scoped or model.pk in scoped


def apikey_list_for_owner(*, owner) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(owner=owner).prefetch_related("models")


def chatlimits_allows_model(*, limits: ChatLimits, model: Model) -> bool:
    """An empty scope means every model."""
    scoped = limits.models.values_list("pk", flat=True)
    return not scoped or model.pk in set(scoped)


def chatlimits_allowed_slugs(*, limits: ChatLimits, slugs: list[str]) -> list[str]:
    """The served models (by slug) the user may chat with, in the order given."""
    scoped = set(limits.models.values_list("slug", flat=True))
    return [slug for slug in slugs if not scoped or slug in scoped]
