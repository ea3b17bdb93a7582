"""Reads of API keys and chat limits: find a key by its secret, check a key's or a chat user's model scope."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone

from webapp.keys.models import ApiKey, ChatLimits
from webapp.keys.services import hash_key
from webapp.registry.models import Model


def apikey_get_usable(*, raw_key: str) -> ApiKey | None:
    """The key with this secret if it exists, is not revoked, has not expired and its owner is active."""
    api_key = ApiKey.objects.select_related("owner", "team__organisation").filter(key_hash=hash_key(raw_key)).first()
    if api_key is None or api_key.is_revoked or not api_key.owner.is_active:
        return None
    if api_key.expires_at is not None and api_key.expires_at <= timezone.now():
        return None
    return api_key


def apikey_allows_model(*, api_key: ApiKey, model: Model) -> bool:
    """An empty scope means every model; a team key is within its team's scope too."""
    scopes = [api_key.models] + ([api_key.team.models] if api_key.team_id is not None else [])
    for scope in scopes:
        scoped = set(scope.values_list("pk", flat=True))
        if scoped and model.pk not in scoped:
            return False
    return True


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
