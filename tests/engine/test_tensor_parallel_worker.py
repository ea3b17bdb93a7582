"""A worker with tensor_parallel_size 2 is one worker to the rest of Pagoda, and a rank that dies
fails its requests with worker_lost and takes the worker away, never a hang.

The worker is embedded (a thread of this process, the in-process broker), so its rank 1 is a
child process of this one: found by its command line, then SIGKILLed mid-stream.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from workers import embedded
from workers.connect import get_engine_client
from workers.protocol import GenerateRequest

SETTINGS = {"num_kv_blocks": 64, "max_model_len": 256, "tensor_parallel_size": 2,
            "dtype": "float32"}


def rank_processes() -> list[int]:
    """Pids of this process's tensor-parallel rank children."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"engine.runtime.rank_main" in cmdline:
            pids.append(int(stat.parent.name))
    return pids


@pytest.fixture
def client():
    yield get_engine_client(None)
    embedded.stop_embedded_workers(drain_timeout=5)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_killed_rank_gives_the_stream_worker_lost_and_the_worker_leaves(
        client, tiny_llama_dir):
    embedded.start_embedded_worker("tiny-tp", "v1", str(tiny_llama_dir), SETTINGS)
    assert embedded.wait_for_embedded_worker("tiny-tp", timeout=90)
    assert len(client.live_workers("tiny-tp")) == 1  # two ranks, one worker
    (rank1,) = rank_processes()

    stream = client.generate(GenerateRequest(
        f"req-{uuid.uuid4().hex}", "tiny-tp", [11, 12, 13],
        {"temperature": 0, "max_tokens": 240, "ignore_eos": True}))
    first = await anext(stream)
    assert first.error is None and not first.finished
    os.kill(rank1, signal.SIGKILL)
    killed_at = time.monotonic()
    rest = [chunk async for chunk in stream]

    assert time.monotonic() - killed_at < 10.0
    assert rest[-1].finished and rest[-1].error is not None
    assert rest[-1].error.code == "worker_lost" and "rank 1" in rest[-1].error.message
    deadline = time.monotonic() + 10
    while client.live_workers("tiny-tp") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.live_workers("tiny-tp") == []
