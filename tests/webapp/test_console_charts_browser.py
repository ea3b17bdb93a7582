"""The console's charts in headless Chromium: the workers page draws its four uPlot charts from
metrics.json (and switches to a day), shows the empty state without samples, and the usage page
draws tokens per day. No page may raise a JavaScript error or fail a request."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect, sync_playwright

from webapp.monitoring.models import WorkerSnapshot
from webapp.usage.services import usage_record_create

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def browser_page(live_server):
    staff = get_user_model().objects.create_user("admin", password="pw", is_staff=True)
    client = Client()
    client.force_login(staff)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value,
                              "url": live_server.url}])
        page = context.new_page()
        page.errors = []
        page.on("pageerror", lambda exc: page.errors.append(str(exc)))
        page.on("response", lambda r: page.errors.append(f"{r.status} {r.url}")
                if r.status >= 400 and not r.url.endswith("/favicon.ico") else None)
        yield page
        browser.close()


def test_workers_page_shows_the_empty_state_without_samples(browser_page, live_server):
    browser_page.goto(f"{live_server.url}/console/workers/")

    expect(browser_page.locator("#charts-empty")).to_be_visible()
    expect(browser_page.locator("#charts-refreshed")).to_contain_text("updated")
    assert browser_page.locator("#metric-charts canvas").count() == 0
    assert browser_page.errors == []


@pytest.fixture
def snapshots():
    """Half an hour of samples of two workers (before the browser: Playwright runs an event loop)."""
    now = timezone.now()
    WorkerSnapshot.objects.bulk_create([
        WorkerSnapshot(taken_at=now - timedelta(seconds=10 * n), model_slug="tiny", version="1", worker_id=w,
                       tokens_per_s=5 + n % 7, num_running=n % 3, num_waiting=n % 2, kv_cache_usage=0.1 * (n % 5),
                       ttft_p50=0.05, ttft_p95=0.2, itl_p50=0.01, itl_p95=0.03)
        for n in range(180) for w in ("w1", "w2")])


@pytest.fixture
def records():
    for n, model in enumerate(("tiny", "big", "tiny")):
        usage_record_create(request_id=f"r{n}", endpoint="completions", status="ok", latency=0.1,
                            model_name=model, prompt_tokens=10, completion_tokens=5)


def test_workers_page_draws_four_charts_and_switches_to_a_day(snapshots, browser_page, live_server,
                                                              artifacts_dir):
    seen_windows = []
    browser_page.on("request", lambda r: seen_windows.append(r.url) if "metrics.json" in r.url else None)

    browser_page.goto(f"{live_server.url}/console/workers/")
    expect(browser_page.locator("#metric-charts .uplot")).to_have_count(4)
    expect(browser_page.locator("#chart-model")).to_have_value("tiny")
    expect(browser_page.locator("#charts-empty")).to_be_hidden()
    expect(browser_page.locator("#metric-charts .u-legend").first).to_contain_text("tokens/s")
    browser_page.screenshot(path=str(artifacts_dir / "console-workers-charts-1h.png"), full_page=True)
    browser_page.get_by_role("button", name="1 day").click()
    expect(browser_page.locator("#chart-window button.current")).to_have_text("1 day")
    expect(browser_page.locator("#metric-charts .uplot")).to_have_count(4)
    browser_page.wait_for_timeout(500)

    assert any("window=1d" in url and "model=tiny" in url for url in seen_windows), seen_windows
    assert browser_page.errors == []


def test_usage_page_draws_tokens_per_day(records, browser_page, live_server, artifacts_dir):
    browser_page.goto(f"{live_server.url}/console/usage/?group=model&days=7")

    expect(browser_page.locator("#usage-chart .uplot")).to_have_count(1)
    expect(browser_page.locator("#usage-chart .u-legend")).to_contain_text("total")
    browser_page.screenshot(path=str(artifacts_dir / "console-usage-chart.png"), full_page=True)
    assert browser_page.errors == []
