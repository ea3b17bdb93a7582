"""Members' self-service and a team's bounds: a member sees their own and their team's keys,
creates team keys only within the team's models and limits, revokes only what their role allows
(403 and an audit entry otherwise), sees their usage, spend and remaining budgets; GET /v1/usage
shows a key only its own; a team's models and limits bound all its keys together; deleting a team
keeps its usage."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from tests.webapp.orgs_fixtures import member, price, served_model, team, user
from webapp.audit.models import AuditEntry
from webapp.billing.services import budget_set
from webapp.keys import enforcement
from webapp.keys.enforcement import LimitExceeded, limits_admit, limits_release
from webapp.keys.limits import MemoryLimitStore
from webapp.keys.models import ApiKey
from webapp.keys.selectors import apikey_allows_model
from webapp.keys.services import apikey_create
from webapp.orgs.models import Membership
from webapp.orgs.services import team_delete
from webapp.usage.models import UsageRecord
from webapp.usage.services import usage_record_close

pytestmark = pytest.mark.django_db
KEY = re.compile(r'<code id="raw-key">(pgd-[A-Za-z0-9_-]+)</code>')


@pytest.fixture(autouse=True)
def store(monkeypatch):
    store = MemoryLimitStore()
    monkeypatch.setattr(enforcement, "get_limit_store", lambda: store)
    return store


@pytest.fixture
def ml():
    return team("ml", max_requests_per_minute=60, max_concurrent_requests=2)


def test_a_member_creates_a_team_key_within_the_teams_limits_and_sees_it_once(client, ml):
    tiny, big = served_model("tiny"), served_model("big")
    ml.models.set([tiny])
    client.force_login(member(ml, "ann"))

    created = client.post(reverse("account:key-create"), {"team": ml.pk, "name": "mine", "models": [tiny.pk],
                                                          "max_requests_per_minute": "30"})
    assert created.status_code == 200 and KEY.search(created.content.decode())
    api_key = ApiKey.objects.get()
    assert (api_key.team, api_key.owner.username, api_key.max_requests_per_minute) == (ml, "ann", 30)

    above = client.post(reverse("account:key-create"), {"team": ml.pk, "name": "big", "max_requests_per_minute": "61"})
    outside = client.post(reverse("account:key-create"), {"team": ml.pk, "name": "x", "models": [big.pk]})
    negative = client.post(reverse("account:key-create"), {"team": ml.pk, "name": "x", "max_concurrent_requests": "-1"})
    assert above.status_code == outside.status_code == negative.status_code == 400
    assert "max_requests_per_minute may be at most the team&#x27;s 60" in above.content.decode()
    assert "may not use big" in outside.content.decode()
    assert "max_concurrent_requests must be a positive integer" in negative.content.decode()
    assert ApiKey.objects.count() == 1


def test_a_key_for_a_team_one_is_not_in_is_403_and_audited(client, ml):
    other = team("search")
    client.force_login(member(ml, "ann"))
    response = client.post(reverse("account:key-create"), {"team": other.pk, "name": "sneaky"})
    assert response.status_code == 403 and not ApiKey.objects.exists()
    assert AuditEntry.objects.get().action == "denied:apikey.create"


def test_members_revoke_their_own_keys_admins_any_of_the_team(client, ml):
    ann, bob = member(ml, "ann"), member(ml, "bob")
    boss = member(ml, "boss", Membership.Role.ADMIN)
    anns, _ = apikey_create(owner=ann, name="a", team=ml)
    bobs, _ = apikey_create(owner=bob, name="b", team=ml)

    client.force_login(ann)
    page = client.get(reverse("account:home"))
    assert page.status_code == 200 and {k.pk for k in page.context["keys"]} == {anns.pk, bobs.pk}
    assert {k.pk: k.can_revoke for k in page.context["keys"]} == {anns.pk: True, bobs.pk: False}
    assert client.post(reverse("account:key-revoke", args=[bobs.pk])).status_code == 403
    assert AuditEntry.objects.filter(action="denied:apikey.revoke", actor_name="ann").count() == 1
    assert client.post(reverse("account:key-revoke", args=[anns.pk])).status_code == 302

    client.force_login(boss)
    assert client.post(reverse("account:key-revoke", args=[bobs.pk])).status_code == 302
    assert set(ApiKey.objects.values_list("is_revoked", flat=True)) == {True}


def _record(request_id, api_key, model, prompt=100, completion=50):
    UsageRecord.objects.create(request_id=request_id, endpoint="completions", status="running", latency=0.0,
                               api_key=api_key, user=api_key.owner, model=model, model_name=model.slug,
                               team=api_key.team, team_name=api_key.team.name if api_key.team else "")
    usage_record_close(request_id=request_id, subject=api_key, fields=dict(
        status="ok", latency=0.1, prompt_tokens=prompt, completion_tokens=completion, cached_prompt_tokens=0,
        time_to_first_token=None, finish_reason="stop", error_code=""))


def test_the_member_page_and_v1_usage_show_usage_spend_and_what_budgets_have_left(client, ml):
    model = served_model("tiny")
    price(model)  # 2.50 in, 10.00 out per million
    ann = member(ml, "ann")
    mine, raw = apikey_create(owner=ann, name="mine", team=ml)
    stranger, _ = apikey_create(owner=user("zed"), name="other")
    budget_set(level="team", holder=ml, amount="0.01", currency="USD", period="monthly", alert_percent=5)
    _record("r1", mine, model)  # 100 x 2.50 + 50 x 10.00 per million = 0.00075
    _record("r2", mine, model)
    _record("r3", stranger, model, prompt=10**6)

    client.force_login(ann)
    page = client.get(reverse("account:home")).content.decode()
    assert "0.0015 USD" in page and "0.0085 USD" in page  # spent, and left of the team's 0.01
    assert "over 5%" in page and "2.50" not in page  # the stranger's spend is not shown

    answer = client.get("/v1/usage", HTTP_AUTHORIZATION=f"Bearer {raw}").json()
    assert answer["totals"]["requests"] == 2 and answer["totals"]["total_tokens"] == 300
    assert answer["totals"]["spend"] == {"USD": "0.001500000"}
    assert answer["data"][0]["model"] == "tiny"
    assert [(b["level"], b["left"], b["alerting"]) for b in answer["budgets"]] == [("team", "0.008500000", True)]
    assert client.get("/v1/usage").status_code == 401
    bad = client.get("/v1/usage?days=0", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "days"
    assert client.post("/v1/usage", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 405


def test_a_teams_models_and_concurrency_bound_all_its_keys_together(ml):
    tiny, big = served_model("tiny"), served_model("big")
    ml.models.set([tiny])
    a, _ = apikey_create(owner=member(ml, "ann"), name="a", team=ml)
    b, _ = apikey_create(owner=member(ml, "bob"), name="b", team=ml)
    assert apikey_allows_model(api_key=a, model=tiny) and not apikey_allows_model(api_key=a, model=big)

    limits_admit(subject=a, request_id="1")
    limits_admit(subject=b, request_id="2")
    with pytest.raises(LimitExceeded, match="The team 'ml''s limit: Rate limit reached: 2 concurrent"):
        limits_admit(subject=a, request_id="3")
    limits_release(subject=b, request_id="2")
    limits_admit(subject=a, request_id="3")


def test_deleting_a_team_revokes_its_keys_and_keeps_its_usage_and_audit(ml):
    model = served_model("tiny")
    api_key, _ = apikey_create(owner=member(ml, "ann"), name="a", team=ml)
    _record("r1", api_key, model)
    entries = AuditEntry.objects.count()

    assert team_delete(actor=user("root", is_staff=True), team=ml) == 1

    record = UsageRecord.objects.get()
    assert (record.team_id, record.team_name) == (None, "ml")
    api_key.refresh_from_db()
    assert api_key.is_revoked and api_key.team is None
    assert AuditEntry.objects.count() == entries + 1 and AuditEntry.objects.filter(action="team.delete").exists()
