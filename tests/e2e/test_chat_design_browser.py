"""The chat page and the console in headless Chromium, light and dark, on a desktop and on a phone.

A real Daphne serving the bundled SmolLM2 (embedded). Its pages pass axe-core's WCAG 2 A/AA rules
(colour contrast among them) in both themes; the theme follows the system until the toggle
chooses the other, and the choice outlives a reload; the code highlighting and the console's charts
follow it. At 390x844 nothing is wider than the window, the drawer reaches conversations, search,
sharing, settings and documents, and the composer stays in view when the keyboard takes half the
screen. Screenshots: test-artifacts/design-*.png.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.e2e.sites import make_site

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

AXE = Path(__file__).resolve().parents[1] / "vendor" / "axe-core" / "axe.min.js"
USERNAME, PASSWORD = "designer", "designer-pw-77"
TIMEOUT_MS = 120_000
DESKTOP, PHONE = {"width": 1280, "height": 800}, {"width": 390, "height": 844}
CONSOLE_PAGES = ["workers", "usage", "models", "chat-defaults", "keys", "orgs", "prices", "budgets", "audit",
                 "chat-limits", "jobs", "batches"]
ANSWER = ("Use `sorted` with a `key`:\n\n```python\npeople = [{\"name\": \"Ada\", \"age\": 36}]\n# oldest first\n"
          "for p in sorted(people, key=lambda p: p[\"age\"], reverse=True):\n    print(p[\"name\"])\n```\n\n"
          "| method | in place |\n|---|---|\n| `sorted()` | no |\n| `list.sort()` | yes |\n")
# A conversation with code, a table and two answers (branches), and the workers' last half hour.
SEED = f"""
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.utils import timezone
from webapp.chat.models import Conversation, Message
from webapp.monitoring.models import WorkerSnapshot
user = get_user_model().objects.create_superuser({USERNAME!r}, "d@example.com", {PASSWORD!r})
c = Conversation.objects.create(user=user, title="Sorting a list of dicts in Python")
q = Message(conversation=c, role="user", content="How do I sort a list of dicts by a key?"); q.root = True; q.save()
a = Message.objects.create(conversation=c, parent=q, role="assistant", model_name="smollm2", content={ANSWER!r},
                           prompt_tokens=30, completion_tokens=80, cached_prompt_tokens=10, finish_reason="stop")
Message.objects.create(conversation=c, parent=q, role="assistant", model_name="smollm2", content="Try list.sort().")
c.current_leaf = a; c.save()
Conversation.objects.create(user=user, title="A conversation whose title is far too long for the sidebar to show")
now = timezone.now()
WorkerSnapshot.objects.bulk_create([WorkerSnapshot(taken_at=now - timedelta(seconds=10 * n), model_slug="smollm2",
    version="1", worker_id="w1", tokens_per_s=5 + n % 7, num_running=n % 3, num_waiting=n % 2,
    kv_cache_usage=0.1 * (n % 5), ttft_p50=0.05, ttft_p95=0.2, itl_p50=0.01, itl_p95=0.03) for n in range(120)])
print(c.pk)
"""


@pytest.fixture(scope="module")
def design_site(tmp_path_factory):
    site = make_site(tmp_path_factory.mktemp("design_site"))
    site.manage("ensure_bundled_model")
    site.conversation_id = int(site.manage("shell", "-c", SEED).strip().splitlines()[-1])
    try:
        site.start_embedded("the embedded worker for smollm2 coming up")
        yield site
    finally:
        site.stop()


def new_page(browser, site, *, viewport=DESKTOP, scheme="light", log_in=True, **options):
    context = browser.new_context(viewport=viewport, color_scheme=scheme, **options)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    if log_in:
        page.goto(f"{site.url}/accounts/login/")
        page.fill("#id_username", USERNAME)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{site.url}/")
    return page


def axe_violations(page) -> list[str]:
    """axe-core's WCAG 2.0/2.1 A and AA violations on the page as shown, one line each."""
    if not page.evaluate("() => Boolean(window.axe)"):
        page.evaluate(AXE.read_text())  # in the page's main world, as a devtools console would (not a <script>)
    result = page.evaluate("() => axe.run(document, {runOnly: {type: 'tag', "
                           "values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}})")
    return [f"{v['id']} ({len(v['nodes'])}): {v['nodes'][0]['target']} {v['nodes'][0].get('failureSummary', '')}"
            for v in result["violations"]]


def shown_theme(page) -> str:
    return page.evaluate("() => document.documentElement.dataset.themeShown")


def color(page, selector: str, prop: str = "color") -> str:
    return page.eval_on_selector(selector, f"(el) => getComputedStyle(el).{prop}")


def drawer_settled(page, is_open: bool = True) -> None:
    """The drawer's slide (0.2 s) has ended: a screenshot shows it where it stays."""
    page.wait_for_function("(open) => (getComputedStyle(document.getElementById('sidebar')).transform === 'none')"
                           " === open", arg=is_open)


def fits_the_window(page) -> None:
    widths = page.evaluate("() => [document.scrollingElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], f"{page.url} is {widths[0]} px wide in a {widths[1]} px window"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_page_passes_axe_in_both_themes(browser, design_site, scheme, artifacts_dir):
    url = design_site.url
    page = new_page(browser, design_site, scheme=scheme, log_in=False)
    page.goto(f"{url}/accounts/login/")
    assert shown_theme(page) == scheme  # the system's theme, nothing chosen
    found = {"login": axe_violations(page)}
    page.fill("#id_username", USERNAME)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/")
    page.goto(f"{url}/c/{design_site.conversation_id}/")
    expect(page.locator("#connection")).to_have_text("connected")
    expect(page.locator(".message.assistant pre code .hljs-keyword").first).to_be_visible()
    found["chat"] = axe_violations(page)
    page.screenshot(path=str(artifacts_dir / f"design-chat-{scheme}-desktop.png"))
    page.click("details.settings summary")
    found["chat settings"] = axe_violations(page)
    page.screenshot(path=str(artifacts_dir / f"design-chat-settings-{scheme}-desktop.png"))
    page.click("details.settings summary")
    page.click("#share-button")  # the shared links list, with this one new, then the read-only page
    page.wait_for_url(re.compile(r"/shared/\?created="))
    found["shared links"] = axe_violations(page)
    page.goto(page.locator("tr.new input.share-url").input_value())
    expect(page.locator("#messages .message.assistant pre code")).to_contain_text("sorted(people")
    found["shared page"] = axe_violations(page)
    page.screenshot(path=str(artifacts_dir / f"design-shared-{scheme}-desktop.png"))
    for path in ["/search/?q=sort", "/account/"] + [f"/console/{name}/" for name in CONSOLE_PAGES]:
        page.goto(url + path)
        page.wait_for_load_state("networkidle")
        found[path] = axe_violations(page)
    page.goto(f"{url}/console/chat-defaults/")
    page.screenshot(path=str(artifacts_dir / f"design-console-chat-defaults-{scheme}-desktop.png"), full_page=True)
    page.goto(f"{url}/console/workers/")
    expect(page.locator("[data-chart=tokens] canvas")).to_have_count(1)
    page.screenshot(path=str(artifacts_dir / f"design-console-workers-{scheme}-desktop.png"), full_page=True)
    assert {where: v for where, v in found.items() if v} == {}
    assert page.errors == []


def test_a_new_chat_starts_from_the_models_shipped_defaults_and_says_so(browser, design_site, artifacts_dir):
    page = new_page(browser, design_site)
    expect(page.locator("#connection")).to_have_text("connected")
    page.click("details.settings summary")
    source = lambda field: page.locator(f"#{field}-source")  # noqa: E731
    expect(page.locator("#temperature")).to_have_value("0.3")  # shipped for smollm2 by the data migration
    expect(source("temperature")).to_have_text("model default")
    expect(source("top-p")).to_have_text("model default")
    expect(source("system-prompt")).to_have_text("model default")
    expect(page.locator("#system-prompt")).to_have_value(re.compile("^You are a helpful AI assistant named SmolLM"))
    expect(source("top-k")).to_have_text("engine default")
    page.fill("#temperature", "0.8")
    expect(source("temperature")).to_have_text("your setting")
    page.screenshot(path=str(artifacts_dir / "design-chat-settings-sources-light-desktop.png"))
    page.fill("#temperature", "0.30")
    expect(source("temperature")).to_have_text("model default")
    assert page.errors == []
    page.context.close()


def test_a_conversation_exported_from_the_sidebar_imports_back(browser, design_site, tmp_path):
    url = design_site.url
    page = new_page(browser, design_site)
    page.goto(f"{url}/c/{design_site.conversation_id}/")
    with page.expect_download() as download:
        page.locator(".sidebar-transfer a", has_text="JSON").first.click()
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    assert saved.name == f"pagoda-conversation-{design_site.conversation_id}.json"
    page.set_input_files("#import-file", str(saved))  # the form is sent on choosing
    page.wait_for_url(lambda u: re.search(r"/c/\d+/$", u) and not u.endswith(f"/c/{design_site.conversation_id}/"))
    expect(page.locator(".message.assistant .branch-count")).to_have_text("1/2")  # the other answer came too
    expect(page.locator(".message.assistant pre code")).to_contain_text("sorted(people")
    page.set_input_files("#import-file", files=[{"name": "x.json", "mimeType": "application/json",
                                                 "buffer": b'{"format": "pagoda-conversations", "version": 1}'}])
    expect(page.locator("#import-error")).to_contain_text("not made by this site")
    page.context.close()


def test_the_toggle_is_remembered_and_the_system_rules_otherwise(browser, design_site):
    url = design_site.url
    page = new_page(browser, design_site, scheme="light")
    page.goto(f"{url}/c/{design_site.conversation_id}/")
    keyword = ".message.assistant pre .hljs-keyword"
    expect(page.locator(keyword).first).to_be_visible()
    light = {"bg": color(page, "body", "backgroundColor"), "keyword": color(page, keyword),
             "code": color(page, ".message.assistant pre", "backgroundColor")}
    assert shown_theme(page) == "light"
    toggle = page.locator(".sidebar [data-theme-toggle]")
    expect(toggle).to_have_attribute("aria-pressed", "false")

    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "true")
    dark = {"bg": color(page, "body", "backgroundColor"), "keyword": color(page, keyword),
            "code": color(page, ".message.assistant pre", "backgroundColor")}
    assert shown_theme(page) == "dark"
    assert dark["keyword"] == "rgb(255, 123, 114)"  # github-dark's keyword, its sheet switched on
    assert light["keyword"] == "rgb(207, 34, 46)"
    assert dark["bg"] != light["bg"] and dark["code"] != light["code"]
    assert page.evaluate("() => localStorage.getItem('pagoda-theme')") == "dark"
    assert page.eval_on_selector("link[data-theme-sheet=dark]", "(l) => l.media") == "all"

    # Remembered: a reload and the console (another page of the site) open dark on a light system.
    page.reload()
    assert shown_theme(page) == "dark"
    page.goto(f"{url}/console/workers/")
    assert shown_theme(page) == "dark"
    chart = "[data-chart=tokens]"
    expect(page.locator(f"{chart} canvas")).to_have_count(1)
    stroke = f"() => document.querySelector('{chart}')._plot.series[1].stroke()"
    axis = f"() => document.querySelector('{chart}')._plot.axes[0].stroke()"
    dark_chart = (page.evaluate(stroke), page.evaluate(axis))
    assert dark_chart == ("rgb(116, 160, 255)", "rgb(158, 164, 180)")  # --chart-1 and --muted, dark

    # Back to light, the system's own theme: the choice is forgotten and the charts redrawn.
    page.locator(".sidebar [data-theme-toggle]").click()
    assert shown_theme(page) == "light"
    assert page.evaluate("() => localStorage.getItem('pagoda-theme')") is None
    assert (page.evaluate(stroke), page.evaluate(axis)) == ("rgb(59, 111, 208)", "rgb(99, 104, 120)")

    # Nothing chosen: the system's setting rules, live.
    page.emulate_media(color_scheme="dark")
    page.wait_for_function("() => document.documentElement.dataset.themeShown === 'dark'")
    assert page.evaluate(stroke) == "rgb(116, 160, 255)"
    assert page.errors == []
    page.context.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_a_phone_reaches_everything_through_the_drawer(browser, design_site, scheme, artifacts_dir):
    url = design_site.url
    page = new_page(browser, design_site, viewport=PHONE, scheme=scheme, is_mobile=True, has_touch=True)
    page.goto(f"{url}/c/{design_site.conversation_id}/")
    expect(page.locator("#connection")).to_have_text("connected")
    fits_the_window(page)
    sidebar = page.locator("#sidebar")
    expect(sidebar).to_be_hidden()
    expect(page.locator("#prompt")).to_be_in_viewport()
    expect(page.locator("#send")).to_be_in_viewport()
    page.screenshot(path=str(artifacts_dir / f"design-chat-{scheme}-phone.png"))

    # The drawer: conversations, search, sharing.
    opener = page.locator(".drawer-button")
    opener.click()
    expect(sidebar).to_be_visible()
    expect(opener).to_have_attribute("aria-expanded", "true")
    expect(page.locator("#conversation-list .conv.active")).to_be_in_viewport()
    expect(page.locator("#share-button")).to_be_in_viewport()
    expect(page.locator(".shared-links-link")).to_be_in_viewport()
    drawer_settled(page)
    assert axe_violations(page) == []
    page.screenshot(path=str(artifacts_dir / f"design-chat-drawer-{scheme}-phone.png"))
    page.fill("#sidebar-search", "sort")
    expect(page.locator("#search-dropdown a").first).to_be_in_viewport()
    fits_the_window(page)
    page.keyboard.press("Escape")
    expect(sidebar).to_be_hidden()
    expect(opener).to_be_focused()

    # Settings and documents: entries of the drawer.
    opener.click()
    page.locator("#drawer-settings").click()
    expect(sidebar).to_be_hidden()
    panel = page.locator(".settings-panel")
    expect(panel).to_be_visible()
    box = panel.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    fits_the_window(page)
    page.screenshot(path=str(artifacts_dir / f"design-chat-settings-{scheme}-phone.png"))
    page.fill("#max-tokens", "8")  # a short answer: the test sends one below
    page.click("details.settings summary")
    opener.click()
    with page.expect_file_chooser() as chooser:
        page.locator("label.side-link[for=attach]").click()
    assert chooser.value.is_multiple()
    expect(sidebar).to_be_hidden()

    # The on-screen keyboard takes the lower half: the composer stays in view, and it sends.
    page.locator("#prompt").focus()
    page.set_viewport_size({"width": 390, "height": 420})
    page.wait_for_function("() => getComputedStyle(document.documentElement).getPropertyValue('--app-height') === '420px'")
    for control in ("#prompt", "#send"):
        assert page.locator(control).bounding_box()["y"] + page.locator(control).bounding_box()["height"] <= 420
    page.screenshot(path=str(artifacts_dir / f"design-chat-keyboard-{scheme}-phone.png"))
    page.set_viewport_size(PHONE)
    page.fill("#prompt", "Say hello.")
    page.locator("#send").tap()
    expect(page.locator(".message.user")).to_have_count(2)  # the question shown, then this one
    expect(page.locator(".message.assistant").last.locator(".meta")).to_contain_text("tokens")  # answered
    fits_the_window(page)

    # Every other page is no wider than the phone, the console reaches its pages from its drawer.
    for path in ["/", "/search/?q=sort", "/shared/"] + [f"/console/{name}/" for name in CONSOLE_PAGES]:
        page.goto(url + path)
        page.wait_for_load_state("networkidle")
        fits_the_window(page)
    page.goto(f"{url}/console/workers/")
    expect(page.locator("[data-chart=tokens] canvas")).to_have_count(1)
    fits_the_window(page)
    page.screenshot(path=str(artifacts_dir / f"design-console-workers-{scheme}-phone.png"), full_page=True)
    page.locator(".drawer-button").click()
    expect(page.locator("nav.console-nav a.current[aria-current=page]")).to_have_text("Workers")
    drawer_settled(page)
    page.screenshot(path=str(artifacts_dir / f"design-console-drawer-{scheme}-phone.png"))
    page.locator("nav.console-nav a", has_text="Usage").click()
    page.wait_for_url(re.compile(r"/console/usage/"))
    fits_the_window(page)
    assert page.errors == []
    page.context.close()
