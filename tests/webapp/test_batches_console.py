"""The console's batches page: every batch with status, progress, duration and file links (staff
only), and the Batch API's objects carrying exactly the fields of the openai package's types."""

from __future__ import annotations

from datetime import timedelta

import openai
import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from webapp.batches.files import output_file_create
from webapp.batches.models import Batch
from webapp.batches.serializers import batch_object, file_object
from webapp.batches.services import file_create
from webapp.keys.services import apikey_create

LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "x"}}\n'


@pytest.fixture
def batch(db):
    owner = get_user_model().objects.create_user("carol")
    api_key, _ = apikey_create(owner=owner, name="carol's")
    file = file_create(api_key=api_key, filename="in.jsonl", content=LINE)
    now = timezone.now()
    batch = Batch.objects.create(owner=owner, api_key=api_key, input_file=file, input_file_public_id=file.public_id,
                                 endpoint="/v1/completions", model_name="m", status=Batch.Status.COMPLETED,
                                 num_total=4, num_completed=3, num_failed=1, expires_at=now + timedelta(days=1),
                                 in_progress_at=now - timedelta(seconds=90), completed_at=now)
    batch.output_file = output_file_create(batch=batch, name="output", content=b'{"custom_id": "a"}\n', num_lines=1)
    batch.error_file = output_file_create(batch=batch, name="error", content=b'{"custom_id": "b"}\n', num_lines=1)
    batch.save()
    return batch


def test_the_batches_page_shows_status_progress_duration_and_file_links(client, batch):
    staff = get_user_model().objects.create_user("admin", password="pw", is_staff=True)
    client.force_login(staff)

    page = client.get("/console/batches/").content.decode()
    download = client.get(f"/console/batches/files/{batch.output_file.public_id}")

    assert batch.public_id in page and "completed" in page and "carol" in page
    assert '<td class="completed">3</td>' in page and '<td class="failed">1</td>' in page
    assert '<td class="total">4</td>' in page and 'value="100"' in page and "90.0 s" in page
    assert f"/console/batches/files/{batch.output_file.public_id}" in page
    assert f"/console/batches/files/{batch.error_file.public_id}" in page
    assert download.status_code == 200 and download.content == b'{"custom_id": "a"}\n'


def test_the_batches_page_is_for_staff_only(client, batch):
    anonymous = client.get("/console/batches/")
    client.force_login(get_user_model().objects.create_user("dave"))
    member = client.get("/console/batches/")
    member_download = client.get(f"/console/batches/files/{batch.output_file.public_id}")

    assert anonymous.status_code == 302 and member.status_code == member_download.status_code == 403


def test_batch_and_file_objects_have_exactly_the_openai_types_fields(batch):
    as_batch = batch_object(batch)
    as_file = file_object(batch.input_file)

    assert set(as_batch) == set(openai.types.Batch.model_fields)
    assert set(as_file) == set(openai.types.FileObject.model_fields)
    assert set(as_batch["request_counts"]) == set(openai.types.BatchRequestCounts.model_fields)
    parsed = openai.types.Batch.model_validate(as_batch)
    assert parsed.status == "completed" and parsed.request_counts.completed == 3
    assert parsed.usage.total_tokens == 0 and parsed.output_file_id == batch.output_file.public_id
    assert openai.types.FileObject.model_validate(as_file).purpose == "batch"


def test_batches_list_pages_newest_first_with_after_and_limit(client, batch):
    _, raw = apikey_create(owner=batch.owner, name="more")
    newer = [Batch.objects.create(owner=batch.owner, input_file_public_id="file-x", endpoint="/v1/completions",
                                  expires_at=timezone.now()) for _ in range(2)]
    headers = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}

    first = client.get("/v1/batches?limit=2", **headers).json()
    rest = client.get(f"/v1/batches?limit=2&after={first['last_id']}", **headers).json()
    bad = client.get("/v1/batches?limit=101", **headers)

    assert [b["id"] for b in first["data"]] == [newer[1].public_id, newer[0].public_id] and first["has_more"]
    assert [b["id"] for b in rest["data"]] == [batch.public_id] and not rest["has_more"]
    assert first["object"] == "list" and first["first_id"] == newer[1].public_id
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"
