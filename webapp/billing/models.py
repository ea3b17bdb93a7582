"""Prices per model (and LoRA adapter), budgets in money and the reservations held against them.

Amounts are whole nano-units of their currency (webapp.billing.money says why).

A price is never edited: a change is a new row with the date it takes effect, and a request is
charged at the price in force when it was admitted (its usage record's created_at), computed once
when it ends and stored on the record, so no price change rewrites past spend.

A budget bounds one key, user, team or organisation, for ever or per calendar day, week (from
Monday) or month, UTC, resetting at the start of each. ``spent`` and ``reserved`` live on its row
and move by conditional UPDATEs only (webapp.billing.budgets).
"""

from django.conf import settings
from django.db import models
from django.db.models import Q

from webapp.keys.models import ApiKey
from webapp.orgs.models import Organisation, Team
from webapp.registry.models import Model


class Price(models.Model):
    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="prices")
    adapter = models.CharField(max_length=200, null=True, blank=True)  # a LoRA adapter's name; null: the base
    currency = models.CharField(max_length=3)  # ISO 4217
    input_nanos_per_million = models.BigIntegerField()
    cached_input_nanos_per_million = models.BigIntegerField()  # prompt tokens the prefix cache served
    output_nanos_per_million = models.BigIntegerField()
    effective_from = models.DateTimeField(db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model", "adapter", "-effective_from"]
        constraints = [
            models.CheckConstraint(condition=Q(input_nanos_per_million__gte=0, cached_input_nanos_per_million__gte=0,
                                               output_nanos_per_million__gte=0), name="price_not_negative")]

    def __str__(self) -> str:
        adapter = f" + {self.adapter}" if self.adapter else ""
        return f"{self.model.slug}{adapter} from {self.effective_from:%Y-%m-%d %H:%M} ({self.currency})"


class MoneyBudget(models.Model):
    class Level(models.TextChoices):
        KEY = "key"
        USER = "user"
        TEAM = "team"
        ORGANISATION = "organisation"

    class Period(models.TextChoices):
        TOTAL = "total"  # never resets
        DAILY = "daily"
        WEEKLY = "weekly"
        MONTHLY = "monthly"

    level = models.CharField(max_length=16, choices=Level.choices)
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.CASCADE, related_name="money_budgets")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="money_budgets")
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="money_budgets")
    organisation = models.ForeignKey(Organisation, null=True, blank=True, on_delete=models.CASCADE,
                                     related_name="money_budgets")
    currency = models.CharField(max_length=3)
    amount_nanos = models.BigIntegerField()
    period = models.CharField(max_length=8, choices=Period.choices, default=Period.TOTAL)
    period_start = models.DateTimeField(null=True, blank=True)  # of the period ``spent`` counts
    spent_nanos = models.BigIntegerField(default=0)
    reserved_nanos = models.BigIntegerField(default=0)  # worst cases of the requests running now
    alert_percent = models.PositiveSmallIntegerField(default=80)  # a soft alert from this share spent
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["level", "pk"]
        constraints = [
            models.CheckConstraint(condition=Q(amount_nanos__gt=0, spent_nanos__gte=0, reserved_nanos__gte=0),
                                   name="money_budget_amounts"),
            models.CheckConstraint(condition=(
                Q(level="key", api_key__isnull=False, user__isnull=True, team__isnull=True, organisation__isnull=True)
                | Q(level="user", api_key__isnull=True, user__isnull=False, team__isnull=True,
                    organisation__isnull=True)
                | Q(level="team", api_key__isnull=True, user__isnull=True, team__isnull=False,
                    organisation__isnull=True)
                | Q(level="organisation", api_key__isnull=True, user__isnull=True, team__isnull=True,
                    organisation__isnull=False)), name="money_budget_one_holder")]

    def __str__(self) -> str:
        return f"{self.get_period_display().lower()} {self.level} budget of {self.holder}"

    @property
    def holder(self):
        return {"key": self.api_key, "user": self.user, "team": self.team,
                "organisation": self.organisation}[self.level]


class MoneyReservation(models.Model):
    """The worst-case cost of one running request held against one budget until it ends."""

    request_id = models.CharField(max_length=64, db_index=True)
    budget = models.ForeignKey(MoneyBudget, on_delete=models.CASCADE, related_name="reservations")
    amount_nanos = models.BigIntegerField()
    created_at = models.DateTimeField(db_index=True)
    process_id = models.CharField(max_length=128, blank=True)  # webapp.keys.leases: who gives it back

    class Meta:
        constraints = [models.UniqueConstraint(fields=["request_id", "budget"], name="one_reservation_per_budget")]
