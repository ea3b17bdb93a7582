"""Retrieved passages as the model reads them: numbered [1]..[k], each with where it comes from,
then the question and how to cite. A message whose documents were retrieved from keeps only their
names in later turns' history (their passages belong to the turn that asked)."""

from __future__ import annotations

from webapp.rag.selectors import Passage

INSTRUCTION = ("Answer the question from the sources above. After each fact you use, cite its source by "
               "number in square brackets, like [1].")


def sources_prompt(*, content: str, passages: list[Passage]) -> str:
    if not passages:
        return f"(No passage of the attached documents matches this question.)\n\n{content}"
    sources = "".join(f"[{n}] {p.label()}\n{p.text}\n\n" for n, p in enumerate(passages, start=1))
    return f"<sources>\n{sources}</sources>\n\n{INSTRUCTION}\n\nQuestion: {content}"


def named_only(*, content: str, attachments: list[dict]) -> str:
    names = ", ".join(d["name"] for d in attachments)
    return f"(Attached: {names})\n\n{content}"


def sources_record(passages: list[Passage]) -> list[dict]:
    """What the answer keeps (Message.sources): enough to label each marker; the text is fetched when opened."""
    return [{"n": n, "chunk": p.chunk_id, "document": p.document, "page": p.page}
            for n, p in enumerate(passages, start=1)]
