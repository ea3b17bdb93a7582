"""Spend adds up: the sum of the usage records' costs equals the console's totals by organisation,
team, user, key and model, and its CSV, to the nano-unit, including a day whose raw records were
rolled up and purged, with two currencies kept apart."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils import timezone

from tests.webapp.orgs_fixtures import member, price, served_model, team, user
from webapp.billing.money import to_decimal
from webapp.keys.services import apikey_create
from webapp.usage.models import UsageRecord
from webapp.usage.services import usage_purge, usage_record_close, usage_rollup_day

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]
GROUP_OF = {"organisation": "organisation_name", "team": "team_name", "user": "user", "key": "api_key",
            "model": "model_name"}


def _request(n: int, api_key, model, ago: timedelta) -> None:
    request_id = f"r{n}"
    UsageRecord.objects.create(request_id=request_id, endpoint="completions", status="running", latency=0.0,
                               api_key=api_key, user=api_key.owner, model=model, model_name=model.slug,
                               team=api_key.team, team_name=api_key.team.name if api_key.team else "",
                               organisation=api_key.team.organisation if api_key.team else None,
                               organisation_name=api_key.team.organisation.name if api_key.team else "",
                               created_at=timezone.now() - ago)
    usage_record_close(request_id=request_id, subject=api_key, fields=dict(
        status="ok", latency=0.1, prompt_tokens=37 * n + 11, completion_tokens=13 * n + 7,
        cached_prompt_tokens=(5 * n) % 23, time_to_first_token=None, finish_reason="stop", error_code=""))


@pytest.fixture
def spend():
    """Twenty-four requests over two organisations, three teams, a personal key, two models in two
    currencies; a third of them on a day 40 days ago that is rolled up and purged. Returns the
    expected spend per group and label, from the records before the purge."""
    usd, eur = served_model("usd-model"), served_model("eur-model")
    price(usd, ago=timedelta(days=60))
    price(eur, currency="EUR", input=Decimal("0.333333"), cached=Decimal("0.1"), output=Decimal("1.7"),
          ago=timedelta(days=60))
    teams = [team("ml", "acme"), team("search", "acme"), team("ops", "globex")]
    keys = [apikey_create(owner=member(t, f"{t.name}-{i}"), name=f"{t.name}-key-{i}", team=t)[0]
            for t in teams for i in range(2)]
    keys.append(apikey_create(owner=user("solo"), name="personal")[0])
    for n in range(24):
        _request(n, keys[n % len(keys)], (usd, eur)[n % 2], timedelta(days=40) if n % 3 == 0 else timedelta(hours=n))
    expected: dict[str, dict[tuple, int]] = defaultdict(lambda: defaultdict(int))
    for record in UsageRecord.objects.select_related("user", "api_key"):
        labels = {"organisation": record.organisation_name or "(none)", "team": record.team_name or "(none)",
                  "user": record.user.username, "key": f"{record.api_key.name} ({record.api_key.prefix}…)",
                  "model": record.model_name}
        for group, label in labels.items():
            expected[group][(label, record.currency)] += record.cost_nanos
    old_day = (timezone.now() - timedelta(days=40)).date()
    usage_rollup_day(day=old_day)
    assert usage_purge(older_than_days=30) == 8
    return expected


@pytest.fixture
def staff_client(client):
    client.force_login(get_user_model().objects.create_user("root", is_staff=True))
    return client


@pytest.mark.parametrize("group", list(GROUP_OF))
def test_record_costs_equal_the_console_totals_and_the_csv_at_every_level(staff_client, spend, group):
    expected = spend[group]
    totals = defaultdict(int)
    for (_, currency), nanos in expected.items():
        totals[currency] += nanos
    assert set(totals) == {"USD", "EUR"} and all(totals.values())

    page = staff_client.get(reverse("console:usage"), {"group": group, "days": 60})
    shown = {(row["label"], currency): nanos for row in page.context["rows"] for currency, nanos in row["spend"].items()}
    assert shown == dict(expected)
    assert page.context["total_spend"] == " + ".join(f"{_money(totals[c])} {c}" for c in sorted(totals))

    response = staff_client.get(reverse("console:usage-csv"), {"group": group, "days": 60})
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    in_csv = {(row[group], currency): Decimal(row[f"spend_{currency}"]) for row in rows for currency in totals
              if Decimal(row[f"spend_{currency}"])}
    assert in_csv == {key: to_decimal(nanos) for key, nanos in expected.items()}
    assert {c: sum(Decimal(row[f"spend_{c}"]) for row in rows) for c in totals} == \
        {c: to_decimal(n) for c, n in totals.items()}


def _money(nanos: int) -> str:
    whole, _, fraction = f"{to_decimal(nanos).normalize():f}".partition(".")
    return f"{whole}.{fraction.ljust(2, '0')}"
