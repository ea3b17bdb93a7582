"""A client that hangs up at any moment, from admission to the last event, streaming or not, leaves
exactly one usage record and holds nothing: its concurrency slot is free at once.

The real ASGI application (webapp.config.asgi) is driven with asgiref's ApplicationCommunicator, so
the hang-up is a real ``http.disconnect`` and Django cancels the view as it does under Daphne. Each
stage is held open by a hook (the real step runs, then it waits) so that the hang-up lands there.
"""

import asyncio
import json
import threading

import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.contrib.auth import get_user_model

from webapp.config.asgi import application, http_gate
from webapp.keys.enforcement import apikey_running_requests
from webapp.keys.services import apikey_create
from webapp.openai_api import generation, lifecycle, prompts
from webapp.usage.models import UsageRecord
from workers.protocol import Chunk

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def api_key(workerless_model):
    return apikey_create(owner=get_user_model().objects.create_user("alice"), name="one at a time",
                         max_concurrent_requests=1)


def post(raw_key: str, path: str) -> ApplicationCommunicator:
    """The ASGI application, as Daphne starts it for a POST of JSON to ``path`` with the key."""
    return ApplicationCommunicator(application, {
        "type": "http", "http_version": "1.1", "method": "POST", "path": path, "raw_path": path.encode(),
        "query_string": b"", "root_path": "", "scheme": "http", "server": ("testserver", 80),
        "client": ("127.0.0.1", 5000),
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                    (b"authorization", f"Bearer {raw_key}".encode())]})


class Hold:
    """Lets a stage's real work run, then holds it (in its thread or on the loop) until released."""

    def __init__(self):
        self.reached, self.released = threading.Event(), threading.Event()

    def wrap_sync(self, real):
        def held(*args, **kwargs):
            result = real(*args, **kwargs)
            self.reached.set()
            self.released.wait(10)
            return result
        return held

    async def wait_reached(self):
        for _ in range(1000):
            if self.reached.is_set():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the stage was never reached")


class HangingEngine:
    """An engine client whose generation sends ``first`` (if any), then nothing until it is closed."""

    def __init__(self, hold: Hold, first: Chunk | None = None):
        self.hold, self.first, self.closed, self.aborted = hold, first, False, []

    async def generate(self, req):
        try:
            if self.first is not None:
                yield Chunk(req.request_id, **self.first)
            self.hold.reached.set()
            await asyncio.Event().wait()
        finally:
            self.closed = True

    async def abort(self, model, request_id):
        self.aborted.append(request_id)


FIRST = dict(text="Once", token_ids=[1], logprobs=None, finished=False, finish_reason=None, num_prompt_tokens=3,
             num_output_tokens=1, num_cached_tokens=0, time_to_first_token=0.01)

# Every await between admission and the end (a collected response has no middle: it is sent whole).
MATRIX = [(stage, stream) for stage in ("admission", "tokenizing", "waiting for the first chunk")
          for stream in (False, True)] + [("mid-stream", True)]


@pytest.mark.parametrize(("stage", "stream"), MATRIX, ids=[f"{s}-{'streamed' if t else 'collected'}" for s, t in MATRIX])
async def test_a_hang_up_at_any_stage_frees_the_slot_and_leaves_one_usage_record(api_key, monkeypatch, stage,
                                                                                 stream):
    key, raw = api_key
    hold, engine = Hold(), None
    if stage == "admission":
        monkeypatch.setattr(lifecycle, "generation_admit", hold.wrap_sync(lifecycle.generation_admit))
    elif stage == "tokenizing":
        monkeypatch.setattr(generation, "generation_prepare", hold.wrap_sync(generation.generation_prepare))
    else:
        engine = HangingEngine(hold, FIRST if stage == "mid-stream" else None)
        monkeypatch.setattr(prompts, "get_engine_client", lambda redis_url: engine)

    app = post(raw, "/v1/chat/completions")
    await app.send_input({"type": "http.request", "body": json.dumps(
        {"model": "tiny", "messages": HELLO, "stream": stream}).encode()})
    await hold.wait_reached()
    if stage == "mid-stream":  # the client has its first event when it leaves
        assert (await app.receive_output(5))["status"] == 200
        body = b""
        while b"Once" not in body:
            body += (await app.receive_output(5))["body"]
    assert await sync_to_async(apikey_running_requests)(api_key=key) == 1
    assert http_gate.in_flight == 1  # counted by the gate in front of Django (webapp/config/gate.py)

    await app.send_input({"type": "http.disconnect"})
    await asyncio.sleep(0.2)  # the view is cancelled while the stage still holds
    hold.released.set()
    await app.wait(10)

    records = await sync_to_async(list)(UsageRecord.objects.values("status", "request_id"))
    assert [r["status"] for r in records] == ["aborted"]
    assert await sync_to_async(apikey_running_requests)(api_key=key) == 0
    if engine is not None:  # the generation was closed, so the engine drops it
        assert engine.closed
    assert not generation.tracked(records[0]["request_id"])  # nothing left for the drain at shutdown
    assert http_gate.in_flight == 0  # and its place at the gate given back


async def test_a_request_that_finishes_also_leaves_one_record_and_frees_its_slot(api_key, monkeypatch):
    """The control: no hang-up, no worker (no_worker 503), one error record, the slot free."""
    key, raw = api_key
    app = post(raw, "/v1/completions")
    await app.send_input({"type": "http.request", "body": b'{"model": "tiny", "prompt": "hi"}'})

    assert (await app.receive_output(10))["status"] == 503
    await app.wait(10)
    assert await sync_to_async(list)(UsageRecord.objects.values_list("status", "error_code")) == [("error", "no_worker")]
    assert await sync_to_async(apikey_running_requests)(api_key=key) == 0
