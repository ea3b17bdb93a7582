"""Prices and money budgets in the Django admin (audited). A price is never changed or deleted
(past spend was computed from it): a new price is added with the date it takes effect."""

from django.contrib import admin

from webapp.audit.admin_mixin import AuditedAdmin
from webapp.billing.models import MoneyBudget, Price


@admin.register(Price)
class PriceAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = ("model", "adapter", "currency", "input_nanos_per_million", "cached_input_nanos_per_million",
                    "output_nanos_per_million", "effective_from")
    list_filter = ("currency", "model")

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(MoneyBudget)
class MoneyBudgetAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = ("level", "holder", "period", "currency", "amount_nanos", "spent_nanos", "reserved_nanos",
                    "alert_percent")
    list_filter = ("level", "period", "currency")
    readonly_fields = ("spent_nanos", "reserved_nanos", "period_start")
