"""Background responses (``background: true``): stored queued then in_progress while they run, held
to the key's concurrency limit and to its background places before they are answered, and
cancelled in this process (the task) or in another one (the workers' abort), the stored status
then staying cancelled. An engine client that holds each request open stands in for the worker."""

import asyncio
import json
import threading

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import AsyncClient

from webapp.keys.enforcement import apikey_background_count, apikey_running_requests
from webapp.keys.services import apikey_create
from webapp.openai_api import generation, prompts, responses_views
from webapp.usage.models import UsageRecord
from workers.protocol import Chunk

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


class HeldEngine:
    """Each request sends one chunk, then waits until it is closed or aborted (then it ends, as a
    worker ends an aborted request: a last chunk finished "abort")."""

    def __init__(self):
        self.closed: list[str] = []
        self.aborted: list[str] = []
        self.started = asyncio.Event()
        self._aborts: dict[str, asyncio.Event] = {}

    async def generate(self, req):
        abort = self._aborts.setdefault(req.request_id, asyncio.Event())
        try:
            yield Chunk(req.request_id, "Hi", [1], None, False, None, 5, 1, 0, 0.01)
            self.started.set()
            await abort.wait()
            yield Chunk(req.request_id, "", [], None, True, "abort", 5, 1, 0, 0.01)
        finally:
            self.closed.append(req.request_id)

    async def abort(self, model, request_id):
        self.aborted.append(request_id)
        self._aborts.setdefault(request_id, asyncio.Event()).set()


@pytest.fixture
def engine(monkeypatch):
    held = HeldEngine()
    monkeypatch.setattr(prompts, "get_engine_client", lambda redis_url: held)
    monkeypatch.setattr(responses_views, "get_engine_client", lambda redis_url: held)
    return held


@pytest.fixture
def api_key(workerless_model):
    return apikey_create(owner=get_user_model().objects.create_user("bg"), name="bg", max_concurrent_requests=2)


async def call(raw: str, method: str, path: str, body: dict | None = None):
    client = AsyncClient()
    kwargs = {"headers": {"Authorization": f"Bearer {raw}"}}
    if body is not None:
        kwargs.update(data=json.dumps(body), content_type="application/json")
    return await getattr(client, method)(path, **kwargs)


async def start(raw: str) -> dict:
    response = await call(raw, "post", "/v1/responses",
                          {"model": "tiny", "input": "Say hi.", "background": True, "max_output_tokens": 50})
    assert response.status_code == 200, response.content
    return response.json()


async def status(raw: str, response_id: str) -> str:
    return (await call(raw, "get", f"/v1/responses/{response_id}")).json()["status"]


async def test_a_running_background_response_is_in_progress_holds_a_slot_and_cancels(api_key, engine):
    key, raw = api_key
    queued = await start(raw)
    assert queued["status"] == "queued" and queued["background"] is True

    await asyncio.wait_for(engine.started.wait(), 10)
    assert await status(raw, queued["id"]) == "in_progress"
    assert await sync_to_async(apikey_running_requests)(api_key=key) == 1  # the key's concurrency counts it
    assert await sync_to_async(apikey_background_count)(api_key=key) == 1

    cancelled = await call(raw, "post", f"/v1/responses/{queued['id']}/cancel")

    assert cancelled.json()["status"] == "cancelled" == await status(raw, queued["id"])
    assert engine.closed == [queued["id"]]  # the engine request was closed, so aborted
    record = await UsageRecord.objects.aget(request_id=queued["id"])
    assert record.status == "aborted"
    assert await sync_to_async(apikey_running_requests)(api_key=key) == 0
    assert await sync_to_async(apikey_background_count)(api_key=key) == 0


async def test_a_key_over_its_limits_is_refused_at_once_not_queued(api_key, engine, monkeypatch):
    key, raw = api_key
    monkeypatch.setattr(responses_views, "MAX_BACKGROUND_PER_KEY", 1)
    first = await start(raw)
    await asyncio.wait_for(engine.started.wait(), 10)

    over_places = await call(raw, "post", "/v1/responses", {"model": "tiny", "input": "x", "background": True})

    assert over_places.status_code == 429 and "background responses" in over_places.json()["error"]["message"]
    refused = await UsageRecord.objects.aget(request_id=over_places["X-Request-Id"])
    assert refused.status == "error" and refused.error_code == "rate_limit_exceeded"
    await call(raw, "post", f"/v1/responses/{first['id']}/cancel")


async def test_a_key_at_its_concurrency_limit_gets_a_429_for_a_background_response(api_key, engine):
    key, raw = api_key
    running = [await start(raw), await start(raw)]  # max_concurrent_requests=2, admitted before answering
    assert await sync_to_async(apikey_running_requests)(api_key=key) == 2

    third = await call(raw, "post", "/v1/responses", {"model": "tiny", "input": "x", "background": True})

    assert third.status_code == 429 and third.json()["error"]["code"] == "rate_limit_exceeded"
    assert await sync_to_async(apikey_background_count)(api_key=key) == 2  # the refused one took no place
    for response in running:
        await call(raw, "post", f"/v1/responses/{response['id']}/cancel")


async def test_a_cancel_from_another_process_aborts_in_the_workers_and_stays_cancelled(api_key, engine):
    key, raw = api_key
    queued = await start(raw)
    await asyncio.wait_for(engine.started.wait(), 10)
    task = responses_views.BACKGROUND.pop(queued["id"])  # as if it ran in another web process

    cancelled = await call(raw, "post", f"/v1/responses/{queued['id']}/cancel")
    await asyncio.wait_for(task, 10)  # the abort ends its generation there

    assert engine.aborted == [queued["id"]]
    assert cancelled.json()["status"] == "cancelled" == await status(raw, queued["id"])
    record = await UsageRecord.objects.aget(request_id=queued["id"])
    assert record.status != "running"
    assert await sync_to_async(apikey_running_requests)(api_key=key) == 0
    assert await sync_to_async(apikey_background_count)(api_key=key) == 0


async def test_a_response_cancelled_before_its_generation_begins_is_recorded_aborted_and_frees_its_slots(
        api_key, engine, monkeypatch):
    # Its task held where the generation would begin (on a busy server, the thread marking it
    # in_progress): the cancel lands there, before any usage record of the generation's own.
    held = asyncio.Event()

    async def not_begun(**_kwargs):
        held.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(responses_views, "completion_continue", not_begun)
    key, raw = api_key
    queued = await start(raw)
    await asyncio.wait_for(held.wait(), 10)

    cancelled = await call(raw, "post", f"/v1/responses/{queued['id']}/cancel")

    assert cancelled.json()["status"] == "cancelled"
    record = await UsageRecord.objects.aget(request_id=queued["id"])
    assert (record.status, record.prompt_tokens, record.completion_tokens) == ("aborted", 0, 0)
    assert engine.closed == [] and engine.aborted == []
    assert await sync_to_async(apikey_running_requests)(api_key=key) == 0
    assert await sync_to_async(apikey_background_count)(api_key=key) == 0


async def test_a_cancel_while_the_generation_is_being_prepared_leaves_one_record_aborted(api_key, engine, monkeypatch):
    # The POST that started the response has ended; its generation is inside generation_prepare (a
    # thread: tokenizing, reserving, writing the running record) when the cancel comes. The
    # cancel's record must wait for that thread, not race it from another.
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()
    real = generation.generation_prepare

    def held_prepare(**kwargs):
        entered.set()
        release.wait(10)
        try:
            return real(**kwargs)
        finally:
            finished.set()

    monkeypatch.setattr(generation, "generation_prepare", held_prepare)
    key, raw = api_key
    queued = await start(raw)
    await asyncio.wait_for(asyncio.to_thread(entered.wait, 10), 15)
    task = responses_views.BACKGROUND[queued["id"]]

    cancelling = asyncio.create_task(call(raw, "post", f"/v1/responses/{queued['id']}/cancel"))
    while not task.cancelling():
        await asyncio.sleep(0.01)
    release.set()
    cancelled = await asyncio.wait_for(cancelling, 15)
    await asyncio.wait_for(asyncio.to_thread(finished.wait, 10), 15)

    assert cancelled.json()["status"] == "cancelled"
    records = [r async for r in UsageRecord.objects.filter(request_id=queued["id"])]
    assert [(r.status, r.completion_tokens) for r in records] == [("aborted", 0)]
    assert engine.closed == []
    assert await sync_to_async(apikey_running_requests)(api_key=key) == 0
    assert await sync_to_async(apikey_background_count)(api_key=key) == 0
