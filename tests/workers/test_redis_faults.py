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
NUM_LONG = 512 - len(PROMPT)


def request(model: str, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(f"req-{uuid.uuid4().hex}", model, PROMPT,
                           {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True})


async def collect(client, req: GenerateRequest, started: asyncio.Event | None = None) -> list:
    chunks = []
    async for chunk in client.generate(req):
        chunks.append(chunk)
        if started is not None:
            started.set()
    return chunks


@pytest.mark.asyncio
async def test_sigterm_to_one_of_two_workers_under_six_streams_lets_every_stream_complete(
        redis_server, spawn_worker, wait_workers):
    model = f"drain-{uuid.uuid4().hex[:6]}"
    # The longest generations the tiny model allows (507 tokens), on KV pools of 4 of them.
    workers = [spawn_worker(model, max_num_seqs=4, max_model_len=512) for _ in range(2)]
    wait_workers(model, 2, workers)
    client = RedisEngineClient(redis_server)
    started = asyncio.Event()
    streams = [asyncio.create_task(collect(client, request(model, NUM_LONG), started)) for _ in range(6)]
    # SIGTERM to a worker as soon as the streams run: the one whose heartbeat says it runs some,
    # or, when the first tokens arrive before any heartbeat tells (heartbeats come every second,
    # an idle machine streams these in about as long), the first worker: six streams on two
    # pools of four, and a worker takes no more than its pool can start, so both hold some.
    deadline = time.monotonic() + 60
    while not (busy := [w for w in client.live_workers(model) if w.stats.get("num_inflight", 0) > 0]):
        if started.is_set():
            break
        assert time.monotonic() < deadline, "no worker took the streams"
        await asyncio.sleep(0.02)
    stopped = next(w for w in workers if w.proc.pid == busy[0].pid) if busy else workers[0]
    stopped.signal(signal.SIGTERM)

    results = await asyncio.wait_for(asyncio.gather(*streams), 240)
    code = await asyncio.to_thread(stopped.proc.wait, 60)

    ends = [(chunks[-1].finish_reason, chunks[-1].error) for chunks in results]
    assert ends == [("length", None)] * 6, stopped.log()[-3000:]
    assert [sum(len(c.token_ids) for c in chunks) for chunks in results] == [NUM_LONG] * 6
    assert code == 0
    assert "unfinished at shutdown" not in stopped.log()


class RedisProcess:
    """A redis-server of this test alone (no persistence), restartable on the same port."""

    def __init__(self, data_dir: Path):
        self.port = free_port()
        self.data_dir = data_dir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.data_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                assert self.proc.poll() is None and time.monotonic() < deadline, "no redis-server"
                time.sleep(0.05)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def own_redis(tmp_path):
    server = RedisProcess(tmp_path)
    server.start()
    yield server
    if server.proc.poll() is None:
        server.kill()


@pytest.mark.asyncio
async def test_a_worker_survives_a_redis_restart_and_serves_again_within_30_s(
        own_redis, tiny_llama_dir, tmp_path):
    from tests.workers.conftest import kill_all, start_worker, wait_for_workers

    worker = start_worker(own_redis.url, tiny_llama_dir, tmp_path, "phoenix")
    try:
        wait_for_workers(own_redis.url, "phoenix", 1, [worker])
        client = RedisEngineClient(own_redis.url)
        before = await collect(client, request("phoenix", 4))
        assert before[-1].finish_reason == "length"

        own_redis.kill()  # no persistence: the restarted server has no stream, group or key
        down = await collect(client, request("phoenix", 4))
        started = time.monotonic()
        refused_in = await _timed(collect(client, request("phoenix", 4)))
        own_redis.start()
        restarted_at = time.monotonic()
        while True:
            chunks = await collect(client, request("phoenix", 4))
            if chunks[-1].error is None:
                break
            assert time.monotonic() - restarted_at < 30, chunks[-1].error
            await asyncio.sleep(0.2)
        recovered_in = time.monotonic() - restarted_at
        print(f"refused in {refused_in:.2f} s while down; served again {recovered_in:.1f} s "
              f"after the restart")

        assert [c.error.code for c in down] == ["queue_unavailable"]
        assert refused_in < 5 and started  # fast, not a hang
        assert chunks[-1].finish_reason == "length" and chunks[-1].num_output_tokens == 4
        assert worker.proc.poll() is None, worker.log()[-3000:]
        assert "crashed" not in worker.log()
        assert len(client.live_workers("phoenix")) == 1  # announced itself again
    finally:
        kill_all([worker])


async def _timed(awaitable) -> float:
    started = time.monotonic()
    await awaitable
    return time.monotonic() - started
