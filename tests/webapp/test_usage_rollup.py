"""Daily roll-ups sum the raw records exactly, re-running changes nothing, and the purge drops
only old records whose day is rolled up, keeping the daily totals."""

from datetime import date, datetime, timedelta, timezone as dt_timezone

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from webapp.keys.services import apikey_create
from webapp.usage.models import UsageDaily, UsageRecord
from webapp.usage.services import usage_purge, usage_record_create, usage_rollup_day
from webapp.usage.tasks import usage_purge_expired, usage_rollup_yesterday

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]

DAY_1, DAY_2 = date(2026, 3, 10), date(2026, 3, 11)


def _at(day: date, hour: int, minute: int = 0) -> datetime:
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=dt_timezone.utc)


def _record(n: int, *, key, created_at, model_name="tiny", prompt=0, completion=0, cached=0, status="ok"):
    record = usage_record_create(request_id=f"r{n}", endpoint="completions", status=status, latency=0.1,
                                 api_key=key, user=key.owner if key else None, model_name=model_name,
                                 prompt_tokens=prompt, completion_tokens=completion, cached_prompt_tokens=cached)
    UsageRecord.objects.filter(pk=record.pk).update(created_at=created_at)
    return record


@pytest.fixture
def keys():
    users = [get_user_model().objects.create_user(name) for name in ("ann", "ben")]
    return [apikey_create(owner=user, name=f"{user.username}-key")[0] for user in users]


@pytest.fixture
def records(keys):
    ann, ben = keys
    rows = [  # key, when, model, prompt, completion, cached, status
        (ann, _at(DAY_1, 0, 0), "tiny", 10, 5, 4, "ok"),
        (ann, _at(DAY_1, 12), "tiny", 20, 7, 0, "error"),
        (ann, _at(DAY_1, 23, 59), "big", 3, 1, 0, "ok"),
        (ben, _at(DAY_1, 8), "tiny", 100, 50, 64, "ok"),
        (ann, _at(DAY_2, 0, 0), "tiny", 1, 2, 0, "aborted"),  # midnight belongs to the new day
        (ben, _at(DAY_2, 9), "tiny", 30, 40, 16, "ok"),
        (ben, _at(DAY_2, 10), "tiny", 5, 6, 0, "ok"),
    ]
    for n, (key, when, model, prompt, completion, cached, status) in enumerate(rows):
        _record(n, key=key, created_at=when, model_name=model, prompt=prompt, completion=completion,
                cached=cached, status=status)
    return keys


def _rows(day: date) -> dict:
    return {(row.api_key.name, row.user.username, row.model_slug):
            (row.requests, row.errors, row.prompt_tokens, row.completion_tokens, row.cached_prompt_tokens)
            for row in UsageDaily.objects.filter(day=day).select_related("api_key", "user")}


def test_rollup_sums_each_key_and_model_of_the_day_only(records):
    usage_rollup_day(day=DAY_1)
    usage_rollup_day(day=DAY_2)

    assert _rows(DAY_1) == {
        ("ann-key", "ann", "tiny"): (2, 1, 30, 12, 4),
        ("ann-key", "ann", "big"): (1, 0, 3, 1, 0),
        ("ben-key", "ben", "tiny"): (1, 0, 100, 50, 64),
    }
    assert _rows(DAY_2) == {
        ("ann-key", "ann", "tiny"): (1, 1, 1, 2, 0),
        ("ben-key", "ben", "tiny"): (2, 0, 35, 46, 16),
    }


def test_rollup_rerun_gives_the_same_rows_and_picks_up_late_records(records):
    usage_rollup_day(day=DAY_1)
    first = _rows(DAY_1)

    usage_rollup_day(day=DAY_1)
    assert _rows(DAY_1) == first and UsageDaily.objects.filter(day=DAY_1).count() == 3

    _record(99, key=records[1], created_at=_at(DAY_1, 22), prompt=1, completion=1)
    usage_rollup_day(day=DAY_1)
    assert _rows(DAY_1)[("ben-key", "ben", "tiny")] == (2, 0, 101, 51, 64)


def test_rollup_uses_the_registry_slug_when_the_record_has_a_model(keys):
    from webapp.registry.models import Model

    model = Model.objects.create(slug="smollm2")
    record = _record(1, key=keys[0], created_at=_at(DAY_1, 5), model_name="SmolLM2-alias", prompt=2)
    UsageRecord.objects.filter(pk=record.pk).update(model=model)

    usage_rollup_day(day=DAY_1)

    assert list(UsageDaily.objects.values_list("model_slug", "prompt_tokens")) == [("smollm2", 2)]


def test_purge_deletes_only_old_rolled_up_days_and_keeps_daily_totals(records):
    usage_rollup_day(day=DAY_1)  # DAY_2 is old too but not rolled up
    today = DAY_2 + timedelta(days=30)
    recent = _record(50, key=records[0], created_at=_at(today - timedelta(days=5), 12), prompt=7)
    usage_rollup_day(day=today - timedelta(days=5))

    deleted = usage_purge(older_than_days=10, today=today)

    assert deleted == 4
    assert not UsageRecord.objects.filter(created_at__lt=_at(DAY_2, 0)).exists()
    assert UsageRecord.objects.filter(created_at__gte=_at(DAY_2, 0), created_at__lt=_at(DAY_2, 0) + timedelta(days=1)).count() == 3
    assert UsageRecord.objects.filter(pk=recent.pk).exists()  # inside the retention
    assert _rows(DAY_1)[("ben-key", "ben", "tiny")] == (1, 0, 100, 50, 64)
    usage_rollup_day(day=DAY_1)  # nothing raw left: the totals stay rather than vanish
    assert sum(row.requests for row in UsageDaily.objects.filter(day=DAY_1)) == 4


def test_purge_keeps_a_day_that_changed_after_its_rollup(records):
    usage_rollup_day(day=DAY_1)
    _record(60, key=records[0], created_at=_at(DAY_1, 6), prompt=1)

    assert usage_purge(older_than_days=10, today=DAY_2 + timedelta(days=30)) == 0
    assert UsageRecord.objects.filter(created_at__lt=_at(DAY_2, 0)).count() == 5


def test_purge_refuses_a_retention_below_one_day():
    with pytest.raises(ValidationError):
        usage_purge(older_than_days=0)


def test_daily_tasks_roll_up_yesterday_and_purge_past_the_retention_setting(keys):
    from django.utils import timezone

    now = timezone.now()
    yesterday = now.date() - timedelta(days=1)
    _record(1, key=keys[0], created_at=_at(yesterday, 13), prompt=3, completion=4)
    long_ago = now.date() - timedelta(days=settings.PAGODA_USAGE_RETENTION_DAYS + 2)
    _record(2, key=keys[1], created_at=_at(long_ago, 13), prompt=9)
    usage_rollup_day(day=long_ago)

    assert usage_rollup_yesterday.delay().get() == 1
    assert usage_purge_expired.delay().get() == 1

    assert list(UsageRecord.objects.values_list("request_id", flat=True)) == ["r1"]
    assert set(UsageDaily.objects.values_list("day", "prompt_tokens")) == {(yesterday, 3), (long_ago, 9)}


def test_beat_schedule_runs_both_jobs():
    tasks = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"usage.rollup_yesterday", "usage.purge_expired"} <= tasks
