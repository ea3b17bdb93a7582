"""Usage accounting: what each request cost and how it ended.

A request that reaches a worker has its record written as it is sent there, ``running``, naming
the process that runs it; the same row is completed when the request ends. A record still
``running`` whose process has lost its lease (killed: webapp/keys/leases.py) is closed by the
reconciler (webapp/usage/reconcile.py) with the counts its worker reported. Running records are
no request yet to the totals, the roll-ups and the budgets: each counts once, when it ends.
"""

from django.conf import settings
from django.db import models
from django.utils import timezone

from webapp.billing.models import Price
from webapp.keys.models import ApiKey
from webapp.orgs.models import Organisation, Team
from webapp.registry.models import Model, ModelVersion

# The request ids of chat turns (the API's are "chatcmpl-..." and "cmpl-..."): a record with no key
# whose id starts so was a chat turn, charged to its user's ChatLimits.
CHAT_REQUEST_PREFIX = "chat-"


class UsageRecord(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running"  # sent to a worker, not ended yet
        OK = "ok"
        ERROR = "error"
        ABORTED = "aborted"  # the client went away before the end

    class Endpoint(models.TextChoices):
        CHAT_COMPLETIONS = "chat.completions"
        COMPLETIONS = "completions"
        EMBEDDINGS = "embeddings"
        MESSAGES = "messages"  # Anthropic's Messages API
        RESPONSES = "responses"  # OpenAI's Responses API

    # Links go null when the key, user or model is deleted; the record and its numbers stay.
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                             related_name="usage")
    model = models.ForeignKey(Model, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage")
    version = models.ForeignKey(ModelVersion, on_delete=models.SET_NULL, null=True, blank=True,
                                related_name="usage")
    model_name = models.CharField(max_length=200, blank=True)  # as the client asked for it
    # The API's ``user`` parameter: the caller's own end user, so an operator can trace abuse to
    # one of a key's users. Free text chosen by the client, never a link to a Pagoda account.
    end_user = models.CharField(max_length=256, blank=True, db_index=True)
    request_id = models.CharField(max_length=64, db_index=True)
    endpoint = models.CharField(max_length=32, choices=Endpoint.choices)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cached_prompt_tokens = models.PositiveIntegerField(default=0)  # served by the prefix cache
    time_to_first_token = models.FloatField(null=True, blank=True)  # seconds, as the engine measured it
    latency = models.FloatField()  # seconds, request received -> last byte produced
    status = models.CharField(max_length=16, choices=Status.choices)
    finish_reason = models.CharField(max_length=16, blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # The process that runs the request (webapp.keys.leases.process_id), while it is running.
    process_id = models.CharField(max_length=128, blank=True)
    # A team key's team and organisation, their names kept when they are deleted.
    team = models.ForeignKey(Team, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage")
    team_name = models.CharField(max_length=200, blank=True)
    organisation = models.ForeignKey(Organisation, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="usage")
    organisation_name = models.CharField(max_length=200, blank=True)
    # What it cost (webapp.billing): computed once when it ends, at the price in force when it was
    # admitted, in whole nano-units of ``currency`` ("" and 0: its model had no price).
    cost_nanos = models.BigIntegerField(default=0)
    currency = models.CharField(max_length=3, blank=True)
    price = models.ForeignKey(Price, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage")

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["api_key", "created_at"]), models.Index(fields=["model", "created_at"]),
                   # The reconciler's scan: the few running rows among every record kept.
                   models.Index(fields=["created_at"], condition=models.Q(status="running"),
                                name="usage_record_running")]

    def __str__(self) -> str:
        return f"{self.request_id} {self.model_name} {self.status}"


class UsageDaily(models.Model):
    """One day's totals (UTC) per key, user and model, summed from UsageRecord by
    webapp.usage.services.usage_rollup_day; they outlive the raw records, which are purged."""

    day = models.DateField(db_index=True)
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="daily_usage")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                             related_name="daily_usage")
    model_slug = models.CharField(max_length=200, blank=True)  # the registry slug, else the name asked for
    team_name = models.CharField(max_length=200, blank=True)
    organisation_name = models.CharField(max_length=200, blank=True)
    currency = models.CharField(max_length=3, blank=True)
    cost_nanos = models.BigIntegerField(default=0)
    requests = models.PositiveIntegerField(default=0)  # ended ones: a running record waits for its end
    errors = models.PositiveIntegerField(default=0)  # every status but ok
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    cached_prompt_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-day", "model_slug"]
        verbose_name_plural = "usage daily totals"
        constraints = [models.UniqueConstraint(
            fields=["day", "api_key", "user", "model_slug", "team_name", "organisation_name", "currency"],
            name="usage_daily_one_row_per_day_key_user_model_team_currency")]

    def __str__(self) -> str:
        return f"{self.day} {self.model_slug} {self.requests} requests"
