"""Chat answers outlive their socket: a closed socket leaves the answer running, another socket of
the same user reattaches to it (the text so far, then the rest), the answer is stored once and
the engine ran one generation. Only Stop, the cap on unheard answers or the shutdown drain end it.

The embedded in-memory transport and an embedded worker serving the tiny random Llama, in this
process; the engine's steps are paced (5 ms) so that an answer is still running when the test
acts on it."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async

from webapp.chat.models import Message
from webapp.usage.models import UsageRecord

from tests.webapp.test_chat_consumer import (alice, chat_worker, communicator, models, receive_until,  # noqa: F401
                                             session_cookie, stats_when, turn, worker_stats)

pytestmark = pytest.mark.django_db(transaction=True)
LONG = 400


@pytest.fixture
def paced(monkeypatch):
    from engine.llm_engine import LLMEngine

    step = LLMEngine.step
    monkeypatch.setattr(LLMEngine, "step", lambda self: (time.sleep(0.005), step(self))[1])


def finished(stats: dict) -> int:
    return sum(stats["num_requests_finished"].values())


async def connected(cookie):
    ws = communicator(cookie)
    assert (await ws.connect())[0]
    return ws


async def answers(*, role="assistant") -> list[Message]:
    return await sync_to_async(lambda: list(Message.objects.filter(role=role)))()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_reload_mid_answer_reattaches_and_the_answer_ends_complete_stored_once(
        models, session_cookie, chat_worker, paced):
    before = worker_stats(chat_worker)
    first = await connected(session_cookie)
    await first.send_json_to(turn(content="Tell me a long story", max_tokens=LONG))
    start, delta = await receive_until(first, "delta", "error")
    assert delta["type"] == "delta"
    await first.disconnect()  # the page reloads

    second = await connected(session_cookie)
    await second.send_json_to({"type": "attach", "conversation": start["conversation"]["id"]})
    resume, *deltas, done = await receive_until(second, "done", "error")
    await second.disconnect()

    assert resume["type"] == "resume" and resume["user_message"] == start["user_message"]
    assert resume["text"].startswith(delta["text"])
    assert done["type"] == "done" and done["finish_reason"] == "length"
    assert done["usage"]["completion_tokens"] == LONG
    assert resume["text"] + "".join(d["text"] for d in deltas) == done["message"]["content"]
    stored = await answers()
    assert [m.content for m in stored] == [done["message"]["content"]] and stored[0].finish_reason == "length"
    stats = await stats_when(chat_worker, lambda s: finished(s) == finished(before) + 1 and s["num_running"] == 0)
    assert finished(stats) == finished(before) + 1  # one generation, not two
    assert stats["num_requests_finished"].get("abort", 0) == before["num_requests_finished"].get("abort", 0)
    assert await sync_to_async(UsageRecord.objects.count)() == 1


@pytest.mark.asyncio
async def test_two_tabs_hear_the_same_answer_and_stop_from_either_ends_it(models, session_cookie, chat_worker,
                                                                          paced):
    writer, reader = await connected(session_cookie), await connected(session_cookie)
    await writer.send_json_to(turn(content="Tell me a long story", max_tokens=LONG))
    start, _ = await receive_until(writer, "delta", "error")
    conversation = start["conversation"]["id"]
    await reader.send_json_to({"type": "attach", "conversation": conversation})
    resume = await reader.receive_json_from(timeout=10)
    await reader.send_json_to(turn(content="Interrupting", conversation=conversation))
    busy = await receive_until(reader, "error")
    await reader.send_json_to({"type": "stop", "conversation": conversation})
    heard_by_reader = await receive_until(reader, "done")
    heard_by_writer = await receive_until(writer, "done")
    await writer.disconnect()
    await reader.disconnect()

    assert resume["type"] == "resume"
    assert busy[-1]["code"] == "busy"
    assert heard_by_reader[-1] == heard_by_writer[-1]
    assert heard_by_writer[-1]["finish_reason"] == "abort"
    assert 0 < heard_by_writer[-1]["usage"]["completion_tokens"] < LONG
    assert len(await answers()) == 1 and len(await answers(role="user")) == 1


@pytest.mark.asyncio
async def test_attaching_where_nothing_runs_says_idle(models, session_cookie, chat_worker):
    ws = await connected(session_cookie)
    await ws.send_json_to(turn(content="Hi"))
    start, *_ = await receive_until(ws, "done", "error")
    await ws.send_json_to({"type": "attach", "conversation": start["conversation"]["id"]})
    idle = await ws.receive_json_from(timeout=10)
    await ws.send_json_to({"type": "attach", "conversation": 999999})
    other = await ws.receive_json_from(timeout=10)
    await ws.disconnect()

    assert idle == {"type": "idle", "conversation": start["conversation"]["id"]}
    assert other["type"] == "idle"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_past_the_cap_on_unheard_answers_the_oldest_one_is_stopped(models, session_cookie, chat_worker,
                                                                         paced, settings):
    settings.PAGODA_CHAT_MAX_BACKGROUND_ANSWERS = 1
    conversations = []
    for story in ("one", "two"):
        ws = await connected(session_cookie)
        await ws.send_json_to(turn(content=f"Story {story}", max_tokens=LONG))
        start, _ = await receive_until(ws, "delta", "error")
        conversations.append(start["conversation"]["id"])
        await ws.disconnect()

    ws = await connected(session_cookie)
    await ws.send_json_to({"type": "attach", "conversation": conversations[1]})
    *_, done = await receive_until(ws, "done", "error")
    await ws.send_json_to({"type": "attach", "conversation": conversations[0]})
    oldest = await ws.receive_json_from(timeout=10)
    await ws.disconnect()

    assert done["finish_reason"] == "length"
    assert oldest["type"] == "idle"
    stored = {m.conversation_id: m.finish_reason for m in await answers()}
    assert stored == {conversations[0]: "abort", conversations[1]: "length"}


@pytest.mark.slow
@pytest.mark.asyncio
async def test_an_answer_nobody_listens_to_is_recorded_by_the_shutdown_drain(models, session_cookie, chat_worker,
                                                                            paced, monkeypatch):
    from webapp.config import shutdown

    ws = await connected(session_cookie)
    await ws.send_json_to(turn(content="Tell me a long story", max_tokens=LONG))
    assert (await receive_until(ws, "delta", "error"))[-1]["type"] == "delta"
    await ws.disconnect()
    monkeypatch.setattr(shutdown, "_shutting_down", True)
    cut = await shutdown.drain_running(0.02)

    assert cut == 1
    usage = await sync_to_async(UsageRecord.objects.get)()
    assert usage.status == UsageRecord.Status.ABORTED and 0 < usage.completion_tokens < LONG
    [message] = await answers()
    assert message.finish_reason == "abort" and message.completion_tokens == usage.completion_tokens
    stats = await stats_when(chat_worker, lambda s: s["num_running"] == 0)
    assert stats["num_running"] == 0
