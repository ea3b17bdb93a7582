"""What the user typed, made safe for a full-text MATCH, and highlighted snippets made safe for HTML.

User input never reaches a query language as written: it is cut into word tokens (``\\w+``), so
FTS5's operators (``AND OR NOT NEAR * " ( ) :``) and tsquery's (``& | ! <-> :* ( ) '``) cannot
appear; each token is then quoted (FTS5) or written as a plain operand (tsquery). The last token
matches as a prefix, so a half-typed word already finds something.

Snippets come back from the database with private-use characters around each hit; they are cut
into (text, is_hit) segments that templates and JavaScript render as text, never as markup.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_QUERY_CHARS = 200
MAX_TOKENS = 12
HIT_START, HIT_END = "\ue000", "\ue001"  # private-use: never produced by the tokenizers, never markup
_TOKEN = re.compile(r"\w+")
_MARKED = re.compile(f"{HIT_START}(.*?){HIT_END}", re.S)


def query_tokens(text: str) -> list[str]:
    """The words of a query: at most MAX_TOKENS of them, from its first MAX_QUERY_CHARS characters."""
    return _TOKEN.findall((text or "")[:MAX_QUERY_CHARS])[:MAX_TOKENS]


def fts5_match(tokens: list[str]) -> str:
    """An FTS5 MATCH expression: every token as a quoted phrase (implicit AND), the last a prefix."""
    phrases = ['"' + token.replace('"', '""') + '"' for token in tokens]
    if phrases:
        phrases[-1] += "*"
    return " ".join(phrases)


def tsquery_raw(tokens: list[str]) -> str:
    """A to_tsquery() text: tokens ANDed, the last a prefix (``:*``). Tokens are \\w+ only, so no operator
    or quote can come from the user."""
    operands = list(tokens)
    if operands:
        operands[-1] += ":*"
    return " & ".join(operands)


@dataclass(frozen=True)
class Segment:
    text: str
    is_hit: bool


def snippet_segments(marked: str) -> list[Segment]:
    """Cut a snippet whose hits sit between HIT_START and HIT_END into plain-text segments."""
    segments: list[Segment] = []
    position = 0
    for match in _MARKED.finditer(marked or ""):
        if match.start() > position:
            segments.append(Segment(_clean(marked[position:match.start()]), False))
        segments.append(Segment(_clean(match.group(1)), True))
        position = match.end()
    if position < len(marked or ""):
        segments.append(Segment(_clean(marked[position:]), False))
    return [s for s in segments if s.text]


def _clean(text: str) -> str:
    return text.replace(HIT_START, "").replace(HIT_END, "")


@dataclass
class SearchHit:
    """One result: a message (message_id set) or a conversation's title (message_id None)."""

    conversation_id: int
    conversation_title: str
    message_id: int | None
    role: str
    segments: list[Segment] = field(default_factory=list)
    score: float = 0.0  # higher is better, comparable within one search only

    @property
    def url(self) -> str:
        from django.urls import reverse

        anchor = f"#message-{self.message_id}" if self.message_id is not None else ""
        return reverse("chat:conversation", args=[self.conversation_id]) + anchor

    def to_dict(self) -> dict:
        return {"conversation": {"id": self.conversation_id, "title": self.conversation_title},
                "message": self.message_id, "role": self.role, "url": self.url,
                "snippet": [{"text": s.text, "hit": s.is_hit} for s in self.segments]}
