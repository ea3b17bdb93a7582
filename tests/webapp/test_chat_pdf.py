"""A PDF attached on the chat page: the server reads its text layer (pypdf) for the page to send
with the message like any text document; what it cannot read is refused saying why."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile

from webapp.chat.documents import documents_clean

pytestmark = pytest.mark.django_db


def pdf_with_pages(*pages: str) -> bytes:
    """A real PDF (Helvetica text, one line per page), cross-reference table and all."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", None,
               "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for text in pages:
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream.decode()}\nendstream")
        content = len(objects)
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {content} 0 R "
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


@pytest.fixture
def alice_client(client):
    client.force_login(get_user_model().objects.create_user("alice", password="pw"))
    return client


def extract(client, name: str, data: bytes):
    return client.post("/documents/text", {"file": SimpleUploadedFile(name, data, "application/pdf")})


def test_a_pdfs_text_comes_back_page_by_page_and_attaches_like_a_text_file(alice_client):
    response = extract(alice_client, "birds.pdf", pdf_with_pages("The PELICAN fishes.", "The ALBATROSS glides."))

    assert response.status_code == 200
    answer = response.json()
    assert answer["name"] == "birds.pdf"
    assert answer["text"].split("\f") == ["The PELICAN fishes.", "The ALBATROSS glides."]  # page breaks
    assert documents_clean([answer]) == [answer]  # what the page then sends with the message


@pytest.mark.parametrize("data, says", [
    (b"plain text, not a PDF", "is not a PDF file"),
    (b"%PDF-1.4\n garbage that no reader can parse", "could not be read as a PDF"),
    (pdf_with_pages(""), "has no text to read"),
])
def test_what_cannot_be_read_is_refused_saying_why(alice_client, data, says):
    response = extract(alice_client, "scan.pdf", data)

    assert response.status_code == 400 and says in response.json()["error"]


def test_reading_a_pdf_needs_a_login_and_a_post(client):
    response = extract(client, "birds.pdf", pdf_with_pages("hello"))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    client.force_login(get_user_model().objects.create_user("bob", password="pw"))
    assert client.get("/documents/text").status_code == 405
