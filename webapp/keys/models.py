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

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
