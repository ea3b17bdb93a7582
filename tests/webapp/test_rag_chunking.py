"""Documents cut into chunks along their structure: pages, headings, paragraphs, with overlap, each
chunk an exact character span of the text it indexes."""

from __future__ import annotations

from webapp.rag.chunking import MAX_CHUNK_CHARS, chunk_document
from webapp.rag.fusion import reciprocal_rank_fusion


def test_pdf_pages_become_page_numbers_and_chunks_never_cross_a_page():
    pages = [f"Page {n} says " + "harbour " * (30 + 40 * (n % 3)) for n in range(1, 8)]
    text, spans = chunk_document("log.pdf", "\f".join(pages))

    assert {s.page for s in spans} == set(range(1, 8))
    for span in spans:
        assert "\f" not in text[span.start:span.end]
        assert text[span.start:span.end].strip() == text[span.start:span.end]
    assert text[spans[0].start:spans[0].end].startswith("Page 1 says")


def test_a_long_section_is_cut_at_paragraphs_with_overlap():
    paragraphs = [f"Paragraph {n}. " + "The tide turned and the boats came in. " * 8 for n in range(12)]
    text, spans = chunk_document("notes.txt", "\n\n".join(paragraphs))

    assert len(spans) > 3 and all(s.end - s.start <= MAX_CHUNK_CHARS for s in spans)
    assert all(later.start < earlier.end for earlier, later in zip(spans, spans[1:]))  # overlap
    assert all(text[s.end - 1] == "." for s in spans)  # ends at a paragraph or sentence, not mid-word
    covered = set()
    for s in spans:
        covered.update(range(s.start, s.end))
    assert all(i in covered for i, c in enumerate(text) if not c.isspace())  # nothing left out


def test_markdown_headings_start_sections_and_name_their_chunks():
    text, spans = chunk_document("guide.md", "# Guide\n\nIntro.\n\n## Tides\n\nHigh at noon.\n\n## Boats\n\nSix.")

    assert [(s.heading, text[s.start:s.end]) for s in spans] == [
        ("Guide", "# Guide\n\nIntro."), ("Tides", "## Tides\n\nHigh at noon."), ("Boats", "## Boats\n\nSix.")]


def test_html_is_read_as_text_without_scripts_and_its_headings_cut_it():
    html = ("<html><head><script>steal()</script></head><body><h2>Lamp &amp; lens</h2><p>Keep it clean.</p>"
            "<h2>Fog</h2><p>Sound <b>the horn</b>.<p>Unclosed</body>")
    text, spans = chunk_document("manual.html", html)

    assert "steal" not in text and "<" not in text
    assert [s.heading for s in spans] == ["Lamp & lens", "Fog"]
    assert "Sound the horn." in text[spans[1].start:spans[1].end]


def test_a_document_without_words_has_no_chunks():
    assert chunk_document("blank.pdf", "\f \f\n")[1] == []


def test_reciprocal_rank_fusion_favours_what_both_rankings_place_high():
    assert reciprocal_rank_fusion([1, 2, 3], [3, 1, 4])[:2] == [1, 3]
    assert reciprocal_rank_fusion([5], []) == [5]
