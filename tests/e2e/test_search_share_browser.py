"""Search and share links in headless Chromium against a real Daphne serving the bundled SmolLM2.

Four conversations are held through the chat page itself (the bundled model answers), so the
search index is fed by the chat app's real writes; the oldest one is then found from the sidebar,
shared, opened without an account (staff allowed it), and revoked. Screenshots land in
test-artifacts/search-*.png and share-*.png.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
USERNAME, PASSWORD = "search-tester", "search-tester-pw-73"
MODEL = "smollm2"
TIMEOUT_MS = 120_000
WORD = "quillonette"  # the word only the oldest conversation has
PROMPTS = [f"My pet albatross is called {WORD}. Say hi to her.", "Name a colour.", "Name a fruit.", "Name a city."]
HOSTILE_ANSWER = ("Here you go:\n\n<img src=x onerror=alert(1)>\n\n<script>alert(2)</script>\n\n"
                  "[click](javascript:alert(3))\n\n```python\nprint('hi')\n```\n")
CSP_LISTENER = """window.__csp = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__csp.push(`${e.effectiveDirective} ${e.blockedURI}`));"""


def manage(site, *args: str, env: dict | None = None) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env={**site.env, **(env or {})},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def site(embedded_site):
    manage(embedded_site, "createsuperuser", "--noinput", "--username", USERNAME, "--email", "s@example.com",
           env={"DJANGO_SUPERUSER_PASSWORD": PASSWORD})
    return embedded_site


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield browser
        browser.close()


def new_page(browser):
    """A page that records dialogs (an alert would mean injected script), CSP refusals and WebSockets."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.add_init_script(CSP_LISTENER)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.dialogs, page.sockets = [], []
    page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
    page.on("websocket", lambda ws: page.sockets.append(ws.url))
    return page


@pytest.fixture(scope="module")
def user_page(browser, site):
    expect.set_options(timeout=TIMEOUT_MS)  # answers take seconds on two shared CPU cores
    page = new_page(browser)
    page.goto(f"{site.url}/accounts/login/")
    page.fill("#id_username", USERNAME)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{site.url}/")
    yield page
    page.context.close()


def chat(page, site, text: str) -> int:
    """A new conversation through the chat page: one question, a short answer; its id."""
    page.goto(f"{site.url}/")
    expect(page.locator("#connection")).to_have_text("connected")
    page.select_option("#model", MODEL)
    page.click("summary")
    page.fill("#max-tokens", "8")
    page.fill("#temperature", "0")
    page.click("summary")
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    page.wait_for_url(re.compile(r"/c/\d+/$"))
    expect(page.locator(".message.assistant .meta")).to_contain_text("tokens")
    return int(re.search(r"/c/(\d+)/", page.url).group(1))


def test_search_finds_the_oldest_conversation_and_opens_its_message(user_page, site, artifacts_dir):
    page = user_page
    ids = [chat(page, site, prompt) for prompt in PROMPTS]
    oldest = ids[0]
    expect(page.locator("#conversation-list .conv")).to_have_count(len(PROMPTS))

    page.fill("#sidebar-search", WORD[:7])  # half a word already finds it
    dropdown = page.locator("#search-dropdown")
    expect(dropdown.locator("a")).to_have_count(1)
    expect(dropdown.locator("mark")).to_have_text(re.compile(WORD, re.I))
    expect(dropdown.locator(".result-title")).to_contain_text("albatross")
    page.screenshot(path=str(artifacts_dir / "search-dropdown.png"))

    dropdown.locator("a").click()
    page.wait_for_url(re.compile(rf"/c/{oldest}/#message-\d+$"))
    message_id = re.search(r"#message-(\d+)$", page.url).group(1)
    target = page.locator(f'#messages .message[data-id="{message_id}"]')
    expect(target).to_have_class(re.compile(r"\bsearch-target\b"))
    expect(target.locator(".body")).to_contain_text(WORD)
    expect(target).to_be_in_viewport()
    page.screenshot(path=str(artifacts_dir / "search-opened-message.png"))

    page.fill("#sidebar-search", f"{WORD} AND OR NOT * \"")  # operators are words: nothing matches, no error
    page.press("#sidebar-search", "Enter")
    expect(page.locator("#result-count")).to_contain_text("0 results")
    page.fill("input[name=q]", WORD)
    page.press("input[name=q]", "Enter")
    expect(page.locator(".search-result")).to_have_count(1)
    expect(page.locator(".search-result a")).to_have_attribute("href", f"/c/{oldest}/#message-{message_id}")
    page.screenshot(path=str(artifacts_dir / "search-results-page.png"))
    assert page.dialogs == [] and page.evaluate("window.__csp") == []


def test_a_shared_link_is_read_only_without_a_socket_and_revoking_it_makes_it_404(user_page, browser, site,
                                                                                  artifacts_dir):
    page = user_page
    conversation = manage(site, "shell", "-c", (
        "from django.contrib.auth import get_user_model; from webapp.chat.models import Conversation, Message; "
        f"c = Conversation.objects.create(user=get_user_model().objects.get(username={USERNAME!r}), title='hostile'); "
        "Message.objects.create(conversation=c, role='user', content='<b>not bold</b> please'); "
        f"Message.objects.create(conversation=c, role='assistant', content={HOSTILE_ANSWER!r}); print(c.pk)")).split()[-1]
    page.goto(f"{site.url}/c/{conversation}/")
    page.click("#share-button")
    page.wait_for_url(re.compile(r"/shared/\?created=\d+$"))
    row = page.locator(".share-row.new")
    expect(row).to_contain_text("hostile")
    url = row.locator(".share-url").input_value()
    assert re.fullmatch(rf"{re.escape(site.url)}/s/[A-Za-z0-9_-]{{40,}}/", url)
    page.screenshot(path=str(artifacts_dir / "share-list.png"))

    anonymous = new_page(browser)
    anonymous.goto(url)
    assert "/accounts/login/" in anonymous.url  # staff have not opened links to visitors yet

    page.goto(f"{site.url}/shared/settings")
    page.check("input[name=allow_anonymous]")
    page.click("form.sharing-settings button[type=submit]")  # the console's top bar has Log out
    expect(page.locator("input[name=allow_anonymous]")).to_be_checked()
    page.screenshot(path=str(artifacts_dir / "share-settings.png"))

    response = anonymous.goto(url)
    assert response.status == 200
    messages = anonymous.locator("#messages .message")
    expect(messages).to_have_count(2)
    expect(messages.first.locator(".body")).to_have_text("<b>not bold</b> please")
    answer = messages.last.locator(".body")
    expect(answer).to_contain_text("Here you go")
    expect(answer.locator("pre code [class^=hljs-]").first).to_be_visible()  # Markdown, highlighted
    assert anonymous.locator("#messages img, #messages script, #messages a[href^='javascript']").count() == 0
    assert anonymous.locator("input, textarea, select, form, [contenteditable]").count() == 0
    anonymous.wait_for_timeout(500)  # a socket or an injected onerror would have shown by now
    assert anonymous.sockets == [] and anonymous.dialogs == []
    assert anonymous.evaluate("window.__csp") == []
    anonymous.screenshot(path=str(artifacts_dir / "share-anonymous-view.png"), full_page=True)

    page.goto(f"{site.url}/shared/")
    page.locator(".share-row").filter(has_text="hostile").locator("button.revoke").click()
    expect(page.locator(".share-row").filter(has_text="hostile")).to_contain_text("revoked")
    page.screenshot(path=str(artifacts_dir / "share-revoked-list.png"))
    assert anonymous.goto(url).status == 404
    assert page.goto(url).status == 404  # the owner too
    anonymous.screenshot(path=str(artifacts_dir / "share-revoked-404.png"))
    anonymous.context.close()
