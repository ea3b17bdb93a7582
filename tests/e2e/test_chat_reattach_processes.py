"""Answers outlive the page across web processes: two real Daphne processes on loopback ports
sharing one Redis (the channels_redis layer, the engine's streams) and one SQLite database, one
real engine worker of the tiny random Llama. A chat socket is a real WebSocket over TCP (the
``websockets`` client), logged in with a real session.

What must hold: an answer started through web1 and followed, after a reload, through web2 comes
back as the text so far plus the rest, nothing lost or repeated, stored once, and the engine ran
one generation; Stop pressed on web2 aborts the engine request of web1's answer; the sidebar
marks the answer from either process; and when web1 dies mid-answer, web2's socket ends with a
clear error within a few registry lapses, not never.

The worker is frozen (SIGSTOP, well under its 5 s heartbeat) while the page "reloads", so that
the answer is certainly still running when web2 attaches; it is thawed as soon as the attach is
sent, so frames flow while web2 takes its snapshot.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import sys
import time
from contextlib import contextmanager

import httpx
import pytest
import redis
from websockets.asyncio.client import connect

from tests.e2e.sites import TINY_SETTINGS, Site, free_port, make_site
from workers.redis_transport import RedisEngineClient

pytestmark = pytest.mark.e2e
MODEL = "tiny"
USERNAME, PASSWORD = "relay-tester", "relay-tester-pw-41"
LONG = 400
RELAY_TTL_S = 3  # the registry entries' lifetime here (PAGODA_CHAT_RELAY_TTL_S; 10 s by default)


@pytest.fixture(scope="module")
def webs(tmp_path_factory, tiny_llama_dir, redis_server):
    redis_url = redis_server.rsplit("/", 1)[0] + "/3"  # a database of its own on the session's Redis
    web1 = make_site(tmp_path_factory.mktemp("relay_site"), {"REDIS_URL": redis_url})
    with open(web1.root / "e2e_settings.py", "a") as settings:
        settings.write(f"PAGODA_CHAT_RELAY_TTL_S = {RELAY_TTL_S}\n")
    web1.manage("register_model", MODEL, str(tiny_llama_dir), "--engine-settings", json.dumps(TINY_SETTINGS))
    web1.env["DJANGO_SUPERUSER_PASSWORD"] = PASSWORD
    web1.manage("createsuperuser", "--noinput", "--username", USERNAME, "--email", "relay@example.com")
    web2 = Site(web1.root, web1.env, port=free_port(), procs=web1.procs)
    web1.worker = web1.spawn("worker", [sys.executable, "manage.py", "run_engine_worker", "--model", MODEL,
                                        "--drain-timeout", "5"])
    web1.daphne = web1.start_daphne()
    web2.daphne = web2.spawn("daphne2", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(web2.port),
                                         "webapp.config.asgi:application"])
    web1.engine = RedisEngineClient(redis_url)
    try:
        for web in (web1, web2):
            web.wait_until(lambda web=web: web.metric("pagoda:num_requests_running", model_name=MODEL) is not None,
                           f"the worker announcing itself, seen from port {web.port}")
        yield web1, web2
    finally:
        web1.stop()


@pytest.fixture(scope="module")
def cookie(webs):
    web1, _web2 = webs
    with httpx.Client(base_url=web1.url, timeout=60) as http:
        http.get("/accounts/login/")
        response = http.post("/accounts/login/", data={"username": USERNAME, "password": PASSWORD,
                                                       "csrfmiddlewaretoken": http.cookies["csrftoken"]})
        assert response.status_code == 302, response.text[-2000:]
        return http.cookies["sessionid"]


class ChatSocket:
    """The chat page's WebSocket as the page opens it: same origin, the session cookie."""

    def __init__(self, connection):
        self.connection = connection

    @classmethod
    async def open(cls, site: Site, cookie: str) -> "ChatSocket":
        return cls(await connect(f"ws://127.0.0.1:{site.port}/ws/chat/", origin=site.url, open_timeout=30,
                                 additional_headers={"Cookie": f"sessionid={cookie}"}))

    async def send(self, frame: dict) -> None:
        await self.connection.send(json.dumps(frame))

    async def until(self, *kinds: str, timeout: float = 60) -> list[dict]:
        """Frames up to and including the first of one of ``kinds``."""
        frames = []
        while not frames or frames[-1]["type"] not in kinds:
            frames.append(json.loads(await asyncio.wait_for(self.connection.recv(), timeout)))
        return frames

    async def close(self) -> None:
        await self.connection.close(1001)  # the page going away


def turn(content: str, max_tokens: int = LONG) -> dict:
    return {"type": "send", "model": MODEL, "content": content, "temperature": 0, "max_tokens": max_tokens,
            "system_prompt": ""}


@contextmanager
def frozen(web1: Site):
    """The worker stopped (not killed): the answer cannot end meanwhile."""
    os.kill(web1.worker.pid, signal.SIGSTOP)
    try:
        yield lambda: os.kill(web1.worker.pid, signal.SIGCONT)
    finally:
        os.kill(web1.worker.pid, signal.SIGCONT)


def engine_counts(web: Site) -> tuple[float, float]:
    """(requests the engine finished, tokens it generated), from the workers' heartbeats on /metrics."""
    return (web.metric("pagoda:e2e_request_latency_seconds_count", model_name=MODEL) or 0.0,
            web.metric("pagoda:generation_tokens_total", model_name=MODEL) or 0.0)


def finished_by_reason(web1: Site) -> dict:
    [worker] = web1.engine.live_workers(MODEL)
    return dict(worker.stats["num_requests_finished"])


def stored_answers(site: Site, conversation: int) -> list[tuple]:
    with sqlite3.connect(site.db_path) as db:
        return db.execute("SELECT content, finish_reason, completion_tokens FROM chat_message "
                          "WHERE conversation_id = ? AND role = 'assistant'", (conversation,)).fetchall()


def sidebar_marks_running(site: Site, cookie: str, conversation: int) -> bool:
    page = httpx.get(f"{site.url}/c/{conversation}/", cookies={"sessionid": cookie}, timeout=30)
    assert page.status_code == 200
    return re.search(rf'class="conv[^"]*\brunning\b[^"]*" data-id="{conversation}"', page.text) is not None


def registry_lifetimes(web1: Site, conversation: int) -> tuple[int, int]:
    """The milliseconds web1's registry entry of the answer has left, now and 1.5 s later."""
    client = redis.Redis.from_url(web1.env["REDIS_URL"])
    first = client.pttl(f"pagoda:chat:answer:{conversation}")
    time.sleep(1.5)
    return first, client.pttl(f"pagoda:chat:answer:{conversation}")


def text_of(frames: list[dict]) -> str:
    return "".join(f["text"] for f in frames if f["type"] == "delta")


def test_a_reload_landing_on_the_other_web_process_continues_the_answer_stored_once(webs, cookie):
    web1, web2 = webs

    async def scenario():
        first = await ChatSocket.open(web1, cookie)
        await first.send(turn("Tell me a long story", max_tokens=160))  # frames flow after web2's snapshot
        heard_first = await first.until("delta")
        conversation = heard_first[0]["conversation"]["id"]
        with frozen(web1) as thaw:
            await first.close()  # the page reloads, and the balancer sends it to web2
            marked = await asyncio.to_thread(sidebar_marks_running, web2, cookie, conversation)
            second = await ChatSocket.open(web2, cookie)
            await second.send({"type": "attach", "conversation": conversation})
            attached = time.monotonic()
            thaw()
            heard_second = await second.until("resume")
            print(f"web2's snapshot from web1 came {1000 * (time.monotonic() - attached):.0f} ms after the attach")
            heard_second += await second.until("done", "error")
        await second.close()
        return conversation, heard_first, marked, heard_second

    requests_before, tokens_before = engine_counts(web2)
    reasons_before = finished_by_reason(web1)
    conversation, heard_first, marked, (resume, *rest) = asyncio.run(scenario())
    *deltas, done = rest

    assert marked  # the sidebar of the page web2 rendered: "answer in progress"
    assert resume["type"] == "resume" and resume["user_message"] == heard_first[0]["user_message"]
    assert resume["text"].startswith(text_of(heard_first))
    assert done["type"] == "done" and done["finish_reason"] in ("stop", "length"), done
    assert deltas and {d["type"] for d in deltas} == {"delta"}  # live frames after the snapshot
    assert resume["text"] + text_of(deltas) == done["message"]["content"]  # nothing lost, nothing twice
    [(content, finish_reason, completion_tokens)] = stored_answers(web1, conversation)
    assert (content, finish_reason) == (done["message"]["content"], done["finish_reason"])
    assert completion_tokens == done["usage"]["completion_tokens"]
    assert not sidebar_marks_running(web2, cookie, conversation) and not sidebar_marks_running(web1, cookie,
                                                                                               conversation)
    web2.wait_until(lambda: engine_counts(web2)[0] >= requests_before + 1, "the engine's request count")
    requests_after, tokens_after = engine_counts(web2)
    assert requests_after == requests_before + 1  # one generation, not two
    assert tokens_after - tokens_before == completion_tokens
    assert finished_by_reason(web1).get("abort", 0) == reasons_before.get("abort", 0)


def test_stop_pressed_on_the_other_web_process_aborts_the_answer_in_the_engine(webs, cookie):
    web1, web2 = webs

    async def scenario():
        owner = await ChatSocket.open(web1, cookie)
        await owner.send(turn("Tell me a very long story about a dragon"))
        heard_owner = await owner.until("delta")
        conversation = heard_owner[0]["conversation"]["id"]
        with frozen(web1):
            other = await ChatSocket.open(web2, cookie)
            await other.send({"type": "attach", "conversation": conversation})
            [resume] = await other.until("resume")
            lifetimes = await asyncio.to_thread(registry_lifetimes, web1, conversation)
            await other.send({**turn("And another one"), "conversation": conversation})
            [busy] = await other.until("error")  # one answer at a time, whichever process writes it
            await other.send({"type": "stop", "conversation": conversation})
            heard_other = await other.until("done", "error")
            heard_owner += await owner.until("done", "error")
        await other.close()
        await owner.close()
        return conversation, resume, lifetimes, busy, heard_other, heard_owner

    reasons_before = finished_by_reason(web1)
    conversation, resume, lifetimes, busy, heard_other, heard_owner = asyncio.run(scenario())

    assert busy["code"] == "busy"
    # web1 renews its registry entry (every third of its lifetime) while the answer runs.
    assert min(lifetimes) > 0 and lifetimes[1] > lifetimes[0] - 1500 + 300, lifetimes
    assert heard_other[-1]["type"] == heard_owner[-1]["type"] == "done", (heard_other[-1], heard_owner[-1])
    assert heard_other[-1]["finish_reason"] == heard_owner[-1]["finish_reason"] == "abort"
    assert heard_other[-1]["message"] == heard_owner[-1]["message"]
    assert resume["text"] + text_of(heard_other) == heard_owner[-1]["message"]["content"]
    [(content, finish_reason, completion_tokens)] = stored_answers(web1, conversation)
    assert finish_reason == "abort" and content == heard_owner[-1]["message"]["content"]
    assert 0 < completion_tokens < LONG
    web1.wait_until(lambda: finished_by_reason(web1).get("abort", 0) == reasons_before.get("abort", 0) + 1,
                    "the engine aborting the request", timeout=20)
    assert web1.metric("pagoda:num_requests_running", model_name=MODEL) == 0


def test_a_follower_whose_owning_process_dies_ends_with_a_clear_error(webs, cookie):
    web1, web2 = webs

    async def scenario():
        owner = await ChatSocket.open(web1, cookie)
        await owner.send(turn("Tell me a long story about a lost ship"))
        heard_owner = await owner.until("delta")
        conversation = heard_owner[0]["conversation"]["id"]
        with frozen(web1):
            other = await ChatSocket.open(web2, cookie)
            await other.send({"type": "attach", "conversation": conversation})
            await other.until("resume")
            os.killpg(web1.daphne.pid, signal.SIGKILL)  # no goodbye, no last frame
            killed = time.monotonic()
        [*_frames, last] = await other.until("done", "error", timeout=10 * RELAY_TTL_S)
        took = time.monotonic() - killed
        marked = await asyncio.to_thread(sidebar_marks_running, web2, cookie, conversation)
        await other.close()
        return last, took, marked

    last, took, marked = asyncio.run(scenario())
    print(f"the follower ended {took:.1f} s after its owner died (registry entries live {RELAY_TTL_S} s)")
    assert (last["type"], last["code"]) == ("error", "answer_lost"), last
    assert "not saved" in last["message"]
    assert took < RELAY_TTL_S + 10  # the entry lapses, two checks miss it, the store is asked three times
    assert not marked
