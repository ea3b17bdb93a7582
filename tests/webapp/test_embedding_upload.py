"""An embedding model (a sentence-transformers checkpoint, zipped with its module folders) uploaded
through the console: validated in the child process, the version's page states its architecture,
dimensions, pooling and maximum sequence length; a pooling mode we do not run fails naming it."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from tests.engine.tiny_bert import MAX_SEQ_LENGTH, save_tiny_sentence_bert

pytestmark = [pytest.mark.django_db, pytest.mark.slow]  # the validator child loads torch


@pytest.fixture
def staff_client(client):
    client.force_login(get_user_model().objects.create_user("admin", password="pw", is_staff=True))
    return client


def zip_tree(directory: Path, archive: Path) -> Path:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        for file in sorted(p for p in directory.rglob("*") if p.is_file()):
            zf.write(file, file.relative_to(directory).as_posix())
    return archive


def upload(staff_client, archive: Path, capture) -> dict:
    with archive.open("rb") as handle, capture(execute=True):
        response = staff_client.post("/console/models/", {"model_slug": "bert", "file": handle,
                                                          "engine_settings": "{}"})
    assert response.status_code == 302
    [row] = staff_client.get("/console/models.json").json()["versions"]
    return row


def test_an_uploaded_sentence_transformers_zip_validates_stating_what_it_embeds(
        staff_client, tmp_path, django_capture_on_commit_callbacks):
    checkpoint = save_tiny_sentence_bert(tmp_path / "bert", pooling="cls", normalize=True)

    row = upload(staff_client, zip_tree(checkpoint, tmp_path / "bert.zip"), django_capture_on_commit_callbacks)

    assert (row["status"], row["error"]) == ("ready", "")
    assert row["validation"]["embedding"] == {"architecture": "bert", "dimensions": 32, "pooling": "cls",
                                              "normalize": True, "max_seq_length": MAX_SEQ_LENGTH}
    assert row["validation"]["context_length"] == MAX_SEQ_LENGTH
    page = staff_client.get("/console/models/").content.decode()
    assert (f"embedding model: bert, 32 dimensions, cls pooling, normalized, at most {MAX_SEQ_LENGTH} tokens"
            in page)


def test_an_upload_with_a_pooling_mode_we_do_not_run_fails_naming_it(
        staff_client, tmp_path, django_capture_on_commit_callbacks):
    checkpoint = save_tiny_sentence_bert(tmp_path / "bert", pooling="mean")
    (checkpoint / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "mean_sqrt_len_tokens"}))

    row = upload(staff_client, zip_tree(checkpoint, tmp_path / "bert.zip"), django_capture_on_commit_callbacks)

    assert row["status"] == "failed"
    assert "pooling mode 'mean_sqrt_len_tokens' is not supported" in row["error"]


def test_an_uploaded_decoder_with_last_token_pooling_validates_as_an_embedding_model(
        staff_client, tmp_path, django_capture_on_commit_callbacks):
    from tests.engine.tiny_decoder_embedding import save_tiny_decoder_embedding

    checkpoint = save_tiny_decoder_embedding(tmp_path / "qwen3-embed")

    row = upload(staff_client, zip_tree(checkpoint, tmp_path / "qwen3.zip"), django_capture_on_commit_callbacks)

    assert (row["status"], row["error"]) == ("ready", "")
    assert row["validation"]["embedding"] == {"architecture": "qwen3", "dimensions": 64, "pooling": "lasttoken",
                                              "normalize": True, "max_seq_length": 96}
    page = staff_client.get("/console/models/").content.decode()
    assert "embedding model: qwen3, 64 dimensions, lasttoken pooling, normalized, at most 96 tokens" in page
