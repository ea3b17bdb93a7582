"""Worker processes dying and draining: clients get an answer, never a hang."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid

import pytest
import redis

from workers.protocol import GenerateRequest, Reply
from workers.redis_transport import RedisEngineClient, reply_stream

PROMPT = [11, 12, 13]


def request(model: str, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(f"req-{uuid.uuid4().hex}", model, PROMPT,
                           {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True})


def wait_until(predicate, timeout: float = 10.0, explain=lambda: ""):
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in {timeout} s: {explain()}")
        time.sleep(0.05)
    return result


@pytest.mark.asyncio
async def test_sigkill_mid_stream_gives_the_client_worker_lost_within_10_s(
        redis_server, spawn_worker, wait_workers):
    worker = spawn_worker("tiny-kill")
    wait_workers("tiny-kill", 1, [worker])
    client = RedisEngineClient(redis_server)
    stream = client.generate(request("tiny-kill", 240))
    first = await anext(stream)
    assert first.error is None and not first.finished

    worker.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    rest = [chunk async for chunk in stream]

    assert time.monotonic() - killed_at < 10.0
    assert rest[-1].finished and rest[-1].error is not None
    assert rest[-1].error.code == "worker_lost"
    assert not any(c.finished for c in rest[:-1])


@pytest.mark.asyncio
async def test_sigterm_finishes_running_requests_sends_new_ones_elsewhere_and_exits_0(
        redis_server, spawn_worker, wait_workers):
    procs = [spawn_worker("tiny-drain"), spawn_worker("tiny-drain")]
    wait_workers("tiny-drain", 2, procs)
    client = RedisEngineClient(redis_server)

    def workers_now():
        return [(w.pid, w.draining, w.stats) for w in client.live_workers("tiny-drain")]

    req = request("tiny-drain", 240)
    stream = client.generate(req)
    received = [await anext(stream)]
    # The claim on the reply stream names the worker that took the request.
    claim = Reply.from_dict(json.loads(
        redis.Redis.from_url(redis_server).xrange(reply_stream(req.request_id))[0][1][b"data"]))
    assert claim.kind == "claimed"
    pid = next(w.pid for w in client.live_workers("tiny-drain") if w.worker_id == claim.worker_id)
    draining = next(p for p in procs if p.proc.pid == pid)
    spare = next(p for p in procs if p is not draining)

    draining.signal(signal.SIGTERM)
    announced = wait_until(lambda: [w for w in client.live_workers("tiny-drain") if w.draining],
                           explain=workers_now)
    assert announced[0].stats["num_inflight"] == 1  # SIGTERM came while it was running
    later = [c async for c in client.generate(request("tiny-drain", 8))]
    received += [c async for c in stream]

    assert received[-1].finish_reason == "length" and received[-1].error is None
    assert sum(len(c.token_ids) for c in received) == received[-1].num_output_tokens == 240
    assert later[-1].finish_reason == "length" and later[-1].num_output_tokens == 8
    assert await asyncio.to_thread(draining.proc.wait, 30) == 0
    assert [w.pid for w in client.live_workers("tiny-drain")] == [spare.proc.pid]
    wait_until(lambda: client.live_workers("tiny-drain")[0].stats["num_requests"] == 1,
               explain=workers_now)

    spare.signal(signal.SIGTERM)
    assert await asyncio.to_thread(spare.proc.wait, 30) == 0
    after = [c async for c in client.generate(request("tiny-drain", 8))]
    assert [c.error.code for c in after] == ["no_worker"]
