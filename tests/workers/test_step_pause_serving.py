"""Through an embedded worker (the tiny random Llama on the fused CPU step): the worker looks at its
queue between the layers of a long step, and another tenant's request that arrived meanwhile runs
before the step ends (LLMEngine.step, EngineWorker._take_arrivals); the worker counts those pauses
in its stats, and every stream still ends whole."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from engine.kernels.cpu import decode_step
from engine.models.fused_decode import FusedDecode
from workers import embedded
from workers.memory_transport import MemoryEngineClient, default_broker
from workers.protocol import GenerateRequest

MODEL = "tiny-pause"
FLOOD = 12  # rows in the flood's steps: above fused_decode.PAUSABLE_ROWS
FLOOD_TOKENS = 200
BLOCK = 16  # the engine's default block size

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(decode_step.library() is None, reason="no C compiler or no AVX2/FMA/F16C here")]


@pytest.fixture(scope="module")
def client(tiny_llama_dir, tiny_settings):
    # KV blocks for the whole flood at once: with the suite's 64 (1,024 tokens) user a's quota
    # (max_tenant_kv_share, 0.75 of the pool) held ~3 of its 204-token streams, its steps fell
    # below PAUSABLE_ROWS once they grew (22-29 preemptions in a slow run, the full suite's)
    settings = {**tiny_settings, "max_num_seqs": 32, "quantization": "int4",
                "num_kv_blocks": 2 * FLOOD * -(-(4 + FLOOD_TOKENS) // BLOCK)}
    embedded.start_embedded_worker(MODEL, "v1", str(tiny_llama_dir), settings)
    assert embedded.wait_for_embedded_worker(MODEL, timeout=60)
    yield MemoryEngineClient(default_broker())
    embedded.stop_embedded_worker(MODEL, drain_timeout=5)


async def tokens(client, tenant: str, max_tokens: int, seen: asyncio.Event | None = None) -> int:
    req = GenerateRequest(f"{tenant}-{uuid.uuid4().hex}", MODEL, [5, 6, 7, 8],
                          {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}, tenant=tenant)
    n = 0
    async for chunk in client.generate(req):
        assert chunk.error is None, chunk.error
        n += len(chunk.token_ids)
        if seen is not None:
            seen.set()
    return n


@pytest.fixture
def long_parts(monkeypatch):
    """The tiny model's steps take well under a millisecond, so a request rarely arrives during
    one: each part of a pausable step is made to last 20 ms more (the time a part of SmolLM2's
    32-row step takes on 2 busy cores), the GIL released, before the worker looks at its queue."""
    parts = FusedDecode.parts

    def slow_parts(self, input_ids, positions, slots, meta, window_slots=None, pause=None, **kwargs):
        def slow_pause() -> bool:
            time.sleep(0.02)
            return pause()

        return (yield from parts(self, input_ids, positions, slots, meta, window_slots,
                                 None if pause is None else slow_pause, **kwargs))

    monkeypatch.setattr(FusedDecode, "parts", slow_parts)


@pytest.mark.asyncio
async def test_another_tenants_request_runs_part_way_through_the_floods_step(client, long_parts):
    streaming = asyncio.Event()
    flood = [asyncio.create_task(tokens(client, "user:a", FLOOD_TOKENS, streaming)) for _ in range(FLOOD)]
    await asyncio.wait_for(streaming.wait(), 30)
    paused = 0
    for i in range(20):  # each from a tenant of its own, so each is a newcomer
        # sent a while after the last one ended: its last token came with a step's end, and a
        # request sent at once landed between two steps every time in a slow run (the full suite's)
        await asyncio.sleep(0.05)
        assert await tokens(client, f"user:b{i}", 2) == 2
        paused = client.live_workers(MODEL)[0].stats.get("num_paused_steps", 0)
        if paused or all(t.done() for t in flood):
            break
    assert await asyncio.gather(*flood) == [FLOOD_TOKENS] * FLOOD
    for _ in range(50):  # the heartbeat's stats lag the engine by up to a beat
        paused = client.live_workers(MODEL)[0].stats.get("num_paused_steps", 0)
        if paused:
            break
        await asyncio.sleep(0.1)
    assert paused >= 1
