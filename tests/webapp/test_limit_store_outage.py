"""The limit store's Redis goes away (distributed mode) and comes back: requests are shed fast with
503 queue_unavailable + Retry-After in the OpenAI error format, each leaves exactly one usage
record, the budget (in the database) is settled all the same, what could not be given back to
Redis is given back once it returns, and requests succeed again with nothing restarted.

A private redis-server per test, killed (SIGKILL) and restarted on the same port; a snapshot taken
just before the kill keeps what it held, as a Redis with persistence keeps it. The real ASGI application is driven as Daphne drives it; an embedded worker serves the tiny
Llama for the API and another for the chat page (the request queue stays in-process: only the
limit store is in Redis); the fixtures are those of test_key_limits, test_chat_consumer and
test_redis_faults.
"""

import asyncio
import json
import logging
import time

import pytest
import redis
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.contrib.auth import get_user_model

from tests.webapp.test_chat_consumer import (alice, chat_worker, communicator, models,  # noqa: F401 (fixtures)
                                             receive_until, session_cookie)
from tests.webapp.test_chat_consumer import turn as chat_turn
from tests.webapp.test_key_limits import MODEL, served, worker  # noqa: F401 (fixtures)
from tests.workers.test_redis_faults import RedisProcess, own_redis  # noqa: F401 (fixture)
from webapp.chat import consumers
from webapp.chat.models import Message
from webapp.config.asgi import application
from webapp.keys import enforcement, limits
from webapp.keys.enforcement import apikey_running_requests
from webapp.keys.limits import RedisLimitStore
from webapp.keys.models import TokenReservation
from webapp.keys.services import apikey_create
from webapp.openai_api import generation, lifecycle
from webapp.openai_api.errors import LIMITS_UNAVAILABLE_MESSAGE
from webapp.usage.models import UsageRecord

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.db_engine]

REFUSAL_S = 3.0  # the most a refusal may take while Redis is down


def kill(server: RedisProcess) -> None:
    """SIGKILL, its data kept as a Redis with persistence keeps it (a snapshot taken just before)."""
    client = redis.Redis.from_url(server.url)
    try:
        client.save()
    finally:
        client.close()
    server.kill()


@pytest.fixture
def store(own_redis, monkeypatch):
    """The limit store of the API and the chat, in the test's Redis (as with REDIS_URL set)."""
    store = RedisLimitStore(own_redis.url, prefix="outage:")
    monkeypatch.setattr(enforcement, "get_limit_store", lambda: store)
    monkeypatch.setattr(consumers, "get_limit_store", lambda: store)
    monkeypatch.setattr(limits, "UNAVAILABLE_RECHECK_S", 0.1)  # retried at once after the restart
    return store


@pytest.fixture
def api_key(served):
    """A key with every limit: each step of admission and settlement goes to the store or the budget."""
    return apikey_create(owner=get_user_model().objects.create_user("carol"), name="limited",
                         max_concurrent_requests=1, max_requests_per_minute=100, max_tokens_per_minute=10_000,
                         token_budget=10_000)


async def request(raw_key: str, stream: bool) -> tuple[int, dict, bytes]:
    """POST v1/completions through the ASGI app: (status, headers, whole body)."""
    app = ApplicationCommunicator(application, {
        "type": "http", "http_version": "1.1", "method": "POST", "path": "/v1/completions",
        "raw_path": b"/v1/completions", "query_string": b"", "root_path": "", "scheme": "http",
        "server": ("testserver", 80), "client": ("127.0.0.1", 5000),
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                    (b"authorization", f"Bearer {raw_key}".encode())]})
    await app.send_input({"type": "http.request", "body": json.dumps(
        {"model": MODEL, "prompt": "Hello there", "max_tokens": 4, "temperature": 0, "ignore_eos": True,
         "stream": stream}).encode()})
    start = await app.receive_output(30)
    body = b""
    while True:
        message = await app.receive_output(30)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await app.wait(10)
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def assert_served(status: int, body: bytes, stream: bool) -> None:
    assert status == 200, body
    if stream:
        assert body.rstrip().endswith(b"data: [DONE]")
    else:
        assert json.loads(body)["choices"][0]["text"]


def assert_shed(status: int, headers: dict, body: bytes) -> None:
    assert status == 503, body
    assert headers["Retry-After"] == "5"
    assert json.loads(body) == {"error": {"message": LIMITS_UNAVAILABLE_MESSAGE, "type": "server_error",
                                          "param": None, "code": "queue_unavailable"}}


def records() -> list[tuple]:
    return list(UsageRecord.objects.order_by("pk").values_list("status", "error_code", "prompt_tokens",
                                                                "completion_tokens"))


def raw_count(own_redis, key: str) -> int:
    """What Redis itself holds, read without the store (which would first replay what it deferred)."""
    client = redis.Redis.from_url(own_redis.url)
    try:
        return client.zcard(key)
    finally:
        client.close()


def killing_after(real, own_redis):
    """``real`` (sync), then Redis is killed: the outage begins right after that step."""
    def wrapped(*args, **kwargs):
        result = real(*args, **kwargs)
        kill(own_redis)
        return result
    return wrapped


OUTAGES = [(when, stream) for when in ("before admission", "after admission") for stream in (False, True)]


@pytest.mark.slow
@pytest.mark.parametrize(("when", "stream"), OUTAGES,
                         ids=[f"{w.replace(' ', '-')}-{'streamed' if s else 'collected'}" for w, s in OUTAGES])
async def test_an_outage_is_shed_fast_with_one_record_and_requests_succeed_once_redis_is_back(
        api_key, store, own_redis, monkeypatch, when, stream):
    key, raw = api_key
    running_name = f"outage:{{s:{enforcement._names(key)[2]}}}"
    real_admit = lifecycle.generation_admit
    if when == "before admission":
        kill(own_redis)
    else:  # the slot and the minute's request are taken, then the token window cannot be reached
        monkeypatch.setattr(lifecycle, "generation_admit", killing_after(lifecycle.generation_admit, own_redis))

    started = time.monotonic()
    status, headers, body = await request(raw, stream)
    elapsed = time.monotonic() - started

    assert_shed(status, headers, body)  # streamed too: admission ends before any event is sent
    assert elapsed < REFUSAL_S, f"refused after {elapsed:.2f} s"
    assert await sync_to_async(records)() == [("error", "queue_unavailable", 0, 0)]
    await sync_to_async(key.refresh_from_db)()
    assert (key.tokens_used, key.tokens_reserved) == (0, 0)
    assert not await sync_to_async(TokenReservation.objects.exists)()
    print(f"\n[{when}, {'streamed' if stream else 'collected'}] 503 queue_unavailable in {elapsed * 1000:.0f} ms")

    monkeypatch.setattr(lifecycle, "generation_admit", real_admit)
    own_redis.start()  # same port, what it held kept (append-only file)
    if when == "after admission":
        assert raw_count(own_redis, running_name) == 1  # the slot taken before the outage is still there
    await asyncio.sleep(0.2)  # past UNAVAILABLE_RECHECK_S

    status, _, body = await request(raw, stream)

    assert_served(status, body, stream)
    _, (served_status, _, prompt, completion) = await sync_to_async(records)()
    assert served_status == "ok" and prompt and completion
    await sync_to_async(key.refresh_from_db)()
    assert (key.tokens_used, key.tokens_reserved) == (prompt + completion, 0)
    # The slot the refused request held was given back once Redis returned (not left to its 1 h expiry).
    assert await sync_to_async(apikey_running_requests)(api_key=key) == 0
    assert raw_count(own_redis, running_name) == 0


async def test_an_outage_during_the_generation_still_records_it_settles_the_budget_and_gives_back_later(
        api_key, store, own_redis, monkeypatch, caplog):
    key, raw = api_key
    _, tokens_name, running_name = enforcement._names(key)
    real_prepare = generation.generation_prepare
    monkeypatch.setattr(generation, "generation_prepare", killing_after(real_prepare, own_redis))

    with caplog.at_level(logging.WARNING, logger="webapp.keys.limits"):
        status, _, body = await request(raw, stream=True)

    assert_served(status, body, stream=True)  # the generation itself needs no limit store
    [(record_status, error_code, prompt, completion)] = await sync_to_async(records)()
    assert (record_status, error_code) == ("ok", "")
    await sync_to_async(key.refresh_from_db)()
    assert (key.tokens_used, key.tokens_reserved) == (prompt + completion, 0)  # settled in the database
    assert not await sync_to_async(TokenReservation.objects.exists)()
    assert any("deferred" in r.getMessage() for r in caplog.records)

    monkeypatch.setattr(generation, "generation_prepare", real_prepare)
    own_redis.start()
    assert raw_count(own_redis, f"outage:{{s:{running_name}}}") == 1  # still held in Redis
    await asyncio.sleep(0.2)

    assert await sync_to_async(apikey_running_requests)(api_key=key) == 0  # replayed on the first call
    # The token window holds the real count, not the worst case reserved at admission.
    assert await sync_to_async(store.window_total)(tokens_name, time.time()) == prompt + completion
    status, _, body = await request(raw, stream=False)
    assert_served(status, body, stream=False)
    assert [r[0] for r in await sync_to_async(records)()] == ["ok", "ok"]
    assert await sync_to_async(apikey_running_requests)(api_key=key) == 0


@pytest.mark.slow
async def test_the_chat_answers_an_outage_with_an_error_frame_and_works_again_once_redis_is_back(
        models, session_cookie, chat_worker, store, own_redis):
    turn = chat_turn(content="Hello", max_tokens=4)
    ws = communicator(session_cookie)
    assert (await ws.connect())[0]
    await ws.send_to(text_data="not json")  # answered once connect() has held the socket's place
    assert (await ws.receive_json_from(timeout=10))["code"] == "invalid_json"
    kill(own_redis)

    started = time.monotonic()
    await ws.send_json_to(turn)
    refused = await ws.receive_json_from(timeout=10)
    elapsed = time.monotonic() - started

    assert refused["type"] == "error" and refused["code"] == "queue_unavailable", refused
    assert refused["retry_after"] == 5 and refused["message"]
    assert elapsed < REFUSAL_S
    assert await sync_to_async(Message.objects.count)() == 0  # refused before anything was saved
    # A new socket cannot be counted against the user's bound: told why, closed "try again later".
    second = communicator(session_cookie)
    assert (await second.connect())[0]
    told = await second.receive_json_from(timeout=10)
    assert told["type"] == "error" and told["code"] == "queue_unavailable"
    assert (await second.receive_output(10)) == {"type": "websocket.close", "code": consumers.TRY_AGAIN_LATER}

    own_redis.start()
    await asyncio.sleep(0.2)
    await ws.send_json_to(turn)  # the same socket: it survived the outage
    answer = await receive_until(ws, "done", "error")
    await ws.disconnect()

    assert answer[-1]["type"] == "done", answer[-1]
    assert await sync_to_async(list)(UsageRecord.objects.values_list("status", flat=True)) == ["ok"]
    assert await sync_to_async(Message.objects.count)() == 2
