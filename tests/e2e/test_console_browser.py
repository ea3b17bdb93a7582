"""The admin console in headless Chromium against a real Daphne in embedded mode.

A staff member (created by ``manage.py ensure_admin``, as ``make run`` does) logs in, uploads a
tiny random Llama zipped in the test, watches its validation reach "ready", activates it, sees
the embedded worker serve it on the workers page, creates a key for it through the keys form,
gets completions with the official openai client, and finds them on the usage page. Every
console page, and the Django admin's index and change lists, is screenshotted into
test-artifacts/console-*.png. No page may raise a JavaScript error or fetch from another host.

The site has no model at start (no bundled SmolLM2): the uploaded checkpoint is its only model.
"""

from __future__ import annotations

import json
import re
import time
import zipfile
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect, sync_playwright

from tests.e2e.sites import TINY_SETTINGS, make_site

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
MODEL = "console-tiny"
KEY_NAME = "console flow key"
END_USER = "reader-42"  # the API's ``user``: the usage page groups by it
TIMEOUT_MS = 180_000  # validation, tokenizer export and model load share two CPU cores with other tests
VALIDATION_TIMEOUT_S = 300
LOCAL_HOSTS = {"127.0.0.1"}
ADMIN_CHANGE_LISTS = ["registry/model", "registry/modelversion", "keys/apikey", "usage/usagerecord",
                      "usage/usagedaily", "auth/user"]


@pytest.fixture(scope="module")
def checkpoint_zip(tiny_llama_dir, tmp_path_factory) -> Path:
    """The tiny Llama's Hugging Face directory as an upload: a zip with config.json at its top."""
    archive = tmp_path_factory.mktemp("upload") / f"{MODEL}.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as zf:
        for path in sorted(Path(tiny_llama_dir).iterdir()):
            if path.is_file():
                zf.write(path, arcname=path.name)
    return archive


@pytest.fixture(scope="module")
def expected_parameters(tiny_llama_dir) -> int:
    """Element count of every tensor in the checkpoint, read with safetensors (not with the engine)."""
    from safetensors import safe_open

    total = 0
    for shard in Path(tiny_llama_dir).glob("*.safetensors"):
        with safe_open(str(shard), framework="numpy") as f:
            for name in f.keys():
                shape = f.get_slice(name).get_shape()
                count = 1
                for dim in shape:
                    count *= dim
                total += count
    return total


@pytest.fixture(scope="module")
def console_site(tmp_path_factory):
    """Daphne with embedded workers and no model; its staff account comes from ensure_admin."""
    site = make_site(tmp_path_factory.mktemp("console_site"))
    out = site.manage("ensure_admin")
    match = re.search(r"Created the superuser '([^']+)'; log in with password: (\S+)", out)
    assert match, f"ensure_admin printed no credentials: {out!r}"
    site.admin_username, site.admin_password = match.groups()
    site.start_daphne({"PAGODA_EMBEDDED_WORKERS": "1"})
    try:
        site.wait_until(lambda: httpx.get(f"{site.url}/healthz", timeout=5).status_code == 200,
                        "Daphne answering /healthz")
        yield site
    finally:
        site.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield browser
        browser.close()


class Watch:
    """What every page of a context did wrong: script errors, console errors, off-site requests."""

    def __init__(self, context):
        self.page_errors: list[str] = []
        self.console_errors: list[str] = []
        self.foreign_requests: list[str] = []
        self.failed_responses: list[str] = []
        context.on("page", self.attach)
        context.on("request", self.request)
        context.on("response", lambda r: r.status >= 400 and self.failed_responses.append(f"{r.status} {r.url}"))

    def attach(self, page) -> None:
        page.on("pageerror", lambda exc: self.page_errors.append(f"{page.url}: {exc}"))
        page.on("console", lambda msg: msg.type == "error" and self.console_errors.append(
            f"{page.url}: {msg.text}"))

    def request(self, request) -> None:
        parts = urlsplit(request.url)
        if parts.scheme in ("http", "https", "ws", "wss") and parts.hostname not in LOCAL_HOSTS:
            self.foreign_requests.append(request.url)

    def assert_clean(self) -> None:
        assert self.page_errors == [], f"JavaScript errors: {self.page_errors}"
        assert self.foreign_requests == [], f"requests to other hosts: {self.foreign_requests}"
        # Chromium asks every site for /favicon.ico; Pagoda has none, and that 404 is the only one allowed.
        failed = [r for r in self.failed_responses if not r.endswith("/favicon.ico")]
        assert failed == [], f"failed requests: {failed}"
        logged = [m for m in self.console_errors if "Failed to load resource" not in m]
        assert logged == [], f"errors in the browser console: {logged}"


@pytest.fixture
def staff(browser, console_site):
    """A logged-in context (viewport wide enough for the console's tables) and its watch."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)
    watch = Watch(context)
    page = context.new_page()
    page.goto(f"{console_site.url}/console/models/")
    assert urlsplit(page.url).path == "/accounts/login/" and "next=/console/models/" in page.url, (
        f"an anonymous visit to the console was not sent to the site's login page: {page.url}")
    page.fill("#id_username", console_site.admin_username)
    page.fill("#id_password", console_site.admin_password)
    page.click("form [type=submit]")
    page.wait_for_url(f"{console_site.url}/console/models/")
    expect(page.locator("#sidebar .account .who")).to_have_text(console_site.admin_username)
    yield page, watch
    context.close()


def version_row(page, number: int):
    return page.locator("#versions tbody tr", has=page.locator("td", has_text=re.compile(rf"^v{number}$"))).filter(
        has_text=MODEL)


def read_row(page, number: int) -> dict | None:
    """The row of ``MODEL`` v``number`` as the page shows it now; None while there is none (or mid-reload)."""
    try:
        return page.evaluate("""([model, number]) => {
            for (const tr of document.querySelectorAll('#versions tbody tr[data-version]')) {
                const cells = tr.querySelectorAll('td');
                if (cells[0].textContent.trim() !== model || cells[1].textContent.trim() !== 'v' + number) continue;
                const bar = tr.querySelector('progress'), step = tr.querySelector('.validation');
                return {status: tr.dataset.status, progress: bar ? bar.value : null,
                        step: step ? step.textContent.trim().replace(/\\s+/g, ' ') : null};
            }
            return null; }""", [MODEL, number])
    except PlaywrightError:  # the page reloads itself when the status changes
        return None


def shoot(page, artifacts_dir: Path, name: str) -> None:
    page.screenshot(path=str(artifacts_dir / f"console-{name}.png"), full_page=True)


def assert_fits_the_window(page) -> None:
    """The page is no wider than the window (wide tables scroll in place), the nav (in the sidebar, as
    the chat page's) is shown, and every form control on it is labelled."""
    page_width, window_width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert page_width <= window_width, f"{page.url} is {page_width} px wide in a {window_width} px window"
    expect(page.locator("#sidebar nav.console-nav")).to_be_visible()
    assert_every_control_is_labelled(page)


def assert_every_control_is_labelled(page) -> None:
    """Every input, select and textarea a person can reach has a label (or an aria-label) naming it."""
    unnamed = page.evaluate("""() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
        .filter((el) => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                        && !el.getAttribute('aria-labelledby'))
        .map((el) => el.outerHTML.slice(0, 120))""")
    assert unnamed == [], f"{page.url}: form controls without a label: {unnamed}"


def test_upload_validate_activate_serve_key_and_usage(staff, console_site, artifacts_dir, checkpoint_zip,
                                                      expected_parameters):
    page, watch = staff
    url = console_site.url
    expect(page.locator("#versions tbody")).to_contain_text("No models yet.")
    shoot(page, artifacts_dir, "models-empty")

    # ---- upload through the form; a second tab of the same session watches the validation
    slug_input = page.locator("#upload input[name=model_slug]")
    slug_input.fill("not a slug!")
    assert slug_input.evaluate("el => el.checkValidity()") is False, "the browser accepts a model name with spaces"
    slug_input.fill(MODEL)
    assert slug_input.evaluate("el => el.checkValidity()") is True
    page.set_input_files("#upload input[name=file]", str(checkpoint_zip))
    page.fill("#upload textarea[name=engine_settings]", json.dumps(TINY_SETTINGS))
    upload_answered: list[float] = []
    page.on("response", lambda r: r.request.method == "POST" and urlsplit(r.url).path == "/console/models/"
            and upload_answered.append(time.monotonic()))
    submitted = time.monotonic()
    page.click("#upload button", no_wait_after=True)

    watcher = page.context.new_page()
    seen: list[dict] = []
    ready_at = None
    deadline = time.monotonic() + VALIDATION_TIMEOUT_S
    shots = {"queued": lambda r: True, "progress": lambda r: (r["progress"] or 0) > 0}
    notice = None
    while time.monotonic() < deadline:
        if notice is None and upload_answered:
            # Read now: the uploading tab reloads itself (dropping the notice) once validation ends.
            try:
                notice = page.locator("p.notice").inner_text(timeout=300)
            except PlaywrightError:
                pass
        if not seen:  # nothing yet: load the page again until the new version is listed
            watcher.goto(f"{url}/console/models/")
        row = read_row(watcher, 1)
        if row is not None and (not seen or row != seen[-1]):
            seen.append(row)
            for name, wanted in list(shots.items()):  # the bar empty, then part-way
                if row["status"] == "validating" and wanted(row):
                    shoot(watcher, artifacts_dir, f"models-validating-{name}")
                    del shots[name]
                    break
        if row is not None and row["status"] != "validating":
            ready_at = time.monotonic()
            break
        watcher.wait_for_timeout(100 if seen else 300)
    print(f"\nvalidation as the watching tab saw it ({len(seen)} states): {seen}")
    if upload_answered:
        print(f"upload POST answered {upload_answered[0] - submitted:.1f} s after submit; "
              f"validation settled {ready_at - submitted if ready_at else float('nan'):.1f} s after submit")
    assert seen, "the uploaded version never appeared on the models page"
    assert seen[-1]["status"] == "ready", f"validation did not end ready: {seen[-1]}"
    validating = [s for s in seen if s["status"] == "validating"]
    assert validating, f"the version was never seen validating (no progress bar): {seen}"
    progress = [s["progress"] for s in validating]
    assert all(p is not None for p in progress), f"a validating row without a progress bar: {validating}"
    assert progress == sorted(progress), f"the progress bar went backwards: {progress}"

    # The uploading tab lands back on the models page with the outcome.
    assert notice is not None and f"Uploaded {MODEL}" in notice, f"the uploading tab's notice: {notice!r}"
    page.wait_for_load_state()
    row = version_row(page, 1)
    expect(row.locator("td.status")).to_have_text("ready")
    expect(row.locator("td.validation")).to_have_text(re.compile(r"^\s*validated\s+llama, context \d+, 2 layers"))
    # Shown at a glance ("6.37 M"), the exact count grouped in the tooltip.
    expect(row.locator("td").nth(5)).to_have_text(re.compile(r"^\d{1,3}(\.\d+)? [KMB]$"))
    expect(row.locator("td").nth(5).locator("span")).to_have_attribute("title", f"{expected_parameters:,} parameters")
    expect(row.locator("td").nth(6)).to_have_text(str(512))  # the tiny config's max_position_embeddings
    shoot(page, artifacts_dir, "models-ready")
    watcher.close()

    # ---- activate; the embedded worker loads it and the workers page shows it live
    row.get_by_role("button", name="Activate").click()
    expect(page.locator("p.notice")).to_contain_text("activate done")
    expect(version_row(page, 1).locator("td.status")).to_have_text("active")
    assert_fits_the_window(page)
    shoot(page, artifacts_dir, "models-active")

    # ---- its engine settings, unfolded: the memory estimate follows the values being edited
    settings_of_v1 = page.locator("#versions tr.settings-row details.engine-settings").filter(
        has=page.locator(f"form#settings-{version_row(page, 1).get_attribute('data-version')}"))
    settings_of_v1.locator("summary").click()
    estimate = settings_of_v1.locator(".memory-estimate")
    expect(estimate).to_contain_text(re.compile(r"Memory: \d+(\.\d+)? MiB per rank"))
    settings_of_v1.locator("select[name=quantization]").select_option("int8")
    expect(estimate).to_contain_text("int8 projections")
    assert_fits_the_window(page)
    shoot(page, artifacts_dir, "models-engine-settings")

    page.goto(f"{url}/console/workers/")
    live = page.locator("#workers tbody tr.state-live", has=page.locator("td", has_text=re.compile(rf"^{MODEL}$")))
    expect(live).to_have_count(1)
    expect(live.locator("td").nth(2)).to_have_text("1")
    expect(page.locator("#uncovered")).not_to_contain_text(MODEL)
    expect(page.locator("#refreshed")).to_contain_text("updated")
    expect(live.locator("td").nth(17)).to_have_text("0 / 0")  # preempted / paused, as the JS redraws it
    assert_fits_the_window(page)
    shoot(page, artifacts_dir, "workers")

    # ---- a key for this model through the form; the secret is shown once
    page.goto(f"{url}/console/keys/")
    expect(page.locator("#keys tbody")).to_contain_text("No keys yet.")
    shoot(page, artifacts_dir, "keys-empty")
    page.fill("#id_name", KEY_NAME)
    page.select_option("#id_owner", label=console_site.admin_username)
    page.select_option("#id_models", label=MODEL)
    page.click("#create button")
    expect(page.locator("h1")).to_contain_text("Key created")
    raw_key = page.locator("#raw-key").inner_text().strip()
    assert len(raw_key) >= 20, f"the shown key looks wrong: {raw_key!r}"
    shoot(page, artifacts_dir, "keys-created")
    page.goto(f"{url}/console/keys/")
    key_row = page.locator("#keys tbody tr", has_text=KEY_NAME)
    expect(key_row.locator("td").nth(3)).to_have_text(MODEL)
    assert raw_key not in page.content(), "the keys list shows the raw key again"

    # ---- completions with the official client and that key
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=raw_key, max_retries=0, timeout=120)
    completion = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0,
                                           user=END_USER)
    assert completion.model == MODEL
    assert isinstance(completion.choices[0].text, str)
    assert completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens > 0
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello!"}],
                                          max_tokens=8, temperature=0, user=END_USER)
    assert chat.usage.prompt_tokens > 0 and chat.usage.completion_tokens > 0
    total_tokens = completion.usage.total_tokens + chat.usage.total_tokens
    page.goto(f"{url}/console/keys/")
    expect(page.locator("#keys tbody tr", has_text=KEY_NAME).locator("td").nth(7)).to_have_text(str(total_tokens))
    assert_fits_the_window(page)
    shoot(page, artifacts_dir, "keys")

    # ---- the usage page, by each group, shows the two requests
    labels = {"model": MODEL, "key": KEY_NAME, "user": console_site.admin_username,
              "day": datetime.now(timezone.utc).date().isoformat(), "end_user": END_USER}
    for group, label in labels.items():
        page.goto(f"{url}/console/usage/?group={group}")
        usage_row = page.locator("#usage tbody tr", has_text=label)
        deadline = time.monotonic() + 30
        while usage_row.count() == 0 and time.monotonic() < deadline:  # records are written as requests end
            page.wait_for_timeout(500)
            page.reload()
        expect(usage_row.locator("td").nth(1)).to_have_text("2")
        expect(usage_row.locator("td").nth(6)).to_have_text(str(total_tokens))
        assert_fits_the_window(page)
        shoot(page, artifacts_dir, f"usage-by-{group}")
    csv_text = page.request.get(f"{url}/console/usage.csv?group=model").text()
    assert f"{MODEL},2,0,{completion.usage.prompt_tokens + chat.usage.prompt_tokens}," in csv_text, csv_text

    # ---- the jobs page lists the upload's validation, done; the batches and chat limits pages
    page.goto(f"{url}/console/jobs/")
    job = page.locator("#jobs tbody tr", has_text=f"{MODEL} v1")
    expect(job.locator("td.state")).to_have_text("done")
    expect(page.locator("#refreshed")).to_contain_text("updated")  # jobs.json polled
    assert_fits_the_window(page)
    shoot(page, artifacts_dir, "jobs")
    for name in ("batches", "chat-limits"):
        page.goto(f"{url}/console/{name}/")
        expect(page.locator("nav.console-nav a.current[aria-current=page]")).to_have_count(1)
        assert_fits_the_window(page)
        shoot(page, artifacts_dir, name)

    # ---- the Django admin
    page.goto(f"{url}/admin/")
    expect(page.locator("#site-name, #header")).not_to_have_count(0)
    shoot(page, artifacts_dir, "admin-index")
    for change_list in ADMIN_CHANGE_LISTS:
        response = page.goto(f"{url}/admin/{change_list}/")
        assert response.status == 200, f"/admin/{change_list}/ answered {response.status}"
        expect(page.locator("#changelist")).to_be_visible()
        shoot(page, artifacts_dir, "admin-" + change_list.replace("/", "-"))

    print(f"console errors: {watch.console_errors}; failed responses: {watch.failed_responses}")
    watch.assert_clean()


def test_the_uploading_tab_itself_shows_the_validation_progress(staff, console_site, artifacts_dir,
                                                                checkpoint_zip):
    """Required: whoever uploads sees their version listed, validating, before validation ends.

    Runs after the flow test: the upload becomes v2 of the same model.
    """
    page, watch = staff
    page.fill("#upload input[name=model_slug]", MODEL)
    page.set_input_files("#upload input[name=file]", str(checkpoint_zip))
    page.fill("#upload textarea[name=engine_settings]", json.dumps(TINY_SETTINGS))
    page.click("#upload button", no_wait_after=True)
    seen = []
    deadline = time.monotonic() + VALIDATION_TIMEOUT_S
    while time.monotonic() < deadline:
        row = read_row(page, 2)
        if row is not None and (not seen or row != seen[-1]):
            seen.append(row)
        if row is not None and row["status"] != "validating":
            break
        page.wait_for_timeout(100)
    shoot(page, artifacts_dir, "models-upload-v2")
    # Two validated versions, each with its summary and memory lines: at 1440 px the table fits its
    # card without scrolling (long lines wrap inside the validation column).
    table_width, region_width = page.evaluate(
        "() => [document.querySelector('#versions').scrollWidth, document.querySelector('#versions').parentElement.clientWidth]")
    assert table_width <= region_width, f"the versions table is {table_width} px wide in its {region_width} px card"
    print(f"\nthe uploading tab saw: {seen}")
    assert seen and seen[-1]["status"] == "ready", f"v2 did not end ready in the uploading tab: {seen}"
    assert seen[0]["status"] == "validating", (
        f"the uploading tab only got its page back once validation had ended: first state seen {seen[0]}")
    watch.assert_clean()
