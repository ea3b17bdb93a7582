"""Faults under real worker processes and a real redis-server: a drain, a Redis restart.

Each test starts workers of its own (``spawn_worker``) under a model name no other test uses,
so the session's ``serving_pair`` is not disturbed. Timings are generous: two shared cores.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import redis

from tests.conftest import REDIS_SERVER, free_port
from workers.protocol import GenerateRequest
from workers.redis_transport import RedisEngineClient

pytestmark = pytest.mark.slow

PROMPT = [5, 6, 7, 8, 9]


def request(model: str, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(f"req-{uuid.uuid4().hex}", model, PROMPT,
                           {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True})


async def collect(client, req: GenerateRequest) -> list:
    return [chunk async for chunk in client.generate(req)]


@pytest.mark.asyncio
async def test_sigterm_to_one_of_two_workers_under_six_streams_lets_every_stream_complete(
        redis_server, spawn_worker, wait_workers):
    model = f"drain-{uuid.uuid4().hex[:6]}"
    workers = [spawn_worker(model, max_num_seqs=4) for _ in range(2)]
    wait_workers(model, 2, workers)
    client = RedisEngineClient(redis_server)
    streams = [asyncio.create_task(collect(client, request(model, 200))) for _ in range(6)]
    # SIGTERM once both workers run some of them (their heartbeats count what they hold).
    deadline = time.monotonic() + 60
    while not all(w.stats.get("num_inflight", 0) > 0 for w in client.live_workers(model)):
        assert time.monotonic() < deadline, "the streams did not reach both workers"
        await asyncio.sleep(0.1)
    stopped = workers[0]
    stopped.signal(signal.SIGTERM)

    results = await asyncio.wait_for(asyncio.gather(*streams), 240)
    code = await asyncio.to_thread(stopped.proc.wait, 60)

    ends = [(chunks[-1].finish_reason, chunks[-1].error) for chunks in results]
    assert ends == [("length", None)] * 6, stopped.log()[-3000:]
    assert [sum(len(c.token_ids) for c in chunks) for chunks in results] == [200] * 6
    assert code == 0
    assert "unfinished at shutdown" not in stopped.log()
