"""Documents attached to a chat message: text-like files whose whole text joins the prompt.

The page reads the file (UTF-8) and sends it with the turn as {"name", "text"}; it is stored on
the user message (``Message.attachments``) and rendered into that message's prompt text the same
way every turn, so a conversation's later turns find it in the prefix cache. That is up to
PAGODA_RAG_PASTE_MAX_CHARS; past it the documents are chunked and retrieved from instead
(chat.grounding, webapp.rag). A turn whose prompt leaves no room in the model's context is refused
with a message saying how many tokens it needs and how many the model reads
(services.turn_prepare).

Accepted: plain text, Markdown, CSV/TSV, JSON/YAML/TOML/XML/HTML and source code, by extension;
a file with NUL characters is binary and refused. A PDF is read here instead (``pdf_text``, with
pypdf; the page posts it to ``chat:document-text`` first): its text layer, pages separated by form
feeds (retrieval cites page numbers; pasted whole they read as blank lines), then sent
as any text document is; one without text (a scan), encrypted or unreadable is refused saying so.
"""

from __future__ import annotations

import io
import logging
from pathlib import PurePosixPath

logger = logging.getLogger(__name__)

TEXT_EXTENSIONS = frozenset(
    "txt md markdown rst csv tsv json jsonl yaml yml toml ini cfg conf xml html htm css log tex "
    "py js mjs ts tsx jsx java kt c h cc cpp hpp cs go rs rb php pl swift scala sh bash zsh sql r lua "
    "m dart hs ex exs erl clj vue svelte pdf".split())  # pdf: its text, extracted by pdf_text
MAX_PDF_BYTES = 20 * 1024 * 1024
MAX_PDF_PAGES = 500
MAX_DOCUMENTS = 8
MAX_NAME_CHARS = 200
MAX_DOCUMENT_CHARS = 300_000  # all of a turn's documents together (~75k tokens); the model's context decides the rest
# What the documents add to a socket frame at most: each character at most 12 bytes as escaped JSON.
MAX_DOCUMENT_FRAME_BYTES = 12 * MAX_DOCUMENT_CHARS + 1024 * MAX_DOCUMENTS


class DocumentError(ValueError):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def documents_clean(value) -> list[dict]:
    """The turn's documents as [{"name", "text"}]; DocumentError naming the file that is refused."""
    if value in (None, []):
        return []
    if not isinstance(value, list) or not all(isinstance(d, dict) for d in value):
        raise DocumentError("documents must be a list of {name, text} objects")
    if len(value) > MAX_DOCUMENTS:
        raise DocumentError(f"At most {MAX_DOCUMENTS} documents can be attached to one message.")
    documents, total = [], 0
    for document in value:
        name, text = document.get("name"), document.get("text")
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS or not isinstance(text, str):
            raise DocumentError("Each document needs a name (at most 200 characters) and its text.")
        name = PurePosixPath(name.replace("\\", "/")).name
        extension = name.rsplit(".", 1)[-1].lower() if "." in name else ""
        if extension not in TEXT_EXTENSIONS:
            raise DocumentError(f"{name}: only text files can be attached (txt, md, csv, json, source code...).")
        if "\x00" in text:
            raise DocumentError(f"{name} is not a text file.")
        total += len(text)
        if total > MAX_DOCUMENT_CHARS:
            raise DocumentError(f"The documents come to more than {MAX_DOCUMENT_CHARS:,} characters.")
        documents.append({"name": name, "text": text})
    return documents


def prompt_text(*, content: str, attachments: list[dict]) -> str:
    """A user message as the model reads it: each document whole, then the message."""
    parts = [f'<document name="{d["name"]}">\n{d["text"].replace(chr(12), chr(10) * 2)}\n</document>\n\n'
             for d in attachments]
    return "".join(parts) + content


def pdf_text(name: str, data: bytes) -> str:
    """The text layer of a PDF, its pages separated by form feeds; DocumentError saying why not."""
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    if len(data) > MAX_PDF_BYTES:
        raise DocumentError(f"{name} is larger than {MAX_PDF_BYTES // (1024 * 1024)} MiB.")
    if not data.startswith(b"%PDF-"):
        raise DocumentError(f"{name} is not a PDF file.")
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise DocumentError(f"{name} is encrypted; remove its password first.")
        if len(reader.pages) > MAX_PDF_PAGES:
            raise DocumentError(f"{name} has more than {MAX_PDF_PAGES} pages.")
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
    except DocumentError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as exc:
        logger.info("could not read the PDF %s: %s", name, exc)
        raise DocumentError(f"{name} could not be read as a PDF.") from exc
    # Pages are separated by form feeds (page breaks), empty ones kept: retrieval cites page numbers.
    text = "\f".join(p.replace("\f", " ") for p in pages).replace("\x00", "")
    if not text.strip("\f"):
        raise DocumentError(f"{name} has no text to read (a scanned PDF needs OCR first).")
    if len(text) > MAX_DOCUMENT_CHARS:
        raise DocumentError(f"{name} has more than {MAX_DOCUMENT_CHARS:,} characters of text.")
    return text
