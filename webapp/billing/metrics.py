"""Budgets as Prometheus metrics, read from the database at scrape time, for Alertmanager:
``pagoda:budget_spent_ratio`` (spent + reserved over the amount, current period) and
``pagoda:budget_alert`` (1 from the budget's alert threshold on), labelled by level and holder."""

from __future__ import annotations

import logging

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from webapp.monitoring.metrics import PREFIX, REGISTRY

logger = logging.getLogger(__name__)
LABELS = ("level", "holder", "period", "currency")


class BudgetCollector(Collector):
    def collect(self):
        from webapp.billing.selectors import budget_rows  # the ORM, once Django is ready

        ratio = GaugeMetricFamily(f"{PREFIX}budget_spent_ratio", "Share of a money budget spent or held by "
                                  "running requests in its current period.", labels=LABELS)
        alert = GaugeMetricFamily(f"{PREFIX}budget_alert", "1 when a money budget has reached its alert "
                                  "threshold (soft alert), else 0.", labels=LABELS)
        try:
            rows = budget_rows()
        except Exception:  # no database (a scrape during start-up): no budget series this time
            logger.warning("budget metrics skipped: the database could not be read", exc_info=True)
            rows = []
        for row in rows:
            labels = [row["level"], row["holder"], row["period"], row["currency"]]
            ratio.add_metric(labels, row["ratio"])
            alert.add_metric(labels, 1.0 if row["alerting"] else 0.0)
        yield ratio
        yield alert


_registered = False


def register_budget_collector() -> None:
    global _registered
    if not _registered:
        REGISTRY.register(BudgetCollector())
        _registered = True
