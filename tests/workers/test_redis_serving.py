"""Serving over real Redis to real worker processes (two of them share the model "tiny")."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid

import pytest

from engine import SamplingParams
from workers.protocol import GenerateRequest
from workers.redis_transport import RedisEngineClient

PROMPT = [5, 6, 7, 8, 9]


def request(model: str, prompt: list[int], params: dict) -> GenerateRequest:
    return GenerateRequest(f"req-{uuid.uuid4().hex}", model, prompt, params)


def greedy(max_tokens: int) -> dict:
    return {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}


async def collect(client, req: GenerateRequest) -> list:
    return [chunk async for chunk in client.generate(req)]


def wait_for_stats(client, model: str, predicate, timeout: float = 5.0) -> list[dict]:
    """The model's workers' stats once ``predicate(stats_list)`` holds (heartbeats are 1 s apart)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = [w.stats for w in client.live_workers(model)]
        if predicate(stats) or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


def current_stats(client, model: str) -> list[dict]:
    """Stats from heartbeats sent after everything before this call (stats lag by up to 0.2 s)."""
    after = time.time() + 0.3
    deadline = time.monotonic() + 5
    while True:
        workers = client.live_workers(model)
        if all(w.last_heartbeat >= after for w in workers):
            return [w.stats for w in workers]
        assert time.monotonic() < deadline, "no fresh heartbeat"
        time.sleep(0.05)


def total(stats: list[dict], key: str) -> int:
    return sum(s[key] for s in stats)


@pytest.fixture
def client(redis_server, serving_pair):
    return RedisEngineClient(redis_server)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_streamed_text_equals_the_engine_own_greedy_output(client, reference_llm):
    expected = reference_llm.generate([PROMPT], SamplingParams(**greedy(40)))[0]

    chunks = await collect(client, request("tiny", PROMPT, greedy(40)))

    assert [c.error for c in chunks] == [None] * len(chunks)
    assert "".join(c.text for c in chunks) == expected.text
    assert [t for c in chunks for t in c.token_ids] == expected.token_ids
    assert len(chunks) > 1 and chunks[-1].finished and not any(c.finished for c in chunks[:-1])
    last = chunks[-1]
    assert (last.finish_reason, last.num_prompt_tokens, last.num_output_tokens) == ("length", 5, 40)
    assert last.time_to_first_token is not None and last.time_to_first_token > 0


@pytest.mark.slow
@pytest.mark.asyncio
async def test_two_workers_of_one_model_share_its_requests(client, reference_llm):
    before = [s["num_requests"] for s in current_stats(client, "tiny")]
    prompts = [[20 + i, 30 + i, 40 + i] for i in range(6)]
    expected = reference_llm.generate(prompts, SamplingParams(**greedy(12)))

    results = await asyncio.gather(*(collect(client, request("tiny", p, greedy(12)))
                                     for p in prompts))

    assert ["".join(c.text for c in chunks) for chunks in results] == [e.text for e in expected]
    stats = wait_for_stats(client, "tiny", lambda s: total(s, "num_requests") >= sum(before) + 6)
    served = [s["num_requests"] - b for s, b in zip(stats, before)]
    assert sum(served) == 6
    assert all(n > 0 for n in served), served  # each holds at most 2 of the 6 at a time


@pytest.mark.slow
@pytest.mark.asyncio
async def test_closing_the_stream_aborts_the_request_and_frees_its_blocks(client):
    before = current_stats(client, "tiny")
    stream = client.generate(request("tiny", PROMPT, greedy(240)))
    received = [await anext(stream), await anext(stream)]
    assert not received[-1].finished

    await stream.aclose()

    def settled(stats):
        return (total(stats, "num_running") == 0 and total(stats, "num_inflight") == 0
                and all(s["num_free_blocks"] == s["num_blocks"] for s in stats)
                and sum(s["num_requests_finished"]["abort"] for s in stats)
                == sum(s["num_requests_finished"]["abort"] for s in before) + 1)

    after = wait_for_stats(client, "tiny", settled)
    assert settled(after), after
    # Aborted, not run to the end: nowhere near 240 more tokens were generated.
    assert total(after, "num_generation_tokens") - total(before, "num_generation_tokens") < 200


@pytest.mark.asyncio
@pytest.mark.parametrize(("prompt", "params", "code", "param"), [
    (PROMPT, {"temperature": -1}, "invalid_parameter", "temperature"),
    (PROMPT, {"max_tokens": 0}, "invalid_parameter", "max_tokens"),
    (PROMPT, {"temprature": 0.5}, "invalid_parameter", "temprature"),
    ([5, 49152], {}, "invalid_parameter", "prompt"),
    ([5] * 250, {"max_tokens": 10}, "context_length_exceeded", "prompt"),
])
async def test_bad_requests_come_back_as_errors_naming_the_parameter(client, prompt, params,
                                                                    code, param):
    chunks = await collect(client, request("tiny", prompt, params))

    assert len(chunks) == 1 and chunks[0].finished and chunks[0].finish_reason is None
    assert (chunks[0].error.code, chunks[0].error.param) == (code, param)
    assert chunks[0].error.message


@pytest.mark.asyncio
async def test_a_model_nobody_serves_gets_no_worker_at_once(client):
    start = time.monotonic()
    chunks = await collect(client, request("nobody-serves-this", PROMPT, greedy(4)))

    assert time.monotonic() - start < 1.0
    assert [c.error.code for c in chunks] == ["no_worker"]
    assert chunks[0].finished


def test_workers_announce_model_version_host_pid_and_capacity(client, serving_pair):
    workers = client.live_workers("tiny")

    assert sorted(w.pid for w in workers) == sorted(p.proc.pid for p in serving_pair)
    for info in workers:
        assert (info.model, info.version) == ("tiny", "test")
        assert (info.max_num_seqs, info.max_model_len) == (2, 256)
        assert info.host and not info.draining and info.last_heartbeat >= info.started_at
        assert info.stats["num_blocks"] == 64
        assert set(info.stats["latency"]) == {"time_to_first_token", "time_per_output_token",
                                              "e2e_latency"}
    assert {w.worker_id for w in client.live_workers()} >= {w.worker_id for w in workers}


@pytest.mark.asyncio
async def test_a_malformed_queue_entry_is_answered_with_an_error_and_serving_goes_on(
        client, redis_server):
    import json

    import redis

    from workers.protocol import Reply
    from workers.redis_transport import reply_stream, request_stream

    r = redis.Redis.from_url(redis_server, decode_responses=True)
    reply_to = reply_stream("malformed-1")
    r.xadd(request_stream("tiny"), {"data": json.dumps(
        {"request_id": "malformed-1", "model": "tiny", "reply_to": reply_to})})  # no prompt, no params

    entries = r.xread({reply_to: "0-0"}, block=5000)[0][1]
    chunk = Reply.from_dict(json.loads(entries[-1][1]["data"])).chunk
    assert chunk.finished and chunk.error.code == "invalid_parameter"
    chunks = await collect(client, request("tiny", PROMPT, greedy(3)))
    assert chunks[-1].finish_reason == "length" and chunks[-1].num_output_tokens == 3


@pytest.mark.asyncio
async def test_an_unreachable_redis_is_an_error_chunk_not_an_exception():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{sock.getsockname()[1]}/0"

        chunks = await collect(RedisEngineClient(url), request("tiny", PROMPT, greedy(4)))

    assert [c.error.code for c in chunks] == ["queue_unavailable"]
    assert chunks[0].finished and chunks[0].error.retry_after > 0
    assert chunks[0].error.message == "the request queue is unreachable; try again shortly"


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_a_request_taken_by_a_worker_that_died_before_answering_gets_worker_lost(redis_server):
    """The worker side of the transport, driven by hand: it announces itself, takes the request
    off the queue and dies (its heartbeat key goes) before sending the claim."""
    import redis

    from workers.protocol import WorkerInfo
    from workers.redis_transport import worker_key
    from workers.redis_worker_transport import RedisWorkerTransport

    ghost = RedisWorkerTransport(redis_server, "ghost-model", "ghost-1")
    ghost.heartbeat(WorkerInfo("ghost-1", "ghost-model", "v", "host", 1, time.time(), time.time(),
                               1, 256))
    client = RedisEngineClient(redis_server)
    consumer = asyncio.create_task(collect(client, request("ghost-model", PROMPT, greedy(4))))
    taken = []
    while not taken:
        taken = await asyncio.to_thread(ghost.exchange, [], 1, 0.5)
    redis.Redis.from_url(redis_server).delete(worker_key("ghost-model", "ghost-1"))
    died_at = time.monotonic()

    chunks = await asyncio.wait_for(consumer, 10)

    assert time.monotonic() - died_at < 3
    assert [c.error.code for c in chunks] == ["worker_lost"]
    ghost.close()


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_a_worker_hears_of_a_submission_without_a_round_trip_and_its_aborts_still(redis_server):
    """The submission publishes on the model's arrival channel (what a worker in the middle of a
    long step looks at, EngineWorker._take_arrivals); reading the stream clears it, and an abort
    heard on the same subscription still reaches poll_aborts."""
    from workers.protocol import WorkerInfo
    from workers.redis_worker_transport import RedisWorkerTransport

    worker = RedisWorkerTransport(redis_server, "heard-model", "heard-1")
    worker.heartbeat(WorkerInfo("heard-1", "heard-model", "v", "host", 1, time.time(), time.time(), 1, 256))
    assert worker.exchange([], 1, 0.0) == []
    assert not worker.arrived()
    client = RedisEngineClient(redis_server)
    req = request("heard-model", PROMPT, greedy(4))
    consumer = asyncio.create_task(collect(client, req))
    deadline = time.monotonic() + 5
    while not worker.arrived():
        assert time.monotonic() < deadline, "the submission was not heard"
        await asyncio.sleep(0.01)
    client.abort_now("heard-model", ["some-other-request"])
    taken = worker.exchange([], 1, 0.0)
    assert [t.request_id for t in taken] == [req.request_id]
    while "some-other-request" not in (aborts := worker.poll_aborts()):
        assert time.monotonic() < deadline and aborts == [], aborts
        await asyncio.sleep(0.01)
    assert not worker.arrived()
    consumer.cancel()
    worker.close()
