"""Embedded workers being replaced and stopped."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from workers import transport
from workers.memory_transport import MemoryEngineClient, default_broker
from workers.protocol import GenerateRequest


@pytest.fixture
def client():
    yield MemoryEngineClient(default_broker())
    transport.stop_embedded_workers(drain_timeout=5)


def request(model: str, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(f"req-{uuid.uuid4().hex}", model, [3, 4, 5],
                           {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True})


def test_a_new_version_takes_over_and_the_old_worker_leaves(client, tiny_llama_dir, tiny_settings):
    transport.start_embedded_worker("tiny-swap", "v1", str(tiny_llama_dir), tiny_settings)
    assert transport.wait_for_embedded_worker("tiny-swap", timeout=60)

    transport.start_embedded_worker("tiny-swap", "v2", str(tiny_llama_dir), tiny_settings)
    assert transport.wait_for_embedded_worker("tiny-swap", timeout=60)

    deadline = time.monotonic() + 5
    while len(client.live_workers("tiny-swap")) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [w.version for w in client.live_workers("tiny-swap")] == ["v2"]


@pytest.mark.asyncio
async def test_stopping_past_the_drain_timeout_ends_running_requests_with_worker_lost(
        client, tiny_llama_dir, tiny_settings):
    transport.start_embedded_worker("tiny-stop", "v1", str(tiny_llama_dir), tiny_settings)
    assert transport.wait_for_embedded_worker("tiny-stop", timeout=60)
    stream = client.generate(request("tiny-stop", 240))
    first = await anext(stream)

    stopping = asyncio.create_task(asyncio.to_thread(transport.stop_embedded_workers, 0.1))
    rest = [chunk async for chunk in stream]
    await asyncio.wait_for(stopping, 10)

    assert first.error is None
    assert rest[-1].error is not None and rest[-1].error.code == "worker_lost"
    assert sum(len(c.token_ids) for c in [first, *rest]) < 240
    assert client.live_workers("tiny-stop") == []
