"""The console's adapter upload in headless Chromium, as staff would use it: pick the base, name the
adapter, choose the zip, submit; a fitting adapter is listed as active, a misfit is refused on the
page naming the module and the shapes."""

import pytest
from playwright.sync_api import expect

from tests.webapp.test_adapters import adapter_zips  # noqa: F401 (fixture)
from tests.webapp.test_console_charts_browser import browser_page  # noqa: F401 (fixture)
from webapp.registry.models import Model, ModelVersion

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def active_tiny(tiny_llama_dir):
    model = Model.objects.create(slug="tiny")
    ModelVersion.objects.create(model=model, number=1, path=str(tiny_llama_dir), format="hf",
                                status=ModelVersion.Status.ACTIVE, tokenizer_dir=str(tiny_llama_dir))


def upload(page, url, name, archive):
    page.goto(f"{url}/console/models/")
    form = page.locator("#adapter-upload")
    form.locator("select[name=base]").select_option("tiny")
    form.locator("input[name=name]").fill(name)
    form.locator("input[name=file]").set_input_files(str(archive))
    form.get_by_role("button", name="Upload adapter").click()
    page.wait_for_load_state()


def test_staff_upload_an_adapter_in_the_console(adapter_zips, active_tiny, browser_page, live_server):  # noqa: F811
    upload(browser_page, live_server.url, "stranger", adapter_zips["other"])
    expect(browser_page.get_by_text("Adapter refused")).to_be_visible()
    expect(browser_page.get_by_text("model.layers.0.self_attn.q_proj: lora_A is [4, 96]")).to_be_visible()

    upload(browser_page, live_server.url, "terse", adapter_zips["fits"])
    expect(browser_page.get_by_text("fits tiny and is served as 'terse' or 'tiny:terse'")).to_be_visible()
    row = browser_page.locator('#adapters tr[data-adapter="terse"]')
    expect(row.locator(".status")).to_have_text("active")
    expect(row).to_contain_text("q_proj, v_proj")
    assert browser_page.locator('#adapters tr[data-adapter="stranger"]').count() == 0
    assert browser_page.errors == []
