"""Reads of sharing; a revoked or unknown link reads as missing."""

from __future__ import annotations

from django.db.models import QuerySet

from webapp.sharing.models import SharedConversation, SharingSettings


def sharing_settings_get() -> SharingSettings:
    """The site's setting (defaults while staff never saved one; nothing is written by reading)."""
    return SharingSettings.objects.filter(pk=1).first() or SharingSettings(pk=1)


def share_get_live(*, token: str) -> SharedConversation | None:
    if not token or len(token) > 64:
        return None
    return SharedConversation.objects.filter(token=token, revoked_at__isnull=True).first()


def share_get_owned(*, user, share_id: int) -> SharedConversation | None:
    return SharedConversation.objects.filter(owner=user, pk=share_id).first()


def share_list(*, user) -> QuerySet[SharedConversation]:
    return SharedConversation.objects.filter(owner=user).select_related("conversation")


def share_may_view(*, user) -> bool:
    """Logged-in users may open any live link; anonymous visitors only when staff allowed it."""
    return user.is_authenticated or sharing_settings_get().allow_anonymous
