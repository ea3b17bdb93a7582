"""Embedded mode: the same worker loop in a thread of this process, over the in-memory broker."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from engine import SamplingParams
from workers import embedded
from workers.connect import get_engine_client
from workers.memory_transport import MemoryBroker, MemoryEngineClient, default_broker
from workers.protocol import GenerateRequest
from workers.redis_transport import RedisEngineClient

MODEL = "tiny-embedded"
PROMPT = [5, 6, 7, 8, 9]


def request(prompt: list[int], params: dict, model: str = MODEL) -> GenerateRequest:
    return GenerateRequest(f"req-{uuid.uuid4().hex}", model, prompt, params)


def greedy(max_tokens: int) -> dict:
    return {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}


def stats_when(client, predicate, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while not predicate(stats := client.live_workers(MODEL)[0].stats) and time.monotonic() < deadline:
        time.sleep(0.05)
    return stats


@pytest.fixture(scope="module")
def client(tiny_llama_dir, tiny_settings):
    embedded.start_embedded_worker(MODEL, "v1", str(tiny_llama_dir), tiny_settings)
    assert embedded.wait_for_embedded_worker(MODEL, timeout=60)
    yield MemoryEngineClient(default_broker())
    embedded.stop_embedded_workers(drain_timeout=5)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_embedded_stream_equals_the_engine_own_greedy_output(client, reference_llm):
    expected = reference_llm.generate([PROMPT], SamplingParams(**greedy(40)))[0]

    chunks = [c async for c in client.generate(request(PROMPT, greedy(40)))]

    assert "".join(c.text for c in chunks) == expected.text
    assert [t for c in chunks for t in c.token_ids] == expected.token_ids
    assert chunks[-1].finished and chunks[-1].finish_reason == "length"
    assert not any(c.finished or c.error for c in chunks[:-1])
    assert {c.version for c in chunks} == {"v1"}  # stamped by the worker that answered


@pytest.mark.asyncio
async def test_a_cancel_landing_in_the_same_loop_turn_as_a_reply_is_not_lost():
    """Stop, a closed socket or the shutdown drain cancel the reading task while tokens keep
    arriving: Python 3.11's asyncio.wait_for returned the reply and dropped that cancel."""
    client = MemoryEngineClient(MemoryBroker())
    ticket: asyncio.Queue = asyncio.Queue()
    for _ in range(20):
        read = asyncio.create_task(client._next_replies(request(PROMPT, greedy(1)), ticket, timeout_s=5.0))
        await asyncio.sleep(0)  # the read waits on the reply queue
        ticket.put_nowait([])  # a worker's replies land...
        read.cancel()  # ...in the same loop turn as the cancel
        with pytest.raises(asyncio.CancelledError):
            await read
        assert ticket.empty() or ticket.get_nowait() == []


@pytest.mark.slow
@pytest.mark.asyncio
async def test_cancelling_the_consumer_task_aborts_the_request_and_frees_its_blocks(client):
    started = asyncio.Event()

    async def consume():
        async for _chunk in client.generate(request(PROMPT, greedy(240))):
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    def settled(s):
        return (s["num_running"] == 0 and s["num_inflight"] == 0
                and s["num_requests_finished"]["abort"] == 1)
    stats = await asyncio.to_thread(stats_when, client, settled)
    assert settled(stats), stats
    assert stats["num_free_blocks"] == stats["num_blocks"]
    assert stats["num_requests_finished"]["length"] < stats["num_requests"]


@pytest.mark.asyncio
async def test_embedded_errors_name_the_parameter(client):
    chunks = [c async for c in client.generate(request(PROMPT, {"top_p": 0}))]
    too_long = [c async for c in client.generate(request([5] * 300, {}))]
    nobody = [c async for c in client.generate(request(PROMPT, {}, model="not-embedded"))]

    assert (chunks[0].error.code, chunks[0].error.param) == ("invalid_parameter", "top_p")
    assert (too_long[0].error.code, too_long[0].error.param) == ("context_length_exceeded", "prompt")
    assert nobody[0].error.code == "no_worker"


@pytest.mark.asyncio
async def test_the_worker_scopes_the_prefix_cache_to_the_requests_tenant(client):
    prompt = list(range(400, 441))  # two full blocks of 16 before the last token

    async def cached_tokens(tenant: str, shared_prefix_len: int = 0) -> int:
        req = request(prompt, greedy(1))
        req.tenant, req.shared_prefix_len = tenant, shared_prefix_len
        return [c async for c in client.generate(req)][-1].num_cached_tokens

    a, b, a_again = [await cached_tokens(t) for t in ("user:1", "user:2", "user:1")]
    shared = [await cached_tokens(t, shared_prefix_len=16) for t in ("user:3", "user:4")]

    assert (a, b, a_again) == (0, 0, 32)
    assert shared == [0, 16]  # the first block is marked shared; the second stays each tenant's


@pytest.mark.slow
@pytest.mark.asyncio
async def test_an_embedded_worker_drains_by_the_deployments_drain_timeout(tiny_llama_dir, tiny_settings, monkeypatch):
    """An activation's hand-over (and a console deactivation) drains an embedded worker by
    serving.drain_timeout_s, as a worker process does: it used to be a fixed 30 s."""
    monkeypatch.setenv("PAGODA_DRAIN_TIMEOUT", "0")
    model = "tiny-drain"
    embedded.start_embedded_worker(model, "v1", str(tiny_llama_dir), tiny_settings)
    assert embedded.wait_for_embedded_worker(model, timeout=60)
    chunks = []
    async for chunk in MemoryEngineClient(default_broker()).generate(request(PROMPT, greedy(240), model=model)):
        if not chunks:
            assert embedded.stop_embedded_worker(model)  # the model's active version went away
        chunks.append(chunk)

    assert chunks[-1].error is not None and chunks[-1].error.code == "worker_lost"
    assert sum(len(c.token_ids) for c in chunks) < 240  # cut at once, not given 30 s to finish


def test_starting_the_same_version_again_keeps_the_running_worker(client, tiny_llama_dir, tiny_settings):
    before = [w.worker_id for w in client.live_workers(MODEL)]

    embedded.start_embedded_worker(MODEL, "v1", str(tiny_llama_dir), tiny_settings)

    assert [w.worker_id for w in client.live_workers(MODEL)] == before


def test_engine_client_is_in_memory_without_a_redis_url_and_redis_with_one(redis_server):
    assert isinstance(get_engine_client(None), MemoryEngineClient)
    assert get_engine_client(None) is get_engine_client(None)

    assert isinstance(get_engine_client(redis_server), RedisEngineClient)
    assert get_engine_client(redis_server) is get_engine_client(redis_server)
