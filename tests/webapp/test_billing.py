"""Prices and costs: bad prices and budgets are refused naming the field; a request's cost is
computed once, in exact decimal arithmetic, at the price in force when it was admitted, and no
later price change rewrites it; budgets in money reserve the worst case and settle the real cost,
refuse naming the level that would be exceeded, and restart each period."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone as dt_timezone
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from tests.webapp.orgs_fixtures import CACHED, INPUT, OUTPUT, member, price, served_model, team, user
from webapp.billing.budgets import period_start
from webapp.billing.models import MoneyBudget, MoneyReservation
from webapp.billing.money import NANOS, to_decimal
from webapp.billing.services import budget_set, price_set
from webapp.keys import enforcement
from webapp.keys.enforcement import LimitExceeded, limits_admit, limits_release, limits_reserve
from webapp.keys.limits import MemoryLimitStore
from webapp.keys.services import apikey_create
from webapp.usage.models import UsageRecord
from webapp.usage.services import usage_record_close

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]


@pytest.fixture(autouse=True)
def store(monkeypatch):
    store = MemoryLimitStore()
    monkeypatch.setattr(enforcement, "get_limit_store", lambda: store)
    return store


@pytest.mark.parametrize("field, value, says", [
    ("input_per_million", "-1", "zero or more"), ("input_per_million", "abc", "must be a number"),
    ("output_per_million", "NaN", "must be a number"), ("output_per_million", "Infinity", "must be a number"),
    ("cached_input_per_million", "1e400", "too large"), ("currency", "XYZ", "ISO 4217"),
    ("currency", "", "ISO 4217"), ("input_per_million", "0.0000000001", "9 decimal places")])
def test_a_bad_price_is_refused_naming_the_field(field, value, says):
    model = served_model()
    values = {"currency": "USD", "input_per_million": "1", "output_per_million": "2", **{field: value}}
    with pytest.raises(ValidationError) as refused:
        price_set(model=model, **values)
    assert list(refused.value.message_dict) == [field] and says in refused.value.message_dict[field][0]
    assert not model.prices.exists()


def test_a_price_may_not_take_effect_in_the_past():
    with pytest.raises(ValidationError) as refused:
        price_set(model=served_model(), currency="EUR", input_per_million="1", output_per_million="2",
                  effective_from=timezone.now() - timedelta(hours=1))
    assert list(refused.value.message_dict) == ["effective_from"]


@pytest.mark.parametrize("field, value", [("amount", "-5"), ("amount", "0"), ("amount", "ten"), ("amount", "nan"),
                                          ("currency", "usd1"), ("alert_percent", "150"), ("period", "hourly")])
def test_a_bad_budget_is_refused_naming_the_field(field, value):
    values = {"amount": "10", "currency": "USD", "period": "monthly", "alert_percent": 80, **{field: value}}
    with pytest.raises(ValidationError) as refused:
        budget_set(level="user", holder=user("ann"), **values)
    assert list(refused.value.message_dict) == [field]
    assert not MoneyBudget.objects.exists()


def _running(request_id: str, model, ago=timedelta(0)) -> UsageRecord:
    """A running record admitted ``ago``."""
    return UsageRecord.objects.create(request_id=request_id, endpoint="completions", status="running", latency=0.0,
                                      model=model, model_name=model.slug, created_at=timezone.now() - ago)


def _close(request_id, subject=None, prompt=1000, cached=200, completion=500):
    assert usage_record_close(request_id=request_id, subject=subject, fields=dict(
        status="ok", latency=0.1, prompt_tokens=prompt, completion_tokens=completion,
        cached_prompt_tokens=cached, time_to_first_token=None, finish_reason="stop", error_code=""))
    return UsageRecord.objects.get(request_id=request_id)


def test_a_record_costs_its_tokens_at_the_price_in_force_when_it_was_admitted_to_the_nano_unit():
    model = served_model()
    old = price(model, ago=timedelta(days=2))
    admitted_an_hour_ago = _running("r1", model, ago=timedelta(hours=1))
    new = price(model, input=Decimal("100"), output=Decimal("100"), ago=timedelta(minutes=30))

    record = _close(admitted_an_hour_ago.request_id)

    # 800 uncached at 2.50, 200 cached at 1.25, 500 out at 10.00 per million: exact in Decimal.
    expected = (800 * INPUT + 200 * CACHED + 500 * OUTPUT) / Decimal(10**6)
    assert to_decimal(record.cost_nanos) == expected == Decimal("0.00725")
    assert (record.currency, record.price_id) == ("USD", old.pk)
    assert _close(_running("r2", model).request_id).price_id == new.pk


def test_a_price_change_never_rewrites_past_spend():
    model = served_model()
    price(model)
    before = _close(_running("r1", model).request_id)
    price_set(model=model, currency="USD", input_per_million="999", output_per_million="999")

    before.refresh_from_db()
    assert to_decimal(before.cost_nanos) == Decimal("0.00725")
    assert _close(_running("r2", model).request_id).cost_nanos > before.cost_nanos * 100


def test_an_unpriced_model_costs_nothing_in_no_currency():
    record = _close(_running("r1", served_model()).request_id)
    assert (record.cost_nanos, record.currency, record.price_id) == (0, "", None)


def _budget(level, holder, amount, period="total", currency="USD"):
    return budget_set(level=level, holder=holder, amount=amount, currency=currency, period=period)


def _reserve(api_key, request_id, tokens=1000, prompt=500):
    limits_admit(subject=api_key, request_id=request_id)
    limits_reserve(subject=api_key, request_id=request_id, tokens=tokens, model_id=api_key.models_priced.pk,
                   num_prompt_tokens=prompt)


@pytest.fixture
def priced_team_key():
    model = served_model()
    price(model)
    ml = team()
    owner = member(ml, "ann")
    api_key, _ = apikey_create(owner=owner, name="k", team=ml)
    api_key.models_priced = model
    return api_key


def test_the_worst_case_is_reserved_at_every_level_and_the_real_cost_settled(priced_team_key):
    api_key = priced_team_key
    budgets = [_budget("key", api_key, "1"), _budget("user", api_key.owner, "1"),
               _budget("team", api_key.team, "1"), _budget("organisation", api_key.team.organisation, "1")]
    _reserve(api_key, "r1")  # worst: 500 prompt at 2.50 + 500 out at 10.00 per million = 0.00625
    worst = int(Decimal("0.00625") * NANOS)
    assert {b.pk: (b.spent_nanos, b.reserved_nanos) for b in MoneyBudget.objects.all()} == \
        {b.pk: (0, worst) for b in budgets}
    assert MoneyReservation.objects.filter(request_id="r1").count() == 4

    limits_release(subject=api_key, request_id="r1", tokens=700, cost_nanos=4_000_000, currency="USD")

    assert {b.pk: (b.spent_nanos, b.reserved_nanos) for b in MoneyBudget.objects.all()} == \
        {b.pk: (4_000_000, 0) for b in budgets}
    assert not MoneyReservation.objects.exists()


@pytest.mark.parametrize("level", ["key", "user", "team", "organisation"])
def test_a_request_that_could_exceed_any_level_is_refused_naming_it_and_takes_nothing(priced_team_key, level):
    api_key = priced_team_key
    holders = {"key": api_key, "user": api_key.owner, "team": api_key.team, "organisation": api_key.team.organisation}
    for other, holder in holders.items():
        _budget(other, holder, "0.01" if other == level else "100")
    _reserve(api_key, "r1")  # 0.00625 of the 0.01

    with pytest.raises(LimitExceeded) as refused:
        _reserve(api_key, "r2")

    assert refused.value.code == "budget_exhausted" and refused.value.retry_after is None
    assert f"budget of the {level} '{holders[level]}' (0.01 USD)" in refused.value.message
    assert set(MoneyReservation.objects.values_list("request_id", flat=True)) == {"r1"}
    assert set(MoneyBudget.objects.values_list("reserved_nanos", flat=True)) == {6_250_000}


def test_a_budget_in_another_currency_refuses_naming_its_level(priced_team_key):
    _budget("team", priced_team_key.team, "100", currency="EUR")
    with pytest.raises(LimitExceeded, match="priced in USD and the budget of the team 'acme / ml'"):
        _reserve(priced_team_key, "r1")


def test_a_monthly_budget_restarts_at_the_start_of_the_month(priced_team_key):
    budget = _budget("team", priced_team_key.team, "0.01", period="monthly")
    last_month = period_start("monthly", datetime.now(dt_timezone.utc)) - timedelta(days=3)
    MoneyBudget.objects.filter(pk=budget.pk).update(spent_nanos=budget.amount_nanos,
                                                    period_start=period_start("monthly", last_month))
    _reserve(priced_team_key, "r1")  # the new month has nothing spent
    budget.refresh_from_db()
    assert (budget.spent_nanos, budget.reserved_nanos) == (0, 6_250_000)
    assert budget.period_start == period_start("monthly", datetime.now(dt_timezone.utc))


def test_period_starts_are_utc_day_monday_and_first_of_month():
    moment = datetime(2026, 12, 5, 16, 30, tzinfo=dt_timezone.utc)  # a Saturday
    assert period_start("daily", moment) == datetime(2026, 12, 5, tzinfo=dt_timezone.utc)
    assert period_start("weekly", moment) == datetime(2026, 11, 30, tzinfo=dt_timezone.utc)
    assert period_start("monthly", moment) == datetime(2026, 12, 1, tzinfo=dt_timezone.utc)
    assert period_start("total", moment) is None


def test_a_reservation_of_a_dead_process_is_given_back_when_the_budget_looks_full(priced_team_key, store):
    budget = _budget("key", priced_team_key, "0.01")
    MoneyReservation.objects.create(request_id="dead", budget=budget, amount_nanos=budget.amount_nanos,
                                    created_at=timezone.now(), process_id="gone-host-1-abcd")
    MoneyBudget.objects.filter(pk=budget.pk).update(reserved_nanos=budget.amount_nanos)
    _reserve(priced_team_key, "r1")
    budget.refresh_from_db()
    assert budget.reserved_nanos == 6_250_000 and not MoneyReservation.objects.filter(request_id="dead").exists()


def test_chat_turns_count_against_their_users_budget():
    from webapp.keys.models import ChatLimits

    model = served_model()
    price(model)
    ann = user("ann")
    limits = ChatLimits.objects.create(user=ann, max_requests_per_minute=None, max_concurrent_requests=None)
    _budget("user", ann, "0.005")
    with pytest.raises(LimitExceeded, match="the user 'ann'"):
        limits_reserve(subject=limits, request_id="chat-1", tokens=1000, model_id=model.pk, num_prompt_tokens=500)


def test_a_budget_past_its_alert_threshold_shows_in_the_console_and_as_a_metric(client, priced_team_key):
    budget = _budget("team", priced_team_key.team, "0.01", period="monthly")
    quiet = _budget("key", priced_team_key, "100")
    MoneyBudget.objects.filter(pk=budget.pk).update(spent_nanos=9_000_000)  # 90% of it, alert at 80%
    client.force_login(user("root", is_staff=True))

    page = client.get("/console/budgets/").content.decode()
    metrics = client.get("/metrics").content.decode()

    assert f'data-budget="{budget.pk}" class="alerting"' in page and "over 80%" in page
    assert f'data-budget="{quiet.pk}">' in page
    labels = 'holder="acme / ml",level="team",period="monthly"'
    assert f'pagoda:budget_alert{{currency="USD",{labels}}} 1.0' in metrics
    assert f'pagoda:budget_spent_ratio{{currency="USD",{labels}}} 0.9' in metrics
    assert 'pagoda:budget_alert{currency="USD",holder="k (' in metrics and '"key",period="total"} 0.0' in metrics
