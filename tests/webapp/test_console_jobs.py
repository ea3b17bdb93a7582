"""The console's jobs page: an upload's validation and a batch, with state, progress and duration,
for staff only; jobs.json (what the page polls) has the same rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from tests.webapp.test_model_upload import zip_dir
from webapp.batches.models import Batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client):
    client.force_login(get_user_model().objects.create_user("admin", password="pw", is_staff=True))
    return client


def test_jobs_are_for_staff_only(client):
    for url in ("/console/jobs/", "/console/jobs.json"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=/console/")
    client.force_login(get_user_model().objects.create_user("bob", password="pw"))
    for url in ("/console/jobs/", "/console/jobs.json"):
        assert client.get(url).status_code == 403


@pytest.mark.slow
def test_an_uploads_validation_and_a_running_batch_are_listed_with_progress_and_duration(
        staff_client, tiny_llama_dir, tmp_path, django_capture_on_commit_callbacks):
    archive = zip_dir(tiny_llama_dir, tmp_path / "tiny.zip")
    with archive.open("rb") as handle, django_capture_on_commit_callbacks(execute=True):  # validates (eager)
        assert staff_client.post("/console/models/", {"model_slug": "tiny", "file": handle,
                                                      "engine_settings": "{}"}).status_code == 302
    owner = get_user_model().objects.get(username="admin")
    batch = Batch.objects.create(owner=owner, input_file_public_id="file-x", endpoint="/v1/chat/completions",
                                 status="in_progress", num_total=10, num_completed=3, num_failed=1,
                                 in_progress_at=timezone.now(), expires_at=timezone.now() + timedelta(hours=24))

    jobs = staff_client.get("/console/jobs.json").json()["jobs"]
    page = staff_client.get("/console/jobs/").content.decode()

    by_kind = {job["kind"]: job for job in jobs}
    validation, running = by_kind["validation"], by_kind["batch"]
    assert (validation["subject"], validation["state"], validation["progress"], validation["result"]) == (
        "tiny v1", "done", 100, "ready")
    assert validation["duration_s"] is not None and validation["duration_s"] > 0
    assert (running["state"], running["progress"], running["result"]) == ("running", 40, "3 ok, 1 failed")
    assert running["subject"].startswith(batch.public_id)
    assert [job["kind"] for job in jobs] == ["batch", "validation"]  # newest first
    assert "tiny v1" in page and batch.public_id in page and 'aria-label="progress of tiny v1"' in page
    assert "console/jobs.js" in page


@pytest.mark.slow
def test_a_failed_validation_shows_its_reason(staff_client, tmp_path, django_capture_on_commit_callbacks):
    fake = tmp_path / "broken.gguf"
    fake.write_bytes(b"GGUF" + bytes(64))
    with fake.open("rb") as handle, django_capture_on_commit_callbacks(execute=True):
        staff_client.post("/console/models/", {"model_slug": "broken", "file": handle, "engine_settings": "{}"})

    [job] = staff_client.get("/console/jobs.json").json()["jobs"]

    assert (job["subject"], job["state"]) == ("broken v1", "failed") and job["result"]
