"""A document attached in headless Chromium against a real Daphne serving the bundled SmolLM2:
a 20 KB text file's whole text reaches the model (the answer quotes its line), the second turn's
prefix-cache hit covers the document (computed once), and a file too large for the model's
context is refused with a message saying so. Screenshots: test-artifacts/chat-documents-*.png.

The 20 KB file is about 6,000 tokens: its prefill is the slow part here (on a loaded two-core
CPU a 2,048-token step of it measured up to 79 s, hence the worker heartbeat's 300 s stall limit
and the first answer's longer wait)."""

from __future__ import annotations

import re
import sqlite3
import time

import pytest
from playwright.sync_api import expect

from tests.e2e.test_chat_branches_browser import answered
from tests.e2e.test_chat_browser import ask, browser, manage  # noqa: F401
from tests.e2e.test_chat_reattach_browser import logged_in_page

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

USERNAME, PASSWORD = "document-tester", "document-tester-pw-58"
PREFILL_TIMEOUT_MS = 400_000  # ~6,000 prompt tokens on two shared CPU cores
CAPTAINS = "Mora Quinn Okafor Lindqvist Haddad Brennan Ito Castell Duarte Varga Nakamura Ferreira Sato".split()
BOATS = ("Grey Heron", "Saltwind", "Little Auk", "North Star", "Marigold", "Kestrel", "Blue Fulmar",
         "Morning Tern", "Stormpetrel", "Wren")
CARGO = "salt slate barley tar rope wool peat herring lime timber flour".split()
PORTS = "Dunmore Kilkee Aran Galway Dingle Tralee Sligo Clare Achill Howth Cobh Wexford".split()
COUNTS = "one two three four five six seven eight nine ten eleven twelve".split()
# 250 distinct numbered lines (the cycles of 13, 10, 11 and 12 never repeat a combination), ~20 KB.
LINES = [f"Line {i + 1}: Captain {CAPTAINS[i % 13]} of the {BOATS[i % 10]} brought {COUNTS[i % 12]} loads "
         f"of {CARGO[i % 11]} to {PORTS[i % 12]}." for i in range(250)]
NEEDLE = "The keeper's cat is called Biscuit and sleeps on the lamp room stairs."
LINES[123] = f"Line 124: {NEEDLE}"
@pytest.fixture(scope="module")
def chat_site(embedded_site):
    manage(embedded_site, "createsuperuser", "--noinput", "--username", USERNAME, "--email", "d@example.com",
           env={"DJANGO_SUPERUSER_PASSWORD": PASSWORD})
    return embedded_site


@pytest.fixture
def page(browser, chat_site):
    page = logged_in_page(browser, chat_site, USERNAME, PASSWORD)
    yield page
    page.context.close()


def answers(site, conversation: str) -> list[tuple[int, int]]:
    with sqlite3.connect(site.db_path) as db:
        return db.execute("SELECT prompt_tokens, cached_prompt_tokens FROM chat_message WHERE conversation_id = ? "
                          "AND role = 'assistant' ORDER BY id", (conversation,)).fetchall()


def document_tokens(text: str) -> int:
    """The tokens of the document as the prompt wraps it (webapp.chat.documents.prompt_text)."""
    from engine.text.tokenizer import load_tokenizer

    return len(load_tokenizer("smollm2").encode(f'<document name="keeper-log.txt">\n{text}\n</document>'))


def test_a_20_kb_text_file_is_quoted_and_the_second_turn_finds_it_cached(page, chat_site, tmp_path, artifacts_dir):
    log = tmp_path / "keeper-log.txt"
    log.write_text("\n".join(LINES))
    assert 19_500 < log.stat().st_size < 21_000
    assert len({line.split(": ", 1)[1] for line in LINES}) == len(LINES)  # each line says something else
    page.set_input_files("#attach", str(log))
    expect(page.locator("#attachments li")).to_have_text("keeper-log.txt×")
    ask(page, "Quote the line of the log about the keeper's cat.", max_tokens=32)
    expect(page.locator(".message.assistant")).to_have_count(1)
    started = time.monotonic()
    expect(page.locator(".message.assistant .meta").last).to_contain_text("tokens", timeout=PREFILL_TIMEOUT_MS)
    first_answer = answered(page)
    print(f"first answer, ~6,000 prompt tokens: {time.monotonic() - started:.1f} s")
    # Greedy, the model copies line 124 of the file: all of it, or up to "Biscuit." where the summation
    # order of the server's thread count tips a near tie (seen with one OpenMP thread per process).
    # The cat's name is only in the file.
    assert NEEDLE.split(" and ")[0] in first_answer
    expect(page.locator(".message.user .documents li")).to_have_text("keeper-log.txt")
    expect(page.locator("#attachments li")).to_have_count(0)
    page.screenshot(path=str(artifacts_dir / "chat-documents-first.png"))
    ask(page, "Thank you.", max_tokens=8)
    expect(page.locator(".message.assistant")).to_have_count(2)
    started = time.monotonic()
    answered(page)
    print(f"second answer, the document cached: {time.monotonic() - started:.1f} s")
    page.screenshot(path=str(artifacts_dir / "chat-documents-second.png"))

    conversation = page.url.rstrip("/").split("/")[-1]
    (first_prompt, _), (second_prompt, second_cached) = answers(chat_site, conversation)
    num_document_tokens = document_tokens(log.read_text())
    assert 5_000 < num_document_tokens < first_prompt < second_prompt
    assert second_cached >= num_document_tokens  # the document was computed once, in the first turn
    shown = page.locator(".message.assistant .meta").last.inner_text()
    hit = int(re.search(r"prefix cache (\d+)%", shown).group(1))  # what the page says of the second turn
    assert hit == round(100 * second_cached / second_prompt) and hit >= 100 * num_document_tokens // second_prompt


def test_a_file_too_large_for_the_context_is_refused_saying_so(page, chat_site, tmp_path, artifacts_dir):
    big = tmp_path / "novel.md"
    big.write_text("The sea was calm that night. " * 11_000)  # past what a turn takes (a shorter one is retrieved from)
    page.set_input_files("#attach", str(big))
    ask(page, "Summarise it.", max_tokens=50)
    expect(page.locator(".error-banner")).to_contain_text("more than 300,000 characters")
    expect(page.locator("#prompt")).to_have_value("Summarise it.")  # given back, with the file still attached
    expect(page.locator("#attachments li")).to_have_count(1)
    page.screenshot(path=str(artifacts_dir / "chat-documents-too-large.png"))


def test_a_pdfs_text_reaches_the_model_and_a_scan_is_refused_saying_so(page, chat_site, tmp_path, artifacts_dir):
    from tests.webapp.test_chat_pdf import pdf_with_pages

    report = tmp_path / "report.pdf"
    report.write_bytes(pdf_with_pages("Keeper's report.", "THE SECRET WORD IS PELICAN."))
    scan = tmp_path / "scan.pdf"
    scan.write_bytes(pdf_with_pages(""))
    page.set_input_files("#attach", [str(report), str(scan)])
    expect(page.locator(".error-banner")).to_contain_text("scan.pdf has no text to read")
    expect(page.locator("#attachments li")).to_have_text("report.pdf×")  # the scan is not attached
    ask(page, "What is the secret word in the report? Answer with the word.", max_tokens=16)
    expect(page.locator(".message.assistant")).to_have_count(1)
    assert "PELICAN" in answered(page).upper()
    expect(page.locator(".message.user .documents li")).to_have_text("report.pdf")
    page.screenshot(path=str(artifacts_dir / "chat-documents-pdf.png"))
