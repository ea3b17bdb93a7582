"""Budgets in money hold under concurrency: two keys of one team, each under its own budget,
together against the team's monthly budget, 50 requests each sent at once through the real ASGI
app to a real embedded worker. Total spend never exceeds the team's budget by more than one
request's worst case (the reservation makes it never exceed it at all), each key stays within its
own, the charged costs are the records' costs, and nothing stays reserved. Runs on SQLite here and
on PostgreSQL in `make test`'s second run (db_engine)."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from django.db.models import Sum
from django.test import AsyncClient

from tests.webapp.orgs_fixtures import member, price, team
from tests.webapp.test_key_limits import MODEL, served, worker  # noqa: F401 - fixtures: the tiny Llama served
from webapp.billing.models import MoneyBudget, MoneyReservation
from webapp.billing.money import NANOS
from webapp.billing.services import budget_set
from webapp.keys.services import apikey_create
from webapp.usage.models import UsageRecord

pytestmark = [pytest.mark.db_engine, pytest.mark.slow]

PER_KEY = 50
MAX_TOKENS = 24
# Per million tokens: 1,000 in and out, so a request of ~2 prompt + 24 completion tokens costs
# ~0.026 and reserves the same worst case: the team's 0.6 fits about 23 of the 100.
RATE = Decimal("1000")
TEAM_BUDGET, KEY_BUDGET = Decimal("0.6"), Decimal("0.4")


def _setup(model):
    price(model, input=RATE, cached=RATE, output=RATE)
    ml = team("racers")
    keys = []
    for name in ("a", "b"):
        api_key, raw = apikey_create(owner=member(ml, f"racer-{name}"), name=name, team=ml)
        budget_set(level="key", holder=api_key, amount=KEY_BUDGET, currency="USD")
        keys.append((api_key, raw))
    budget_set(level="team", holder=ml, amount=TEAM_BUDGET, currency="USD", period="monthly")
    return ml, keys


async def _burst(raw_key: str) -> list:
    client = AsyncClient()
    body = json.dumps({"model": MODEL, "prompt": "Hello there", "max_tokens": MAX_TOKENS, "temperature": 0,
                       "ignore_eos": True})
    return await asyncio.gather(*(client.post("/v1/completions", data=body, content_type="application/json",
                                              headers={"Authorization": f"Bearer {raw_key}"})
                                  for _ in range(PER_KEY)))


def _spent(**filters) -> int:
    return UsageRecord.objects.filter(**filters).aggregate(total=Sum("cost_nanos"))["total"] or 0


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_two_keys_of_one_team_never_spend_more_than_the_teams_monthly_budget(served):  # noqa: F811
    ml, ((key_a, raw_a), (key_b, raw_b)) = await sync_to_async(_setup)(served)

    responses_a, responses_b = await asyncio.gather(_burst(raw_a), _burst(raw_b))

    responses = responses_a + responses_b
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(ok) + len(refused) == 2 * PER_KEY and ok and refused
    messages = {r.json()["error"]["message"] for r in refused}
    assert {r.json()["error"]["code"] for r in refused} == {"budget_exhausted"}
    assert all("budget" in m and ("of the team 'acme / racers'" in m or "of the key " in m) for m in messages), messages

    team_budget = await sync_to_async(MoneyBudget.objects.get)(level="team")
    key_budgets = await sync_to_async(lambda: {b.api_key_id: b for b in MoneyBudget.objects.filter(level="key")})()
    total = await sync_to_async(_spent)(team=ml)
    worst = (2 + MAX_TOKENS) * RATE * NANOS / 10**6  # one request's worst case (2 prompt tokens)
    assert total <= TEAM_BUDGET * NANOS + worst
    assert total <= TEAM_BUDGET * NANOS  # the reservation is exact: not even one request over
    assert team_budget.spent_nanos == total and team_budget.reserved_nanos == 0
    for api_key in (key_a, key_b):
        spent = await sync_to_async(_spent)(api_key=api_key)
        assert spent == key_budgets[api_key.pk].spent_nanos <= KEY_BUDGET * NANOS
    assert not await sync_to_async(MoneyReservation.objects.exists)()
    print(f"\nteam budget {TEAM_BUDGET} USD: {len(ok)}/{2 * PER_KEY} served, {Decimal(total) / NANOS} USD spent")
