"""The Batch API through Django's test client, its lines run by a real embedded worker serving the
tiny Llama: uploads checked line by line, a batch's output equal to the API's own answers, usage per
line, scoping to the key's owner, cancelling, and resuming a batch a restart cut short."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from webapp.batches.models import Batch, BatchLine
from webapp.batches.runner import batch_run, batch_validate
from webapp.keys.services import apikey_create
from webapp.registry.models import Model, ModelVersion
from webapp.usage.models import UsageRecord
from workers import embedded

pytestmark = pytest.mark.db_engine

MODEL = "tiny-batches"
TINY_SETTINGS = {"num_kv_blocks": 64, "max_model_len": 512, "max_num_seqs": 8}
PROMPTS = ["The lighthouse keeper", "Once upon a time", "In the beginning", "The cat sat", "Rain fell on"]


@pytest.fixture(scope="module")
def worker(tiny_llama_dir):
    embedded.start_embedded_worker(MODEL, "1", str(tiny_llama_dir), TINY_SETTINGS)
    assert embedded.wait_for_embedded_worker(MODEL, timeout=60)
    yield
    embedded.stop_embedded_workers(drain_timeout=5)


@pytest.fixture
def served(worker, tiny_llama_dir, db):
    model = Model.objects.create(slug=MODEL)
    ModelVersion.objects.create(model=model, number=1, path=str(tiny_llama_dir), format="hf", status="active",
                                tokenizer_dir=str(tiny_llama_dir))
    return model


@pytest.fixture
def keys(db):
    users = get_user_model()
    alice, bob = users.objects.create_user("alice"), users.objects.create_user("bob")
    return {"alice": apikey_create(owner=alice, name="a")[1], "bob": apikey_create(owner=bob, name="b")[1]}


def auth(raw_key: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {raw_key}"}


def request_line(i: int, prompt: str, **body) -> dict:
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0, **body}}


def jsonl(lines: list) -> bytes:
    return b"".join((json.dumps(line) if not isinstance(line, str) else line).encode() + b"\n" for line in lines)


def upload(client, raw_key: str, content: bytes):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return client.post("/v1/files", {"purpose": "batch", "file": SimpleUploadedFile("in.jsonl", content)},
                       **auth(raw_key))


def create_batch(client, raw_key: str, file_id: str, capture):
    with capture(execute=True):  # the job is queued on commit; here (eager) it runs in the test
        response = client.post("/v1/batches", json.dumps({"input_file_id": file_id, "endpoint": "/v1/completions",
                                                          "completion_window": "24h", "metadata": {"run": "t"}}),
                               content_type="application/json", **auth(raw_key))
    assert response.status_code == 200, response.content
    return response.json()


@pytest.mark.parametrize("lines, message", [
    (["not json"], "Line 1: is not valid JSON"),
    ([{"method": "POST", "url": "/v1/completions", "body": {}}], "Line 1: custom_id: must be a non-empty string"),
    ([request_line(1, "a"), {**request_line(2, "b"), "method": "GET"}], "Line 2: method:"),
    ([{**request_line(1, "a"), "url": "/v1/embeddings"}], "Line 1: url: must be one of"),
    ([request_line(1, "a"), request_line(1, "b")], "Line 2: custom_id: 'req-1' is used already by line 1"),
    ([request_line(1, "a"), request_line(2, "b", temperature=9)], "Line 2: body.temperature: must be"),
    ([request_line(1, "a", stream=True)], "Line 1: body.stream: streaming is not available"),
    ([request_line(1, "a"), {**request_line(2, "b"), "body": {"prompt": "x"}}], "Line 2: body.model:"),
])
def test_an_upload_with_a_bad_line_is_refused_naming_the_line_and_field(client, keys, lines, message):
    response = upload(client, keys["alice"], jsonl(lines))

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["message"].startswith(message) and error["param"] == "file"
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_batch_line"


def test_uploads_over_the_size_or_line_limit_are_refused(client, keys, settings):
    settings.PAGODA_BATCH_MAX_LINES = 2
    too_many = upload(client, keys["alice"], jsonl([request_line(i, "a") for i in range(3)]))
    settings.PAGODA_BATCH_MAX_FILE_BYTES = 100
    too_big = upload(client, keys["alice"], jsonl([request_line(0, "a" * 200)]))

    assert too_many.status_code == 400 and "more than 2 requests" in too_many.json()["error"]["message"]
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "file_too_large"


@pytest.mark.slow
def test_a_batch_answers_every_line_as_the_api_does_and_records_usage_per_line(
        client, served, keys, django_capture_on_commit_callbacks):
    lines = [request_line(i, p) for i, p in enumerate(PROMPTS)]
    file = upload(client, keys["alice"], jsonl(lines)).json()
    direct = [client.post("/v1/completions", json.dumps(line["body"]), content_type="application/json",
                          **auth(keys["alice"])).json() for line in lines]

    created = create_batch(client, keys["alice"], file["id"], django_capture_on_commit_callbacks)
    batch = client.get(f"/v1/batches/{created['id']}", **auth(keys["alice"])).json()
    output = client.get(f"/v1/files/{batch['output_file_id']}/content", **auth(keys["alice"]))

    assert created["status"] == "validating" and created["metadata"] == {"run": "t"}
    assert batch["status"] == "completed" and batch["error_file_id"] is None
    assert batch["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    assert batch["in_progress_at"] <= batch["finalizing_at"] <= batch["completed_at"]
    results = [json.loads(line) for line in output.content.decode().splitlines()]
    assert [r["custom_id"] for r in results] == [line["custom_id"] for line in lines]
    for result, answer in zip(results, direct):
        assert result["error"] is None and result["response"]["status_code"] == 200
        assert result["response"]["body"]["choices"][0]["text"] == answer["choices"][0]["text"]
        assert result["response"]["body"]["usage"] == answer["usage"]
        record = UsageRecord.objects.get(request_id=result["response"]["request_id"])
        assert (record.status, record.api_key.owner.username, record.completion_tokens) == (
            "ok", "alice", answer["usage"]["completion_tokens"])
    assert batch["usage"]["output_tokens"] == sum(a["usage"]["completion_tokens"] for a in direct)


def test_a_batch_line_is_cached_for_the_batch_keys_owner_alone(client, served, keys,
                                                                  django_capture_on_commit_callbacks):
    prompt = "The ledger of the harbour master lists every ship that anchored in the bay this winter."
    alices = client.post("/v1/completions", json.dumps(request_line(0, prompt)["body"]),
                         content_type="application/json", **auth(keys["alice"])).json()

    cached = {}
    for owner in ("bob", "alice"):
        file = upload(client, keys[owner], jsonl([request_line(0, prompt)])).json()
        batch = create_batch(client, keys[owner], file["id"], django_capture_on_commit_callbacks)
        batch = client.get(f"/v1/batches/{batch['id']}", **auth(keys[owner])).json()
        output = client.get(f"/v1/files/{batch['output_file_id']}/content", **auth(keys[owner]))
        cached[owner] = json.loads(output.content)["response"]["body"]["usage"]["prompt_tokens_details"]

    assert alices["usage"]["prompt_tokens"] > 16  # at least one full block to hit
    assert cached == {"bob": {"cached_tokens": 0}, "alice": {"cached_tokens": 16}}


def test_a_line_the_engine_refuses_goes_to_the_error_file_and_the_rest_complete(
        client, served, keys, django_capture_on_commit_callbacks):
    lines = [request_line(0, "fine"), request_line(1, "x " * 600)]  # over the 512-token context
    file = upload(client, keys["alice"], jsonl(lines)).json()

    batch = create_batch(client, keys["alice"], file["id"], django_capture_on_commit_callbacks)
    batch = client.get(f"/v1/batches/{batch['id']}", **auth(keys["alice"])).json()
    errors = [json.loads(x) for x in client.get(f"/v1/files/{batch['error_file_id']}/content",
                                                 **auth(keys["alice"])).content.decode().splitlines()]

    assert batch["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    assert [e["custom_id"] for e in errors] == ["req-1"]
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["code"] == "context_length_exceeded"


def test_a_batch_for_a_model_the_key_cannot_use_fails_with_an_error(client, served, keys,
                                                                     django_capture_on_commit_callbacks):
    file = upload(client, keys["alice"], jsonl([{**request_line(0, "a"), "body": {"model": "nope", "prompt": "a"}}]))

    batch = create_batch(client, keys["alice"], file.json()["id"], django_capture_on_commit_callbacks)
    batch = client.get(f"/v1/batches/{batch['id']}", **auth(keys["alice"])).json()

    assert batch["status"] == "failed" and batch["failed_at"]
    assert batch["errors"]["data"][0]["code"] == "model_not_found" and batch["errors"]["data"][0]["line"] == 1


def test_files_and_batches_of_another_user_are_not_found(client, served, keys, django_capture_on_commit_callbacks):
    file = upload(client, keys["alice"], jsonl([request_line(0, "a")])).json()
    batch = create_batch(client, keys["alice"], file["id"], django_capture_on_commit_callbacks)
    bob = auth(keys["bob"])

    responses = [client.get(f"/v1/files/{file['id']}", **bob), client.get(f"/v1/files/{file['id']}/content", **bob),
                 client.delete(f"/v1/files/{file['id']}", **bob), client.get(f"/v1/batches/{batch['id']}", **bob),
                 client.post(f"/v1/batches/{batch['id']}/cancel", **bob),
                 client.post("/v1/batches", json.dumps({"input_file_id": file["id"], "endpoint": "/v1/completions",
                                                        "completion_window": "24h"}),
                             content_type="application/json", **bob)]

    assert [r.status_code for r in responses] == [404] * 6
    assert responses[-1].json()["error"]["param"] == "input_file_id"
    assert client.get("/v1/files", **bob).json()["data"] == []
    assert client.get("/v1/batches", **bob).json()["data"] == []
    assert [b["id"] for b in client.get("/v1/batches", **auth(keys["alice"])).json()["data"]] == [batch["id"]]


def test_a_batch_cancelled_before_it_runs_ends_cancelled_with_every_line_in_the_error_file(client, served, keys):
    file = upload(client, keys["alice"], jsonl([request_line(i, p) for i, p in enumerate(PROMPTS)])).json()
    response = client.post("/v1/batches", json.dumps({"input_file_id": file["id"], "endpoint": "/v1/completions",
                                                      "completion_window": "24h"}),
                           content_type="application/json", **auth(keys["alice"]))  # on_commit never fires here
    cancelled = client.post(f"/v1/batches/{response.json()['id']}/cancel", **auth(keys["alice"])).json()
    batch_run(batch_id=Batch.objects.get(public_id=cancelled["id"]).pk)
    batch = client.get(f"/v1/batches/{cancelled['id']}", **auth(keys["alice"])).json()
    errors = [json.loads(x) for x in client.get(f"/v1/files/{batch['error_file_id']}/content",
                                                 **auth(keys["alice"])).content.decode().splitlines()]

    assert cancelled["status"] == "cancelling" and cancelled["cancelling_at"]
    assert batch["status"] == "cancelled" and batch["cancelled_at"] and batch["output_file_id"] is None
    assert [e["error"]["code"] for e in errors] == ["batch_cancelled"] * 5 and errors[0]["response"] is None
    again = client.post(f"/v1/batches/{batch['id']}/cancel", **auth(keys["alice"]))
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


@pytest.mark.slow
def test_a_batch_cut_short_by_a_restart_keeps_its_done_lines_and_runs_the_rest(client, served, keys):
    """The state a killed runner leaves: lines done, one sent to the engine (running), the rest pending."""
    file = upload(client, keys["alice"], jsonl([request_line(i, p) for i, p in enumerate(PROMPTS)])).json()
    public_id = client.post("/v1/batches", json.dumps({"input_file_id": file["id"], "endpoint": "/v1/completions",
                                                       "completion_window": "24h"}),
                            content_type="application/json", **auth(keys["alice"])).json()["id"]
    batch = Batch.objects.select_related("input_file").get(public_id=public_id)
    assert batch_validate(batch=batch)
    done = {"id": "batch_req_kept", "custom_id": "req-0", "response": {"status_code": 200, "request_id": "x",
                                                                       "body": {"kept": True}}, "error": None}
    BatchLine.objects.filter(batch=batch, line_number=1).update(status="completed", result=done)
    BatchLine.objects.filter(batch=batch, line_number=2).update(status="running", num_attempts=1)
    Batch.objects.filter(pk=batch.pk).update(num_completed=1, runner_id="dead-runner", heartbeat_at=timezone.now())

    assert batch_run(batch_id=batch.pk) == "held"  # the dead runner's beat counts until stale...
    assert batch_run(batch_id=batch.pk, force=True) == "completed"  # ...or a restart takes it over

    batch = client.get(f"/v1/batches/{public_id}", **auth(keys["alice"])).json()
    results = [json.loads(x) for x in client.get(f"/v1/files/{batch['output_file_id']}/content",
                                                  **auth(keys["alice"])).content.decode().splitlines()]
    assert batch["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    assert [r["custom_id"] for r in results] == [f"req-{i}" for i in range(5)] and results[0] == done
    assert BatchLine.objects.get(batch__public_id=public_id, line_number=2).num_attempts == 2


def test_the_lines_of_a_batch_whose_key_is_revoked_fail_with_401(client, served, keys):
    from webapp.keys.models import ApiKey

    file = upload(client, keys["alice"], jsonl([request_line(i, p) for i, p in enumerate(PROMPTS[:2])])).json()
    public_id = client.post("/v1/batches", json.dumps({"input_file_id": file["id"], "endpoint": "/v1/completions",
                                                       "completion_window": "24h"}),
                            content_type="application/json", **auth(keys["alice"])).json()["id"]
    ApiKey.objects.filter(owner__username="alice").update(is_revoked=True)

    assert batch_run(batch_id=Batch.objects.get(public_id=public_id).pk) == "completed"
    batch = Batch.objects.get(public_id=public_id)
    with batch.error_file.content.open("rb") as handle:
        errors = [json.loads(line) for line in handle.read().splitlines()]
    assert (batch.num_completed, batch.num_failed) == (0, 2)
    assert [e["response"]["status_code"] for e in errors] == [401, 401]
    assert errors[0]["response"]["body"]["error"]["code"] == "invalid_api_key"


def test_a_line_larger_than_the_keys_token_rate_fails_at_once_while_the_others_run(client, served, keys):
    from webapp.keys.models import ApiKey

    ApiKey.objects.filter(owner__username="alice").update(max_tokens_per_minute=60)
    lines = [request_line(0, "short"), request_line(1, "long", max_tokens=100)]  # 100 > 60: never fits
    file = upload(client, keys["alice"], jsonl(lines)).json()
    public_id = client.post("/v1/batches", json.dumps({"input_file_id": file["id"], "endpoint": "/v1/completions",
                                                       "completion_window": "24h"}),
                            content_type="application/json", **auth(keys["alice"])).json()["id"]

    assert batch_run(batch_id=Batch.objects.get(public_id=public_id).pk) == "completed"
    batch = Batch.objects.get(public_id=public_id)
    with batch.error_file.content.open("rb") as handle:
        errors = [json.loads(line) for line in handle.read().splitlines()]
    assert (batch.num_completed, batch.num_failed) == (1, 1)
    assert errors[0]["custom_id"] == "req-1" and errors[0]["response"]["status_code"] == 429
    assert BatchLine.objects.get(batch=batch, line_number=2).num_attempts == 1
