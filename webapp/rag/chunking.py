"""A document's text cut into overlapping chunks along its structure: pages, headings, paragraphs.

Pure Python (no Django): ``chunk_document(name, text)`` returns the text the chunks index
(an HTML document's readable text, anything else as it came) and its chunks. Every chunk is a
character span ``[start, end)`` of that text, so ``text[start:end]`` is exactly the chunk and a
cited passage can be shown in place. Pages are form feeds (``\\f``: how webapp.chat.documents
writes a PDF's pages); headings are Markdown ATX headings (an HTML document's h1-h6 become them).
Within a section (a page, or the text under a heading) a chunk ends at a paragraph break, else a
line or sentence end, else a space, and the next one starts ``OVERLAP_CHARS`` before that end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from webapp.rag.html_text import html_to_text

MAX_CHUNK_CHARS = 1200
OVERLAP_CHARS = 200
PAGE_BREAK = "\f"
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
_BREAKS = ("\n\n", "\n", ". ", " ")  # where a chunk would rather end, best first


@dataclass(frozen=True)
class ChunkSpan:
    ordinal: int
    start: int
    end: int
    page: int | None  # 1-based; None for a document without pages
    heading: str


def document_kind(name: str) -> str:
    extension = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    return {"pdf": "pdf", "md": "markdown", "markdown": "markdown", "html": "html", "htm": "html"}.get(extension,
                                                                                                         "text")


def chunk_document(name: str, text: str) -> tuple[str, list[ChunkSpan]]:
    """(the indexed text, its chunks in order). A document with no words has no chunks."""
    kind = document_kind(name)
    if kind == "html":
        text = html_to_text(text)
    spans: list[ChunkSpan] = []
    for page, start, end in _pages(text, paged=kind == "pdf" or PAGE_BREAK in text):
        for heading, section_start, section_end in _sections(text, start, end):
            for chunk_start, chunk_end in _windows(text, section_start, section_end):
                spans.append(ChunkSpan(len(spans), chunk_start, chunk_end, page, heading))
    return text, spans


def _pages(text: str, paged: bool):
    if not paged:
        yield None, 0, len(text)
        return
    start = 0
    for number, page in enumerate(text.split(PAGE_BREAK), start=1):
        yield number, start, start + len(page)
        start += len(page) + 1


def _sections(text: str, start: int, end: int):
    """(heading, start, end) of the text under each heading of [start, end); '' before the first."""
    heading, position = "", start
    for match in _HEADING.finditer(text, start, end):
        if match.start() > position:
            yield heading, position, match.start()
        heading, position = match.group(1).strip()[:200], match.start()
    if end > position:
        yield heading, position, end


def _windows(text: str, start: int, end: int):
    """Overlapping [start, end) windows of at most MAX_CHUNK_CHARS, trimmed of surrounding space."""
    while start < end:
        while start < end and text[start].isspace():
            start += 1
        if start >= end:
            return
        stop = min(start + MAX_CHUNK_CHARS, end)
        if stop < end:
            stop = _break_before(text, start, stop)
        trimmed = stop
        while trimmed > start and text[trimmed - 1].isspace():
            trimmed -= 1
        yield start, trimmed
        if stop >= end:
            return
        start = _word_start(text, max(stop - OVERLAP_CHARS, start + 1), stop)


def _break_before(text: str, start: int, stop: int) -> int:
    """The best break in the second half of [start, stop): just after it."""
    floor = start + MAX_CHUNK_CHARS // 2
    for mark in _BREAKS:
        at = text.rfind(mark, floor, stop)
        if at >= 0:
            return at + len(mark)
    return stop


def _word_start(text: str, position: int, stop: int) -> int:
    """``position`` moved forward to the start of a word (not past ``stop``)."""
    while position < stop and not text[position - 1].isspace():
        position += 1
    return position
