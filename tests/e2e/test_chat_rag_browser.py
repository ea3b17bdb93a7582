"""Retrieval in headless Chromium against a real Daphne serving the bundled SmolLM2: a 50-page PDF
made here, with one fact on page 37 only, is uploaded (attached to a message, then filed in a
knowledge base attached to a chat); the question about the fact is answered
from retrieved passages, and the answer's first source opens page 37's passage, highlighted, in
the side panel. The model's wording is not asserted (135M parameters); what retrieval put in
front of it is. Prints the prompt tokens used against pasting the whole text.
Screenshots: test-artifacts/chat-rag-*.png."""

from __future__ import annotations

import re
import sqlite3

import pytest
from playwright.sync_api import expect

from tests.e2e.test_chat_branches_browser import answered
from tests.e2e.test_chat_browser import ask, browser, manage  # noqa: F401
from tests.e2e.test_chat_reattach_browser import logged_in_page

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

USERNAME, PASSWORD = "rag-tester", "rag-tester-pw-61"
NUM_PAGES, FACT_PAGE = 52, 37
FACT = "The lighthouse keeper's cat is called Biscuit."
PORTS = "Dunmore Kilkee Aran Galway Dingle Tralee Sligo Clare Achill Howth Cobh Wexford Bantry".split()
CARGO = "salt slate barley tar rope wool peat herring lime timber flour".split()
PREFILL_TIMEOUT_MS = 300_000


def page_lines(n: int) -> list[str]:
    lines = [f"Entry {n}.{k}: the tide rose over the {PORTS[(n + k) % 13]} quay while the crew counted "
             f"{CARGO[(n * k) % 11]} crates." for k in range(1, 11)]
    if n == FACT_PAGE:
        lines.insert(4, FACT)
    return lines


def long_pdf() -> bytes:
    """A real PDF of NUM_PAGES pages, ten lines of Helvetica each, cross-reference table and all."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", None, "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for n in range(1, NUM_PAGES + 1):
        shown = " ".join(f"({line.replace('(', '').replace(')', '')}) Tj T*" for line in page_lines(n))
        stream = f"BT /F1 10 Tf 14 TL 40 760 Td {shown} ET"
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {len(objects)} 0 R "
                       f"/Resources << /Font << /F1 3 0 R >> >> >>")
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{o:010d} 00000 n \n" for o in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


@pytest.fixture(scope="module")
def chat_site(embedded_site):
    manage(embedded_site, "createsuperuser", "--noinput", "--username", USERNAME, "--email", "r@example.com",
           env={"DJANGO_SUPERUSER_PASSWORD": PASSWORD})
    return embedded_site


@pytest.fixture
def page(browser, chat_site):
    page = logged_in_page(browser, chat_site, USERNAME, PASSWORD)
    yield page
    page.context.close()


def test_a_50_page_pdf_answer_cites_the_page_with_the_fact_in_the_side_panel(page, chat_site, tmp_path,
                                                                            artifacts_dir):
    from engine.text.tokenizer import load_tokenizer
    from webapp.chat.documents import pdf_text

    report = tmp_path / "harbour-log.pdf"
    report.write_bytes(long_pdf())
    whole = pdf_text("harbour-log.pdf", report.read_bytes())
    assert whole.count("\f") == NUM_PAGES - 1 and whole.count("Biscuit") == 1 and len(whole) > 24_000
    page.set_input_files("#attach", str(report))
    expect(page.locator("#attachments li")).to_have_text("harbour-log.pdf×")
    ask(page, "What is the name of the lighthouse keeper's cat?", max_tokens=24)
    expect(page.locator(".message.assistant .meta").last).to_contain_text("tokens", timeout=PREFILL_TIMEOUT_MS)
    answered(page)

    first = page.locator(".message.assistant ol.sources button.cite").first
    expect(first).to_have_text(f"[1] harbour-log.pdf, page {FACT_PAGE}")
    page.screenshot(path=str(artifacts_dir / "chat-rag-answer.png"))
    first.click()
    panel = page.locator("#passage-panel")
    expect(panel).to_be_visible()
    expect(page.locator("#passage-title")).to_have_text(f"harbour-log.pdf, page {FACT_PAGE}")
    expect(panel.locator("mark.passage-hit")).to_contain_text("cat is called Biscuit")  # pypdf reads ' as \u2019
    page.screenshot(path=str(artifacts_dir / "chat-rag-passage.png"))
    page.emulate_media(color_scheme="dark")  # the panel follows the theme
    page.screenshot(path=str(artifacts_dir / "chat-rag-passage-dark.png"))
    page.set_viewport_size({"width": 390, "height": 844})  # a phone: the panel takes the width
    page.wait_for_timeout(600)  # the drawer's slide
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.screenshot(path=str(artifacts_dir / "chat-rag-passage-phone.png"))
    page.locator("#passage-close").click()
    expect(panel).to_be_hidden()

    conversation = page.url.rstrip("/").split("/")[-1]
    with sqlite3.connect(chat_site.db_path) as db:
        (prompt_tokens,) = db.execute("SELECT prompt_tokens FROM chat_message WHERE conversation_id = ? AND "
                                      "role = 'assistant'", (conversation,)).fetchone()
    whole_tokens = len(load_tokenizer("smollm2").encode(whole))
    print(f"\nprompt tokens with retrieval: {prompt_tokens}; the whole text alone: {whole_tokens} "
          f"({NUM_PAGES} pages, {len(whole):,} characters)")
    assert prompt_tokens < whole_tokens // 4


def test_a_knowledge_base_attached_to_a_chat_answers_with_a_citation_of_its_pdf(page, chat_site, tmp_path,
                                                                               artifacts_dir):
    """The same long PDF, filed once in a knowledge base on /account/knowledge/ (reached from the chat
    page's settings), attached to a new chat by its checkbox: the answer cites the fact's page."""
    report = tmp_path / "harbour-log.pdf"
    report.write_bytes(long_pdf())
    page.click("summary")
    page.locator("#knowledge-bases a", has_text="manage").click()
    page.fill("#knowledge-create input[name=name]", "Harbour records")
    page.locator("#knowledge-create button").click()
    page.set_input_files("#knowledge-upload input[type=file]", str(report))
    page.locator("#knowledge-upload button").click()
    expect(page.locator(".flash.notice")).to_contain_text("Added harbour-log.pdf")
    row = page.locator("#knowledge-documents tbody tr")
    expect(row.locator("td")).to_have_text(["harbour-log.pdf", "pdf", str(NUM_PAGES), str(NUM_PAGES),
                                             re.compile(r"\d{4}-"), "Remove"])
    page.screenshot(path=str(artifacts_dir / "chat-kb-page.png"))

    page.locator("a", has_text="Back to the chat").click()
    page.click("summary")
    page.get_by_label("Harbour records").check()
    page.screenshot(path=str(artifacts_dir / "chat-kb-settings.png"))
    page.click("summary")
    ask(page, "What is the name of the lighthouse keeper's cat?", max_tokens=24)
    expect(page.locator(".message.assistant .meta").last).to_contain_text("tokens", timeout=PREFILL_TIMEOUT_MS)
    answered(page)
    first = page.locator(".message.assistant ol.sources button.cite").first
    expect(first).to_have_text(f"[1] harbour-log.pdf, page {FACT_PAGE}")
    first.click()
    expect(page.locator("#passage-panel mark.passage-hit")).to_contain_text("cat is called Biscuit")
    page.screenshot(path=str(artifacts_dir / "chat-kb-answer.png"))

    page.reload()  # the base stays attached to the conversation
    page.click("summary")
    expect(page.get_by_label("Harbour records")).to_be_checked()
