"""The Batch API through the official openai client against Daphne in embedded mode (the batch job
runs in a thread of the server): 50 lines complete with one output line per custom_id, cancelling
stops the rest, bad files are refused naming the line, another user sees nothing, and a server
killed mid-batch finishes the batch after its restart without losing a line."""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import time

import openai
import pytest

from tests.e2e.sites import TINY_SETTINGS, make_site, readyz_ok

pytestmark = pytest.mark.e2e

MODEL = "tiny"
ENV = {"PAGODA_EMBEDDED_WORKERS": "1", "PAGODA_BATCH_MAX_IN_FLIGHT": "4", "PAGODA_BATCH_HEARTBEAT_S": "0.5"}


@pytest.fixture(scope="module")
def site(tmp_path_factory, tiny_llama_dir):
    site = make_site(tmp_path_factory.mktemp("batch_site"))
    site.manage("register_model", MODEL, str(tiny_llama_dir), "--engine-settings", json.dumps(TINY_SETTINGS))
    site.manage("shell", "-c", "from django.contrib.auth import get_user_model; "
                               "get_user_model().objects.create_user('bob')")
    site.keys = {"owner": site.create_key("batches"), "bob": site.manage("create_api_key", "--name", "bob's", "--user", "bob").strip().splitlines()[-1]}
    site.daphne = site.start_daphne(ENV)
    try:
        site.wait_until(lambda: readyz_ok(site), "the embedded worker for tiny coming up")
        yield site
    finally:
        site.stop()


def client(site, who: str = "owner") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{site.url}/v1", api_key=site.keys[who], max_retries=0, timeout=60)


def jsonl(num_lines: int, *, max_tokens: int, url: str = "/v1/chat/completions",
          short: int | None = None) -> bytes:
    """``short``: every fourth line (0, 4, ...) asks for that many tokens instead."""
    lines = []
    for i in range(num_lines):
        tokens = short if short is not None and i % 4 == 0 else max_tokens
        body = ({"model": MODEL, "messages": [{"role": "user", "content": f"Question number {i}"}]}
                if url == "/v1/chat/completions" else {"model": MODEL, "prompt": f"Story {i}:"})
        lines.append({"custom_id": f"line-{i}", "method": "POST", "url": url,
                      "body": {**body, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}})
    return "\n".join(json.dumps(line) for line in lines).encode() + b"\n"


def start_batch(api: openai.OpenAI, content: bytes, url: str = "/v1/chat/completions"):
    file = api.files.create(file=("requests.jsonl", io.BytesIO(content)), purpose="batch")
    return file, api.batches.create(input_file_id=file.id, endpoint=url, completion_window="24h",
                                    metadata={"suite": "e2e"})


def wait_for(api: openai.OpenAI, batch_id: str, ready, timeout: float = 120.0, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        batch = api.batches.retrieve(batch_id)
        if ready(batch):
            return batch
        assert batch.status != "failed", batch.errors
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch.request_counts}"
        time.sleep(poll_s)


def aborted_records(site) -> int:
    with sqlite3.connect(site.db_path) as db:
        return db.execute("SELECT COUNT(*) FROM usage_usagerecord WHERE status = 'aborted'").fetchone()[0]


def read_file(api: openai.OpenAI, file_id: str) -> list[dict]:
    return [json.loads(line) for line in api.files.content(file_id).text.splitlines()]


def test_a_batch_of_50_lines_completes_with_one_output_line_per_custom_id(site):
    api = client(site)
    file, batch = start_batch(api, jsonl(50, max_tokens=4))

    started = time.monotonic()
    done = wait_for(api, batch.id, lambda b: b.status in ("completed", "failed", "cancelled"))
    print(f"50 lines x 4 tokens: {time.monotonic() - started:.1f} s")

    assert (file.purpose, file.status, file.bytes) == ("batch", "processed", len(jsonl(50, max_tokens=4)))
    assert api.files.retrieve(file.id).id == file.id and file.id in [f.id for f in api.files.list().data]
    assert batch.status == "validating" and batch.metadata == {"suite": "e2e"}
    assert done.status == "completed" and done.error_file_id is None and done.model == MODEL
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (50, 50, 0)
    assert done.created_at <= done.in_progress_at <= done.finalizing_at <= done.completed_at
    results = read_file(api, done.output_file_id)
    assert sorted(r["custom_id"] for r in results) == sorted(f"line-{i}" for i in range(50))
    for result in results:
        body = result["response"]["body"]
        assert result["error"] is None and result["response"]["status_code"] == 200
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 4
        assert site.usage(result["response"]["request_id"])["status"] == "ok"
    assert done.usage.output_tokens == 50 * 4
    assert api.files.retrieve(done.output_file_id).purpose == "batch_output"
    assert batch.id in [b.id for b in api.batches.list(limit=5).data]


def test_cancelling_a_running_batch_stops_the_rest_and_aborts_the_running_lines(site):
    """The cancel comes just after the first line ended. The first four lines start together and
    the first of them asks for 40 tokens, the other three for 200, so those three still have 160
    steps to go when the runner sees the cancel (its next look at the batch, within half a 0.5 s
    heartbeat): a cancel always finds lines running. (With lines of one length a wave ends
    together, and a cancel landing between two waves finds none.)"""
    api = client(site)
    aborted_before = aborted_records(site)
    _, batch = start_batch(api, jsonl(30, max_tokens=200, short=40, url="/v1/completions"),
                           url="/v1/completions")
    wait_for(api, batch.id, lambda b: b.request_counts is not None and b.request_counts.completed >= 1, poll_s=0.1)

    cancelling = api.batches.cancel(batch.id)
    done = wait_for(api, batch.id, lambda b: b.status == "cancelled", timeout=30)

    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    assert 1 <= done.request_counts.completed < 30 and done.cancelled_at
    outputs, errors = read_file(api, done.output_file_id), read_file(api, done.error_file_id)
    assert len(outputs) + len(errors) == 30
    assert len({r["custom_id"] for r in outputs + errors}) == 30
    assert all(e["error"]["code"] == "batch_cancelled" and e["response"] is None for e in errors)
    # The lines running at the cancel (at most 4) are aborted: failed, each with its aborted usage
    # record; the rest never ran.
    aborted = [e for e in errors if "while this request ran" in e["error"]["message"]]
    assert 1 <= done.request_counts.failed == len(aborted) <= 4, done.request_counts
    assert len(errors) == 30 - done.request_counts.completed
    assert aborted_records(site) - aborted_before == len(aborted)
    with_requests = [r["response"]["request_id"] for r in outputs]
    assert all(site.usage(request_id)["status"] == "ok" for request_id in with_requests)


def test_bad_files_and_bad_batches_are_refused_with_the_line_and_field(site):
    api = client(site)
    good = json.loads(jsonl(1, max_tokens=4).decode())
    bad = jsonl(1, max_tokens=4) + json.dumps({**good, "custom_id": "other", "body": {**good["body"], "top_p": 3}}).encode() + b"\n"

    with pytest.raises(openai.BadRequestError) as bad_line:
        api.files.create(file=("bad.jsonl", io.BytesIO(bad)), purpose="batch")
    with pytest.raises(openai.BadRequestError) as duplicate:
        api.files.create(file=("dup.jsonl", io.BytesIO(jsonl(1, max_tokens=4) * 2)), purpose="batch")
    file = api.files.create(file=("ok.jsonl", io.BytesIO(jsonl(1, max_tokens=4))), purpose="batch")
    with pytest.raises(openai.BadRequestError) as window:
        api.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="1h")
    with pytest.raises(openai.NotFoundError) as missing:
        api.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")

    assert bad_line.value.body["message"].startswith("Line 2: body.top_p:")
    assert duplicate.value.body["message"].startswith("Line 2: custom_id:")
    assert window.value.body["param"] == "completion_window"
    assert missing.value.body["param"] == "input_file_id"
    assert api.files.delete(file.id).deleted
    with pytest.raises(openai.NotFoundError):
        api.files.retrieve(file.id)


def test_another_users_key_finds_neither_the_files_nor_the_batches(site):
    owner, bob = client(site), client(site, "bob")
    file, batch = start_batch(owner, jsonl(2, max_tokens=4))

    for call in (lambda: bob.files.retrieve(file.id), lambda: bob.files.content(file.id),
                 lambda: bob.batches.retrieve(batch.id), lambda: bob.batches.cancel(batch.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert bob.files.list().data == [] and bob.batches.list().data == []
    wait_for(owner, batch.id, lambda b: b.status == "completed")


def test_a_server_killed_mid_batch_finishes_it_after_the_restart_without_losing_a_line(site):
    api = client(site)
    _, batch = start_batch(api, jsonl(16, max_tokens=48, url="/v1/completions"), url="/v1/completions")
    wait_for(api, batch.id, lambda b: b.request_counts is not None and b.request_counts.completed >= 2)

    os.killpg(site.daphne.pid, signal.SIGKILL)  # no drain: lines are left running in the database
    site.daphne.wait(10)
    site.procs.remove(site.daphne)
    site.daphne = site.start_daphne(ENV)
    site.wait_until(lambda: readyz_ok(site), "the restarted server")
    done = wait_for(api, batch.id, lambda b: b.status in ("completed", "failed", "cancelled"), timeout=180)

    assert done.status == "completed"
    assert done.error_file_id is None, read_file(api, done.error_file_id)
    assert (done.request_counts.completed, done.request_counts.failed) == (16, 0)
    results = read_file(api, done.output_file_id)
    assert sorted(r["custom_id"] for r in results) == sorted(f"line-{i}" for i in range(16))
    assert all(r["response"]["body"]["usage"]["completion_tokens"] == 48 for r in results)
