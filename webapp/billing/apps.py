from django.apps import AppConfig


class BillingConfig(AppConfig):
    """Prices per model, the cost of every request, and budgets in money."""

    name = "webapp.billing"
    label = "billing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from webapp.billing.metrics import register_budget_collector

        register_budget_collector()
