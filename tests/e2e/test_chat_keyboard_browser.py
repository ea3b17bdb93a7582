"""The chat page by keyboard alone, in headless Chromium against a real Daphne serving the bundled
SmolLM2: Tab to the settings, ask, copy the answer (Ctrl+Shift+C), answer again and move between
the versions (Alt+Shift+←/→), stop a long answer (Esc), the help overlay (?), a new chat
(Ctrl+Shift+O); every control on the page has an accessible name.
Screenshots: test-artifacts/chat-keyboard-*.png."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.e2e.test_chat_branches_browser import answered
from tests.e2e.test_chat_browser import browser, manage  # noqa: F401
from tests.e2e.test_chat_reattach_browser import logged_in_page

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

USERNAME, PASSWORD = "keyboard-tester", "keyboard-tester-pw-31"
# Every control's accessible name, as far as a page script can tell: labels, aria-label(ledby),
# its text, title or placeholder.
UNNAMED = """() => [...document.querySelectorAll('button, a[href], input, select, textarea, summary')]
  .filter((el) => el.offsetParent !== null || el.closest('dialog[open]'))
  .filter((el) => !((el.getAttribute('aria-label') || '').trim() || el.getAttribute('aria-labelledby')
                 || (el.labels && el.labels.length && el.labels[0].textContent.trim())
                 || (el.type !== 'hidden' && el.tagName !== 'TEXTAREA' && el.tagName !== 'INPUT' && el.textContent.trim())
                 || el.title || el.placeholder))
  .map((el) => el.outerHTML.slice(0, 80))"""


@pytest.fixture(scope="module")
def chat_site(embedded_site):
    manage(embedded_site, "createsuperuser", "--noinput", "--username", USERNAME, "--email", "k@example.com",
           env={"DJANGO_SUPERUSER_PASSWORD": PASSWORD})
    return embedded_site


@pytest.fixture
def page(browser, chat_site):
    page = logged_in_page(browser, chat_site, USERNAME, PASSWORD)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=chat_site.url)
    yield page
    page.context.close()


def tab_to(page, selector: str, limit: int = 60) -> None:
    """Press Tab until the focus is on ``selector``."""
    for _ in range(limit):
        if page.evaluate(f"() => document.activeElement.matches({selector!r})"):
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"Tab never reached {selector}")


def type_into(page, selector: str, text: str) -> None:
    tab_to(page, selector)
    page.keyboard.press("Control+A")
    page.keyboard.type(text)


def test_a_conversation_by_keyboard_alone(page, chat_site, artifacts_dir):
    assert page.evaluate(UNNAMED) == []
    expect(page.locator("#prompt")).to_be_focused()  # the page opens ready to type
    tab_to(page, "summary")
    page.keyboard.press("Enter")  # opens the settings
    type_into(page, "#temperature", "0")
    type_into(page, "#max-tokens", "12")
    assert page.evaluate(UNNAMED) == []
    page.keyboard.press("Escape")  # closes the settings, back on their summary
    expect(page.locator(".settings-panel")).to_be_hidden()
    expect(page.locator("summary")).to_be_focused()
    page.keyboard.press("Shift+Escape")
    expect(page.locator("#prompt")).to_be_focused()
    page.keyboard.type("Name a fruit.")
    page.keyboard.press("Enter")
    first = answered(page)

    page.keyboard.press("Control+Shift+C")
    expect(page.locator("#shortcut-status")).to_have_text("Copied the last answer.")
    assert page.evaluate("navigator.clipboard.readText()").strip() == first.strip()

    tab_to(page, ".message.assistant .regenerate")
    page.keyboard.press("Enter")
    expect(page.locator(".message.assistant .branch-count")).to_have_text("2/2")
    answered(page)
    page.keyboard.press("Alt+Shift+ArrowLeft")
    expect(page.locator(".message.assistant .branch-count")).to_have_text("1/2")
    assert page.locator(".message.assistant .body").inner_text() == first
    page.keyboard.press("Alt+Shift+ArrowRight")
    expect(page.locator(".message.assistant .branch-count")).to_have_text("2/2")
    page.screenshot(path=str(artifacts_dir / "chat-keyboard-versions.png"))

    tab_to(page, "summary")
    page.keyboard.press("Enter")
    type_into(page, "#max-tokens", "400")
    page.keyboard.press("Shift+Escape")
    expect(page.locator(".settings-panel")).to_be_hidden()
    page.keyboard.type("Tell me a very long story about a dragon.")
    page.keyboard.press("Enter")
    page.wait_for_function("() => (document.querySelector('.message.assistant.streaming .body') || {})"
                           ".textContent?.trim().length > 0")
    page.keyboard.press("Escape")
    expect(page.locator(".message.assistant .meta").last).to_contain_text("stopped")

    tab_to(page, "#send")
    page.keyboard.press("?")
    expect(page.locator("#shortcuts-help")).to_be_visible()
    assert page.evaluate(UNNAMED) == []
    page.screenshot(path=str(artifacts_dir / "chat-keyboard-help.png"))
    page.keyboard.press("Escape")
    expect(page.locator("#shortcuts-help")).to_be_hidden()

    page.keyboard.press("Control+Shift+O")
    page.wait_for_url(f"{chat_site.url}/")
    expect(page.locator(".message")).to_have_count(0)
    expect(page.locator("#prompt")).to_be_focused()
