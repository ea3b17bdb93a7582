"""A worker takes a backlog into its engine when the engine shares it fairly across tenants, so one
tenant's flood does not keep another's request in the shared first-come-first-served queue; with
fair share off it takes only what its engine can start (embedded workers, the tiny random Llama)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from workers import embedded
from workers.memory_transport import MemoryEngineClient, default_broker
from workers.protocol import GenerateRequest

FAIR, FIFO = "tiny-fair", "tiny-fifo"
SEATS = 2
PROMPT = [5, 6, 7, 8, 9]

pytestmark = pytest.mark.slow  # each test streams a few hundred tokens (about a second on 2 busy cores)


@pytest.fixture(scope="module")
def client(tiny_llama_dir, tiny_settings):
    settings = {**tiny_settings, "max_num_seqs": SEATS}
    embedded.start_embedded_worker(FAIR, "v1", str(tiny_llama_dir), settings)
    embedded.start_embedded_worker(FIFO, "v1", str(tiny_llama_dir), {**settings, "fair_share": False})
    assert embedded.wait_for_embedded_worker(FAIR, timeout=60)
    assert embedded.wait_for_embedded_worker(FIFO, timeout=60)
    yield MemoryEngineClient(default_broker())
    embedded.stop_embedded_workers(drain_timeout=5)


async def finishing_order(client, model: str) -> list[str]:
    """Tenant a sends 2 x SEATS - 1 long requests; once its first ones stream, tenant b sends one
    short request. Returns the requests in the order they finished."""
    finished: list[str] = []
    streaming = asyncio.Event()

    async def run(name: str, tenant: str, max_tokens: int) -> None:
        req = GenerateRequest(f"{name}-{uuid.uuid4().hex}", model, PROMPT,
                              {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}, tenant=tenant)
        async for chunk in client.generate(req):
            assert chunk.error is None, chunk.error
            streaming.set()
        finished.append(name)

    flood = [asyncio.create_task(run(f"a{i}", "user:a", 120)) for i in range(2 * SEATS - 1)]
    await asyncio.wait_for(streaming.wait(), 30)
    await asyncio.gather(run("b", "user:b", 4), *flood)
    return finished


@pytest.mark.asyncio
async def test_another_tenants_request_does_not_wait_for_the_flood_ahead_of_it(client):
    # The worker took the flood's third request into its engine (2 x its 2 seats): b's is taken at
    # once, and takes the seat of a's newest, so it ends long before a's 120-token answers.
    assert (await finishing_order(client, FAIR))[0] == "b"


@pytest.mark.asyncio
async def test_with_fair_share_off_it_waits_in_the_queue_behind_the_flood(client):
    # The flood's third request waits in the shared queue, b's behind it: b starts only once a's
    # first two answers have ended.
    assert (await finishing_order(client, FIFO))[:2] == ["a0", "a1"]
