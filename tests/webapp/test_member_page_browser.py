"""A member's self-service page in headless Chromium: their team's keys with last use, creating a
team key through the form (the secret shown once, within the team's limits: a request over them
is refused on the page), revoking it, their spend and the team budget's remaining amount with its
soft alert; and the staff usage page draws its spend chart. Screenshots go to test-artifacts/."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect, sync_playwright

from tests.webapp.orgs_fixtures import member, price, served_model, team
from webapp.billing.services import budget_set
from webapp.keys.models import ApiKey
from webapp.keys.services import apikey_create
from webapp.usage.models import UsageRecord
from webapp.usage.services import usage_record_close

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"


def _open(live_server, user):
    client = Client()
    client.force_login(user)
    p = sync_playwright().start()
    browser = p.chromium.launch(executable_path=CHROMIUM,
                                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}])
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.on("response", lambda r: page.errors.append(f"{r.status} {r.url}")
            if r.status >= 400 and not r.url.endswith("/favicon.ico") else None)
    return p, browser, page


@pytest.fixture
def team_with_spend():
    """ann, a member of acme / ml (60 requests a minute), with a used key, 0.0015 USD spent
    against the team's monthly 0.01 USD budget (alert at 10%)."""
    model = served_model("tiny")
    price(model)
    ml = team("ml", max_requests_per_minute=60)
    ann = member(ml, "ann")
    api_key, _ = apikey_create(owner=ann, name="notebook", team=ml)
    ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=timezone.now() - timedelta(minutes=5))
    budget_set(level="team", holder=ml, amount="0.01", currency="USD", period="monthly", alert_percent=10)
    for n in range(2):
        UsageRecord.objects.create(request_id=f"r{n}", endpoint="completions", status="running", latency=0.0,
                                   api_key=api_key, user=ann, model=model, model_name="tiny", team=ml, team_name="ml",
                                   created_at=timezone.now() - timedelta(days=n))
        usage_record_close(request_id=f"r{n}", subject=api_key, fields=dict(
            status="ok", latency=0.1, prompt_tokens=100, completion_tokens=50, cached_prompt_tokens=0,
            time_to_first_token=None, finish_reason="stop", error_code=""))
    return ann


def test_a_member_sees_spend_and_budget_creates_and_revokes_a_team_key(team_with_spend, live_server,
                                                                       artifacts_dir):
    p, browser, page = _open(live_server, team_with_spend)
    try:
        page.goto(f"{live_server.url}/account/")
        expect(page.locator("#keys tbody tr")).to_have_count(1)
        expect(page.locator("#keys tbody")).to_contain_text("notebook")
        expect(page.locator("#budgets tbody td.left")).to_have_text("0.0085 USD")
        expect(page.locator("#budgets .badge.warn")).to_have_text("over 10%")
        expect(page.locator("#total-spend")).to_have_text("0.0015 USD")
        page.screenshot(path=str(artifacts_dir / "account-member-page.png"), full_page=True)

        page.fill("#key-create input[name=name]", "too fast")
        page.fill("#key-create input[name=max_requests_per_minute]", "100")
        page.click("#key-create button.primary")
        expect(page.locator(".flash.warning")).to_contain_text("max_requests_per_minute may be at most the team's 60")

        page.fill("#key-create input[name=name]", "ci")
        page.fill("#key-create input[name=max_requests_per_minute]", "30")
        page.click("#key-create button.primary")
        expect(page.locator("#raw-key")).to_have_text(re.compile(r"^pgd-[A-Za-z0-9_-]{40,}$"))
        page.click("text=Back to your keys")
        row = page.locator("#keys tbody tr", has_text="ci")
        expect(row).to_contain_text("never")  # not used yet
        row.get_by_role("button", name="Revoke").click()
        expect(page.locator("#keys tbody tr", has_text="ci")).to_contain_text("revoked")
        page.screenshot(path=str(artifacts_dir / "account-member-page-after.png"), full_page=True)
        assert [e for e in page.errors if "/account/keys/" not in e] == []  # the refused create answered 400
    finally:
        browser.close()
        p.stop()


def test_the_staff_usage_page_draws_spend_per_day(team_with_spend, live_server, artifacts_dir):
    staff = get_user_model().objects.create_user("root", is_staff=True)
    p, browser, page = _open(live_server, staff)
    try:
        page.goto(f"{live_server.url}/console/usage/?group=team")
        expect(page.locator("#spend-chart .uplot")).to_have_count(1)
        expect(page.locator("#spend-chart .u-legend")).to_contain_text("USD")
        expect(page.locator("#usage tbody")).to_contain_text("0.0015 USD")
        page.screenshot(path=str(artifacts_dir / "console-usage-spend.png"), full_page=True)
        assert page.errors == []
    finally:
        browser.close()
        p.stop()
