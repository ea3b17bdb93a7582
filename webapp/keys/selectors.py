"""Reads of API keys: find a key by its secret, check its scope."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone

from webapp.keys.models import ApiKey
from webapp.keys.services import hash_key
from webapp.registry.models import Model


def apikey_get_usable(*, raw_key: str) -> ApiKey | None:
    """The key with this secret if it exists, is not revoked and has not expired."""
    api_key = ApiKey.objects.select_related("owner").filter(key_hash=hash_key(raw_key)).first()
    if api_key is None or api_key.is_revoked:
        return None
    if api_key.expires_at is not None and api_key.expires_at <= timezone.now():
        return None
    return api_key


def apikey_allows_model(*, api_key: ApiKey, model: Model) -> bool:
    """An empty scope means every model."""
    scoped = api_key.models.values_list("pk", flat=True)
    return not scoped or model.pk in set(scoped)


def apikey_list_for_owner(*, owner) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(owner=owner).prefetch_related("models")
