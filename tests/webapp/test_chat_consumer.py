"""The chat WebSocket end to end inside this process: real auth middleware and sessions, the
embedded in-memory transport and an embedded worker serving the tiny random Llama."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from engine import SamplingParams
from engine.text.tokenizer import apply_chat_template
from webapp.chat.models import Message
from webapp.config.asgi import application
from webapp.registry.models import Model, ModelVersion
from webapp.usage.models import UsageRecord
from workers import embedded
from workers.connect import get_engine_client

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "tiny-chat"
ENGINE_SETTINGS = {"num_kv_blocks": 64, "max_model_len": 512, "max_num_seqs": 4}
TIMEOUT = 30


@pytest.fixture(scope="module")
def chat_worker(tiny_llama_dir):
    embedded.start_embedded_worker(MODEL, "1", str(tiny_llama_dir), ENGINE_SETTINGS)
    assert embedded.wait_for_embedded_worker(MODEL, timeout=90)
    yield get_engine_client(None)
    embedded.stop_embedded_workers(drain_timeout=5)


@pytest.fixture
def models(smollm2_tokenizer_dir, tiny_llama_dir):
    """"tiny-chat" has a worker; "nobody" is active but no worker serves it."""
    for slug in (MODEL, "nobody"):
        ModelVersion.objects.create(model=Model.objects.create(slug=slug), number=1, path=str(tiny_llama_dir),
                                    format="hf", status="active", tokenizer_dir=str(smollm2_tokenizer_dir))


@pytest.fixture
def alice():
    return get_user_model().objects.create_user("alice", password="pw")


@pytest.fixture
def session_cookie(alice) -> bytes:
    client = Client()
    client.force_login(alice)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


def communicator(cookie: bytes | None = None, origin: bytes = b"http://127.0.0.1:8000") -> WebsocketCommunicator:
    headers = [(b"host", b"127.0.0.1:8000"), (b"origin", origin)]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, "/ws/chat/", headers=headers)


async def receive_until(ws: WebsocketCommunicator, *types: str) -> list[dict]:
    """Every message up to and including the first of one of ``types``."""
    received = []
    while True:
        message = await ws.receive_json_from(timeout=TIMEOUT)
        received.append(message)
        if message["type"] in types:
            return received


def turn(**fields) -> dict:
    return {"type": "send", "model": MODEL, "temperature": 0, "max_tokens": 12, "system_prompt": "", **fields}


def worker_stats(client) -> dict:
    return client.live_workers(MODEL)[0].stats


async def stats_when(client, predicate, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while not predicate(stats := worker_stats(client)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return stats


@pytest.mark.asyncio
async def test_anonymous_connection_is_refused(models):
    ws = communicator()
    connected, code = await ws.connect()
    assert not connected and code == 4401


@pytest.mark.asyncio
async def test_foreign_origin_is_refused_even_with_a_session(models, session_cookie):
    ws = communicator(session_cookie, origin=b"http://evil.example")
    connected, _ = await ws.connect()
    assert not connected


@pytest.mark.slow
@pytest.mark.asyncio
async def test_turn_streams_deltas_then_the_saved_answer_and_the_next_turn_hits_the_prefix_cache(
        models, session_cookie, chat_worker, smollm2_hf_tokenizer, tiny_llama_dir):
    from engine import LLM

    ws = communicator(session_cookie)
    assert (await ws.connect())[0]
    await ws.send_json_to(turn(content="Hello there"))
    first = await receive_until(ws, "done", "error")
    await ws.send_json_to(turn(content="And then?", conversation=first[0]["conversation"]["id"]))
    second = await receive_until(ws, "done", "error")
    await ws.disconnect()

    start, *deltas, done = first
    assert start["type"] == "start" and start["user_message"]["content"] == "Hello there"
    assert done["type"] == "done", done
    assert deltas and all(d["type"] == "delta" for d in deltas)
    answer = "".join(d["text"] for d in deltas)
    assert done["message"]["content"] == answer
    # The reference: the engine's own chat template and greedy output on the same model.
    history = [{"role": "user", "content": "Hello there"}]
    prompt = apply_chat_template(smollm2_hf_tokenizer, history)
    reference = LLM(str(tiny_llama_dir), **ENGINE_SETTINGS).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=12))[0]
    assert answer == reference.text
    assert done["usage"]["prompt_tokens"] == len(prompt)
    assert done["usage"]["completion_tokens"] == len(reference.token_ids)
    assert done["tokens_per_s"] is None or done["tokens_per_s"] > 0

    history += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}]
    second_done = second[-1]
    assert second_done["type"] == "done", second_done
    assert second_done["usage"]["prompt_tokens"] == len(apply_chat_template(smollm2_hf_tokenizer, history))
    assert second_done["usage"]["cached_prompt_tokens"] > 0 and second_done["prefix_cache_hit"] > 0

    saved = await sync_to_async(lambda: [(m.role, m.content) for m in Message.objects.all()])()
    assert saved == [(m["role"], m["content"]) for m in history] + [("assistant", second_done["message"]["content"])]


@pytest.mark.asyncio
async def test_stop_aborts_the_generation_in_the_engine_and_keeps_the_partial_answer(
        models, session_cookie, chat_worker):
    aborted_before = worker_stats(chat_worker)["num_requests_finished"].get("abort", 0)
    ws = communicator(session_cookie)
    assert (await ws.connect())[0]
    await ws.send_json_to(turn(content="Tell me a long story", max_tokens=450))
    received = await receive_until(ws, "delta", "error")
    assert received[-1]["type"] == "delta"
    await ws.send_json_to({"type": "stop"})
    rest = await receive_until(ws, "done", "error")
    await ws.disconnect()

    done = rest[-1]
    assert done["type"] == "done" and done["finish_reason"] == "abort"
    assert 0 < done["usage"]["completion_tokens"] < 450
    stats = await stats_when(chat_worker, lambda s: s["num_running"] == 0
                             and s["num_requests_finished"].get("abort", 0) == aborted_before + 1)
    assert stats["num_running"] == 0 and stats["num_requests_finished"]["abort"] == aborted_before + 1
    message = await sync_to_async(Message.objects.get)(role="assistant")
    assert message.finish_reason == "abort" and message.content == done["message"]["content"] != ""
    usage = await sync_to_async(UsageRecord.objects.get)()
    assert usage.status == UsageRecord.Status.ABORTED and usage.user_id is not None


@pytest.mark.asyncio
async def test_a_server_shutting_down_refuses_new_turns_and_records_the_cut_answer(
        models, session_cookie, chat_worker, monkeypatch):
    from webapp.config import shutdown

    ws = communicator(session_cookie)
    assert (await ws.connect())[0]
    await ws.send_json_to(turn(content="Tell me a long story", max_tokens=450))
    assert (await receive_until(ws, "delta", "error"))[-1]["type"] == "delta"
    # The tiny model streams 450 tokens in well under a second on an idle machine: pace its
    # steps (5 ms each) so that the answer is still running when the drain gives up on it.
    from engine.llm_engine import LLMEngine
    step = LLMEngine.step
    monkeypatch.setattr(LLMEngine, "step", lambda self: (time.sleep(0.005), step(self))[1])
    monkeypatch.setattr(shutdown, "_shutting_down", True)  # both restored after the test
    # The drain starts at once, with a timeout far shorter than the answer; a new turn arrives meanwhile.
    draining = asyncio.ensure_future(shutdown.drain_running(0.02))
    await ws.send_json_to(turn(content="And another one"))
    frames = []
    while not ({"done", "error"} <= {f["type"] for f in frames}):
        frames += await receive_until(ws, "done", "error")
    refused = [f for f in frames if f["type"] == "error"]
    done = next(f for f in frames if f["type"] == "done")
    cut = await draining
    await ws.disconnect()

    assert refused[-1]["code"] == "server_shutting_down"
    assert cut == 1
    assert done["type"] == "done" and done["finish_reason"] == "abort"
    usage = await sync_to_async(UsageRecord.objects.get)()
    assert usage.status == UsageRecord.Status.ABORTED and usage.completion_tokens == done["usage"]["completion_tokens"]
    stats = await stats_when(chat_worker, lambda s: s["num_running"] == 0)
    assert stats["num_running"] == 0


@pytest.mark.asyncio
async def test_a_model_without_a_worker_answers_with_an_error_message(models, session_cookie, chat_worker):
    ws = communicator(session_cookie)
    assert (await ws.connect())[0]
    await ws.send_json_to(turn(content="Anyone?", model="nobody"))
    start, error = await receive_until(ws, "done", "error")
    await ws.disconnect()

    assert start["type"] == "start"
    assert error["type"] == "error" and error["code"] == "no_worker" and "nobody" in error["message"]
    usage = await sync_to_async(UsageRecord.objects.get)()
    assert usage.status == UsageRecord.Status.ERROR and usage.error_code == "no_worker"


@pytest.mark.asyncio
async def test_an_unknown_model_is_refused_before_anything_is_saved(models, session_cookie):
    ws = communicator(session_cookie)
    assert (await ws.connect())[0]
    await ws.send_json_to(turn(content="Hi", model="missing"))
    error = await ws.receive_json_from(timeout=TIMEOUT)
    await ws.disconnect()

    assert error["type"] == "error" and error["code"] == "model_not_found" and error["param"] == "model"
    assert await sync_to_async(Message.objects.count)() == 0


# Chat users' limits (keys.ChatLimits), enforced by the API keys' own code, and the socket's bounds.

def set_limits(user, **values):
    from webapp.keys.services import chatlimits_get_or_create

    limits = chatlimits_get_or_create(user=user)
    for name, value in values.items():
        if name == "models":
            limits.models.set(value)
        else:
            setattr(limits, name, value)
    limits.save()
    return limits


@pytest.mark.asyncio
async def test_a_malformed_frame_gets_an_error_frame_and_the_socket_stays_usable(models, session_cookie,
                                                                                 chat_worker):
    ws = communicator(session_cookie)
    assert (await ws.connect())[0]
    await ws.send_to(text_data='{"type": "send", "content": ')
    error = await ws.receive_json_from(timeout=TIMEOUT)
    await ws.send_to(text_data="[" * 100_000)  # nested too deep for the parser
    deep = await ws.receive_json_from(timeout=TIMEOUT)
    await ws.send_json_to(turn(content="Hello"))
    answer = await receive_until(ws, "done", "error")
    await ws.disconnect()

    assert error["type"] == "error" and error["code"] == "invalid_json"
    assert deep["code"] in ("invalid_json", "message_too_large")
    assert answer[-1]["type"] == "done"


@pytest.mark.asyncio
async def test_sockets_per_user_are_bounded_and_the_extra_one_is_told_why(models, alice, session_cookie):
    await sync_to_async(set_limits)(alice, max_sockets=1)
    first = communicator(session_cookie)
    assert (await first.connect())[0]
    extra = communicator(session_cookie)
    await extra.connect()

    error = await extra.receive_json_from(timeout=TIMEOUT)
    closed = await extra.receive_output(timeout=TIMEOUT)
    await first.disconnect()
    again = communicator(session_cookie)
    reconnected = (await again.connect())[0]
    await again.send_to(text_data="not json")
    still_open = await again.receive_json_from(timeout=TIMEOUT)
    await again.disconnect()

    assert error["type"] == "error" and error["code"] == "too_many_connections"
    assert closed == {"type": "websocket.close", "code": 4429}
    assert reconnected and still_open["code"] == "invalid_json"  # the closed socket gave its place back


@pytest.mark.asyncio
async def test_a_message_over_the_size_limit_is_refused_and_not_saved(models, alice, session_cookie):
    await sync_to_async(set_limits)(alice, max_message_chars=20)
    ws = communicator(session_cookie)
    assert (await ws.connect())[0]
    await ws.send_json_to(turn(content="x" * 21))
    error = await ws.receive_json_from(timeout=TIMEOUT)
    from webapp.chat.consumers import max_frame_bytes

    await ws.send_to(text_data="y" * (max_frame_bytes(20) + 1))  # beyond 20 characters and the documents
    frame = await ws.receive_json_from(timeout=TIMEOUT)
    await ws.disconnect()

    assert error["code"] == "message_too_large" and error["param"] == "content"
    assert frame["code"] == "message_too_large"
    assert await sync_to_async(Message.objects.count)() == 0


@pytest.mark.asyncio
async def test_a_model_outside_the_users_scope_reads_as_unknown(models, alice, session_cookie):
    nobody = await sync_to_async(Model.objects.get)(slug="nobody")
    await sync_to_async(set_limits)(alice, models=[nobody])
    ws = communicator(session_cookie)
    assert (await ws.connect())[0]
    await ws.send_json_to(turn(content="Hi"))
    error = await ws.receive_json_from(timeout=TIMEOUT)
    await ws.disconnect()

    assert error["code"] == "model_not_found" and error["param"] == "model"


@pytest.mark.asyncio
async def test_chat_turns_are_held_to_the_users_budget_and_request_rate(models, alice, session_cookie,
                                                                        chat_worker):
    from webapp.keys.models import ChatLimits

    await sync_to_async(set_limits)(alice, token_budget=200, max_requests_per_minute=2)
    ws = communicator(session_cookie)
    assert (await ws.connect())[0]
    await ws.send_json_to(turn(content="Hello"))
    first = await receive_until(ws, "done", "error")
    await ws.send_json_to(turn(content="Again", max_tokens=500))  # worst case over the budget
    over_budget = await ws.receive_json_from(timeout=TIMEOUT)
    await ws.send_json_to(turn(content="Third"))
    second = await receive_until(ws, "done", "error")
    await ws.send_json_to(turn(content="Fourth"))
    over_rate = await ws.receive_json_from(timeout=TIMEOUT)
    await ws.disconnect()
    limits = await sync_to_async(ChatLimits.objects.get)(user=alice)

    usage = [t[-1]["usage"] for t in (first, second)]
    assert first[-1]["type"] == second[-1]["type"] == "done"
    assert over_budget["code"] == "budget_exhausted" and "retry_after" not in over_budget
    assert over_rate["code"] == "rate_limit_exceeded" and 1 <= over_rate["retry_after"] <= 60
    assert limits.tokens_used == sum(u["prompt_tokens"] + u["completion_tokens"] for u in usage)
    assert limits.tokens_reserved == 0
    # The refused turns saved nothing: two questions, two answers.
    assert await sync_to_async(Message.objects.count)() == 4


@pytest.mark.asyncio
async def test_a_deactivated_user_cannot_open_the_socket(models, alice, session_cookie):
    await sync_to_async(get_user_model().objects.filter(pk=alice.pk).update)(is_active=False)
    ws = communicator(session_cookie)
    connected, code = await ws.connect()

    assert not connected and code == 4401
