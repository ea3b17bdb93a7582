"""API keys, chat users' limits, and the token reservations both hold against their budgets.

API keys: the key itself is shown once; only its SHA-256 and a visible prefix are stored.

Why SHA-256 and not a slow password hash: a key is 256 random bits, so guessing it from the
hash is as hopeless with a fast hash as with a slow one (slow hashes exist to protect
low-entropy human passwords). A fast, unsalted digest lets every request find its key with one
indexed lookup instead of spending ~100 ms of CPU on PBKDF2/argon2 per API call.
"""

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models as m

from webapp.orgs.models import Team
from webapp.registry.models import Adapter, Model

# The engine's fair share across users (engine/tenancy.py): a user whose key (or chat limits) has
# weight 2 gets twice the tokens of a user at 1 while both have requests waiting. Staff may set
# it within this range; 1 for everyone is an equal share.
FAIR_SHARE_WEIGHT_DEFAULT = 1.0
FAIR_SHARE_WEIGHT_MIN = 0.1
FAIR_SHARE_WEIGHT_MAX = 100.0


def fair_share_weight_field() -> m.FloatField:
    return m.FloatField(default=FAIR_SHARE_WEIGHT_DEFAULT, validators=[
        MinValueValidator(FAIR_SHARE_WEIGHT_MIN), MaxValueValidator(FAIR_SHARE_WEIGHT_MAX)])


class ApiKey(m.Model):  # `m`: the field below is called `models`
    name = m.CharField(max_length=200)
    owner = m.ForeignKey(settings.AUTH_USER_MODEL, on_delete=m.CASCADE, related_name="api_keys")
    # A team's key (its owner is who made it): the team's models, limits and budgets bound it too.
    # None: the owner's own key. PROTECT: webapp.orgs.services.team_delete revokes and detaches first.
    team = m.ForeignKey(Team, on_delete=m.PROTECT, null=True, blank=True, related_name="api_keys")
    prefix = m.CharField(max_length=16, db_index=True)  # shown in lists: "pgd-AbCd1234"
    key_hash = m.CharField(max_length=64, unique=True)  # sha256 hex of the whole key
    # Models and LoRA adapters the key may call; none of either means every model and adapter.
    models = m.ManyToManyField(Model, blank=True, related_name="api_keys")
    adapters = m.ManyToManyField(Adapter, blank=True, related_name="api_keys")
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
    # Worst cases of the requests running now (TokenReservation rows), held against token_budget.
    tokens_reserved = m.PositiveBigIntegerField(default=0)
    # Without it a request's `priority` other than 0 is refused (400 naming `priority`).
    can_set_priority = m.BooleanField(default=False)
    # The owner's weight in the engine's fair share (the tenant is the owner, "user:<id>": a user's
    # keys and chat share one share, at the weight of the latest request).
    fair_share_weight = fair_share_weight_field()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def counter_name(self) -> str:
        # By hash, not pk: a pk may be reused after a delete (SQLite), and the counters must not be.
        return self.key_hash[:24]


# Defaults for a chat user nobody has configured: the page works as it always did for one person
# (every model, no token limit), while one account cannot open unbounded sockets or requests.
CHAT_DEFAULT_REQUESTS_PER_MINUTE = 60
CHAT_DEFAULT_CONCURRENT_REQUESTS = 2
CHAT_DEFAULT_MAX_SOCKETS = 4
CHAT_DEFAULT_MAX_MESSAGE_CHARS = 32_000


class ChatLimits(m.Model):
    """One user's limits on the chat page, the same kinds as an API key's (enforced by the same
    code, webapp.keys.enforcement), plus the WebSocket's bounds. Made with the defaults the first
    time the user chats; staff edit it in the console."""

    user = m.OneToOneField(settings.AUTH_USER_MODEL, on_delete=m.CASCADE, related_name="chat_limits")
    counter_id = m.UUIDField(default=uuid.uuid4, unique=True, editable=False)  # names its rate counters
    # Models the user may chat with; none at all means every model.
    models = m.ManyToManyField(Model, blank=True, related_name="chat_limits")
    max_requests_per_minute = m.PositiveIntegerField(null=True, blank=True, default=CHAT_DEFAULT_REQUESTS_PER_MINUTE)
    max_tokens_per_minute = m.PositiveIntegerField(null=True, blank=True)
    max_concurrent_requests = m.PositiveIntegerField(null=True, blank=True,
                                                     default=CHAT_DEFAULT_CONCURRENT_REQUESTS)
    token_budget = m.PositiveBigIntegerField(null=True, blank=True)
    tokens_used = m.PositiveBigIntegerField(default=0)
    tokens_reserved = m.PositiveBigIntegerField(default=0)
    max_sockets = m.PositiveIntegerField(default=CHAT_DEFAULT_MAX_SOCKETS)  # open chat WebSockets
    max_message_chars = m.PositiveIntegerField(default=CHAT_DEFAULT_MAX_MESSAGE_CHARS)  # message / system prompt
    fair_share_weight = fair_share_weight_field()  # the user's chat turns' weight, as an API key's

    class Meta:
        verbose_name = "chat limits"
        verbose_name_plural = "chat limits"

    def __str__(self) -> str:
        return f"chat limits of {self.user}"

    @property
    def counter_name(self) -> str:
        return f"chat:{self.counter_id.hex}"


class TokenReservation(m.Model):
    """The worst case of one running request, held against its key's or user's token budget until
    the request ends (then its real count is charged). A process that dies leaves its row behind:
    rows of a process without a lease, or older than limits.SLOT_TTL_S, are given back the next
    time the budget looks full."""

    request_id = m.CharField(max_length=64, unique=True)
    tokens = m.PositiveBigIntegerField()
    api_key = m.ForeignKey(ApiKey, null=True, blank=True, on_delete=m.CASCADE, related_name="reservations")
    chat_limits = m.ForeignKey(ChatLimits, null=True, blank=True, on_delete=m.CASCADE, related_name="reservations")
    created_at = m.DateTimeField(db_index=True)
    process_id = m.CharField(max_length=128, blank=True)  # webapp.keys.leases: who gives it back
