"""API keys. The key itself is shown once; only its SHA-256 and a visible prefix are stored.

Why SHA-256 and not a slow password hash: a key is 256 random bits, so guessing it from the
hash is as hopeless with a fast hash as with a slow one (slow hashes exist to protect
low-entropy human passwords). A fast, unsalted digest lets every request find its key with one
indexed lookup instead of spending ~100 ms of CPU on PBKDF2/argon2 per API call.
"""

from django.conf import settings
from django.db import models as m

from webapp.registry.models import Model


class ApiKey(m.Model):  # `m`: the field below is called `models`
    name = m.CharField(max_length=200)
    owner = m.ForeignKey(settings.AUTH_USER_MODEL, on_delete=m.CASCADE, related_name="api_keys")
    prefix = m.CharField(max_length=16, db_index=True)  # shown in lists: "pgd-AbCd1234"
    key_hash = m.CharField(max_length=64, unique=True)  # sha256 hex of the whole key
    # Models the key may call; none at all means every model.
    models = m.ManyToManyField(Model, blank=True, related_name="api_keys")
    expires_at = m.DateTimeField(null=True, blank=True)
    is_revoked = m.BooleanField(default=False)
    created_at = m.DateTimeField(auto_now_add=True)
    last_used_at = m.DateTimeField(null=True, blank=True)
    # Limits enforced by the API (webapp.keys.limits); null means unlimited.
    max_requests_per_minute = m.PositiveIntegerField(null=True, blank=True)
    max_tokens_per_minute = m.PositiveIntegerField(null=True, blank=True)  # prompt + completion
    max_concurrent_requests = m.PositiveIntegerField(null=True, blank=True)
    token_budget = m.PositiveBigIntegerField(null=True, blank=True)  # lifetime prompt + completion
    # Kept on the key, not summed from usage records, which are deleted after their retention.
    tokens_used = m.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
