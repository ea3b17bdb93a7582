"""Usage totals and the per-day chart series survive the roll-up and purge of old raw records:
purged days are read from UsageDaily, so the page, its CSV and the chart keep the same numbers."""

import csv
import io
import json
import re
from datetime import datetime, time, timedelta, timezone as dt_timezone

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from webapp.keys.services import apikey_create
from webapp.registry.models import Model
from webapp.usage.models import UsageDaily, UsageRecord
from webapp.usage.selectors import GROUPS, RAW_ONLY_GROUPS, usage_daily_series, usage_totals_by
from webapp.usage.services import usage_purge, usage_record_create, usage_rollup_day

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]

TODAY = timezone.now().date()
OLD_1, OLD_2, RECENT = TODAY - timedelta(days=100), TODAY - timedelta(days=95), TODAY - timedelta(days=2)


def _at(day, hour):
    return datetime.combine(day, time(hour), tzinfo=dt_timezone.utc)


@pytest.fixture
def records(settings):
    settings.PAGODA_USAGE_RETENTION_DAYS = 90
    users = [get_user_model().objects.create_user(name) for name in ("ann", "ben")]
    ann, ben = (apikey_create(owner=user, name=f"{user.username}-key")[0] for user in users)
    tiny = Model.objects.create(slug="tiny")
    rows = [  # key, when, registry model, name asked for, prompt, completion, status
        (ann, _at(OLD_1, 3), tiny, "tiny", 10, 5, "ok"),
        (ann, _at(OLD_1, 20), tiny, "tiny-alias", 4, 0, "error"),  # counted under the slug "tiny"
        (ben, _at(OLD_1, 21), None, "gone", 100, 50, "ok"),  # a model no longer in the registry
        (ben, _at(OLD_2, 0), tiny, "tiny", 1, 2, "aborted"),
        (ann, _at(RECENT, 12), tiny, "tiny", 30, 40, "ok"),
        (ben, _at(TODAY, 0), None, "gone", 7, 8, "ok"),
    ]
    for n, (key, when, model, name, prompt, completion, status) in enumerate(rows):
        record = usage_record_create(request_id=f"r{n}", endpoint="completions", status=status, latency=0.1,
                                     api_key=key, user=key.owner, model=model, model_name=name,
                                     prompt_tokens=prompt, completion_tokens=completion)
        UsageRecord.objects.filter(pk=record.pk).update(created_at=when)


def _snapshot(since):
    until = _at(TODAY + timedelta(days=1), 0)  # TODAY's end, not the clock's: a run may cross midnight
    return ({group: usage_totals_by(group=group, since=since, until=until) for group in GROUPS
             if group not in RAW_ONLY_GROUPS},
            usage_daily_series(since=since, until=until))


def _roll_up_and_purge() -> int:
    for day in (OLD_1, OLD_2, RECENT):
        usage_rollup_day(day=day)
    return usage_purge()


def test_totals_are_the_same_before_and_after_old_days_are_rolled_up_and_purged(records):
    since = _at(TODAY - timedelta(days=119), 0)
    before = _snapshot(since)

    purged = _roll_up_and_purge()
    after = _snapshot(since)

    assert purged == 4 and UsageRecord.objects.count() == 2 and UsageDaily.objects.filter(day=OLD_1).count() == 2
    assert after == before
    by_model = {r["model_name"]: (r["requests"], r["errors"], r["total_tokens"]) for r in after[0]["model"]}
    assert by_model == {"gone": (2, 0, 165), "tiny": (4, 2, 92)}  # tiny: 15 + 4 + 3 + 70
    by_key = {r["api_key__name"]: (r["requests"], r["prompt_tokens"]) for r in after[0]["key"]}
    assert by_key == {"ann-key": (3, 44), "ben-key": (3, 108)}
    assert [(r["day"], r["total_tokens"]) for r in after[0]["day"]] == [
        (TODAY, 15), (RECENT, 70), (OLD_2, 3), (OLD_1, 169)]
    series = after[1]
    assert len(series["days"]) == 120 and series["days"][0] == (TODAY - timedelta(days=119)).isoformat()
    day = {d: n for n, d in enumerate(series["days"])}
    assert series["models"]["tiny"][day[OLD_1.isoformat()]] == 19
    assert series["models"]["gone"][day[OLD_1.isoformat()]] == 150
    assert sum(series["models"]["tiny"]) == 92 and sum(series["models"]["gone"]) == 165


def test_a_purged_day_counts_only_when_it_starts_inside_the_period(records):
    _roll_up_and_purge()

    from_old_2 = usage_totals_by(group="day", since=_at(OLD_2, 0))
    mid_old_1 = usage_totals_by(group="day", since=_at(OLD_1, 12), until=_at(OLD_2, 0))

    assert [r["day"] for r in from_old_2] == [TODAY, RECENT, OLD_2]
    assert mid_old_1 == []  # OLD_1's raw records are gone and its roll-up cannot be split


def test_page_csv_and_chart_agree_after_the_purge(client, records):
    _roll_up_and_purge()
    client.force_login(get_user_model().objects.create_user("root", is_staff=True))

    page = client.get("/console/usage/?group=model&days=120").content.decode()
    table = list(csv.reader(io.StringIO(client.get("/console/usage.csv?group=model&days=120").content.decode())))
    body = page.split('<table class="grid" id="usage">')[1].split("</table>")[0].split("<tbody>")[1]
    cells = [re.findall(r"<td>([^<]*)</td>", row) for row in body.split("</tr>") if "<td>" in row]
    series = json.loads(re.search(r'id="usage-series-data"[^>]*>(.*?)</script>', page, re.S).group(1))

    assert table[1:] == [["gone", "2", "0", "107", "58", "0", "165", "0"], ["tiny", "4", "2", "45", "47", "0", "92", "0"]]
    assert cells == table[1:]
    assert {name: sum(tokens) for name, tokens in series["models"].items()} == {"gone": 165, "tiny": 92}
    assert 'id="usage-chart"' in page and "vendor/uplot/uPlot.iife.min.js" in page


def _end_user_records(tiny):
    """Three requests naming their end user, on top of ``records``' six that name none."""
    for n, (end_user, when, prompt, completion, status) in enumerate([
            ("alice", _at(RECENT, 13), 5, 5, "ok"), ("alice", _at(RECENT, 14), 2, 3, "error"),
            ("bob", _at(OLD_1, 5), 50, 50, "ok")]):  # bob's day is purged below
        record = usage_record_create(request_id=f"e{n}", endpoint="completions", status=status, latency=0.1,
                                     model=tiny, model_name="tiny", end_user=end_user,
                                     prompt_tokens=prompt, completion_tokens=completion)
        UsageRecord.objects.filter(pk=record.pk).update(created_at=when)


def _by_end_user(since):
    return [(r["end_user"], r["requests"], r["errors"], r["total_tokens"])
            for r in usage_totals_by(group="end_user", since=since)]


def test_totals_by_end_user_count_raw_records_only(records):
    _end_user_records(Model.objects.get(slug="tiny"))
    since = _at(TODAY - timedelta(days=119), 0)

    before = _by_end_user(since)
    tokens_by_model_before = sum(r["total_tokens"] for r in usage_totals_by(group="model", since=since))
    _roll_up_and_purge()
    after = _by_end_user(since)
    tokens_by_model_after = sum(r["total_tokens"] for r in usage_totals_by(group="model", since=since))

    # "": the six records without one: 15 + 4 + 150 + 3 + 70 + 15 tokens, errors: r1 (error) and r3 (aborted)
    assert before == [("", 6, 2, 257), ("bob", 1, 0, 100), ("alice", 2, 1, 15)]
    # After the purge only RECENT and TODAY keep raw records: "" has r4 (70) and r5 (15); bob is gone.
    assert after == [("", 2, 0, 85), ("alice", 2, 1, 15)]
    # Grouped by model, the purged days still count through UsageDaily: 257 + 100 + 15.
    assert tokens_by_model_before == tokens_by_model_after == 372


def test_usage_page_groups_by_end_user_and_says_purged_days_are_left_out(client, records):
    _end_user_records(Model.objects.get(slug="tiny"))
    client.force_login(get_user_model().objects.create_user("root", is_staff=True))

    page = client.get("/console/usage/?group=end_user&days=120").content.decode()
    by_model = client.get("/console/usage/?group=model&days=120").content.decode()
    table = list(csv.reader(io.StringIO(
        client.get("/console/usage.csv?group=end_user&days=120").content.decode())))
    body = page.split('<table class="grid" id="usage">')[1].split("</table>")[0].split("<tbody>")[1]
    cells = [re.findall(r"<td>([^<]*)</td>", row) for row in body.split("</tr>") if "<td>" in row]

    assert "<th>End user</th>" in page and 'id="raw-only"' in page and 'id="raw-only"' not in by_model
    assert table[0][0] == "end_user"
    # "(none)": prompts 10 + 4 + 100 + 1 + 30 + 7, completions 5 + 0 + 50 + 2 + 40 + 8
    assert table[1:] == cells == [["(none)", "6", "2", "152", "105", "0", "257", "0"],
                                  ["bob", "1", "0", "50", "50", "0", "100", "0"],
                                  ["alice", "2", "1", "7", "8", "0", "15", "0"]]
