"""Answers outlive the page, in headless Chromium against a real Daphne serving the bundled SmolLM2:
a reload mid-answer brings the answer back and it ends complete, stored once, and the engine ran
one generation (its e2e-latency count and generated-token counter moved by one answer's worth).

Screenshots: test-artifacts/chat-reattach-*.png.
"""

from __future__ import annotations

import re
import sqlite3

import pytest
from playwright.sync_api import expect

from tests.e2e.test_chat_browser import CHROMIUM, CSP_LISTENER, MODEL, TIMEOUT_MS, ask, browser, manage  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

USERNAME, PASSWORD = "reattach-tester", "reattach-tester-pw-77"


@pytest.fixture(scope="module")
def chat_site(embedded_site):
    manage(embedded_site, "createsuperuser", "--noinput", "--username", USERNAME, "--email", "r@example.com",
           env={"DJANGO_SUPERUSER_PASSWORD": PASSWORD})
    return embedded_site


def logged_in_page(browser, site, username: str = USERNAME, password: str = PASSWORD):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.add_init_script(CSP_LISTENER)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)
    page.goto(f"{site.url}/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{site.url}/")
    expect(page.locator("#connection")).to_have_text("connected")
    page.select_option("#model", MODEL)
    return page


@pytest.fixture
def page(browser, chat_site):
    page = logged_in_page(browser, chat_site)
    yield page
    page.context.close()


def engine_counts(site) -> tuple[float, float]:
    """(requests the engine finished, tokens it generated) for the bundled model."""
    return (site.metric("pagoda:e2e_request_latency_seconds_count", model_name=MODEL) or 0.0,
            site.metric("pagoda:generation_tokens_total", model_name=MODEL) or 0.0)


def stored_answers(site, conversation: str) -> list[tuple]:
    with sqlite3.connect(site.db_path) as db:
        return db.execute("SELECT content, finish_reason, completion_tokens FROM chat_message "
                          "WHERE conversation_id = ? AND role = 'assistant'", (conversation,)).fetchall()


def test_a_reload_mid_answer_continues_the_answer_which_ends_complete_and_stored_once(page, chat_site,
                                                                                      artifacts_dir):
    requests_before, tokens_before = engine_counts(chat_site)
    ask(page, "Tell me a long story about a lighthouse keeper and the sea.", max_tokens=300)
    page.wait_for_function("() => (document.querySelector('.message.assistant.streaming .body') || {})"
                           ".textContent?.trim().length > 40")
    before_reload = page.locator(".message.assistant .body").inner_text().rstrip("▍").strip()
    conversation = page.url.rstrip("/").split("/")[-1]
    page.reload()

    # The reloaded page shows the answer so far, still being written, and the sidebar marks it.
    expect(page.locator(".message.assistant.streaming")).to_have_count(1)
    expect(page.locator(".conv.active .running-mark")).to_have_count(1)
    # the reattached stream fills the body a moment after the message appears (it was read
    # empty on a CI run): wait for the answer so far, then take it
    expect(page.locator(".message.assistant .body")).to_have_text(
        re.compile(r"^\s*" + re.escape(before_reload[:40])), use_inner_text=True)
    resumed = page.locator(".message.assistant .body").inner_text()
    assert resumed.startswith(before_reload[:40]), (before_reload, resumed)
    page.screenshot(path=str(artifacts_dir / "chat-reattach-resumed.png"))
    expect(page.locator("#stop")).to_be_hidden()
    expect(page.locator(".conv.active .running-mark")).to_have_count(0)
    final = page.locator(".message.assistant .body").inner_text()
    assert final.startswith(before_reload[:40]) and len(final) > len(before_reload)
    page.screenshot(path=str(artifacts_dir / "chat-reattach-complete.png"))

    [(content, finish_reason, completion_tokens)] = stored_answers(chat_site, conversation)
    assert finish_reason in ("stop", "length")
    page.reload()
    expect(page.locator(".message.assistant .body")).to_have_text(final)
    assert content.strip()[:40] in final
    chat_site.wait_until(lambda: engine_counts(chat_site)[0] >= requests_before + 1, "the engine's request count")
    requests_after, tokens_after = engine_counts(chat_site)
    assert requests_after == requests_before + 1  # one generation, not two
    assert tokens_after - tokens_before == completion_tokens


def test_another_tab_follows_the_answer_and_stop_there_ends_it(page, browser, chat_site, artifacts_dir):
    ask(page, "Tell me a very long story about a dragon.", max_tokens=300)
    page.wait_for_function("() => (document.querySelector('.message.assistant.streaming .body') || {})"
                           ".textContent?.trim().length > 0")
    other = logged_in_page(browser, chat_site)
    try:
        other.goto(page.url)
        expect(other.locator(".message.assistant.streaming")).to_have_count(1)
        other.click("#stop")
        expect(other.locator(".message.assistant .meta").last).to_contain_text("stopped")
        expect(page.locator(".message.assistant .meta").last).to_contain_text("stopped")
        other.screenshot(path=str(artifacts_dir / "chat-reattach-other-tab.png"))
    finally:
        other.context.close()
