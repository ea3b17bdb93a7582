"""An HTML document's readable text: paragraphs and list items on their own lines, h1-h6 as
Markdown headings (so the chunker cuts at them), scripts, styles and tags left out. The standard
library's parser: it never fails on malformed markup, it reads what it can."""

from __future__ import annotations

import re
from html.parser import HTMLParser

_BLOCKS = frozenset("p div section article main header footer aside nav li tr table ul ol pre blockquote br hr "
                    "dt dd figure figcaption".split())
_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_SKIPPED = frozenset(("script", "style", "template", "noscript", "head"))


class _Reader(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        if tag in _SKIPPED:
            self.skipping += 1
        elif tag in _HEADINGS:
            self.parts.append("\n\n" + "#" * _HEADINGS[tag] + " ")
        elif tag in _BLOCKS:
            self.parts.append("\n\n" if tag not in ("br", "li", "tr") else "\n")

    def handle_endtag(self, tag):
        if tag in _SKIPPED:
            self.skipping = max(0, self.skipping - 1)
        elif tag in _HEADINGS or tag in _BLOCKS:
            self.parts.append("\n\n" if tag not in ("li", "tr") else "\n")

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(re.sub(r"\s+", " ", data))


def html_to_text(html: str) -> str:
    reader = _Reader()
    reader.feed(html)
    reader.close()
    lines = [line.strip() for line in "".join(reader.parts).split("\n")]
    text, blank = [], False
    for line in lines:  # at most one blank line in a row
        if line or not blank:
            text.append(line)
        blank = not line
    return "\n".join(text).strip()
