"""workers.engine_worker.follow_active_version: one process swapping engines as the active version changes.

Run in a thread of the test (so without signal handlers) against the real redis-server; what
should be served comes from a plain callable, as run_engine_worker's registry query would give it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from workers.engine_worker import ServeSpec, follow_active_version
from workers.protocol import GenerateRequest
from workers.redis_transport import RedisEngineClient

SETTINGS = {"num_kv_blocks": 64, "max_model_len": 256, "max_num_seqs": 4}


def wait_until(predicate, timeout: float = 90.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        assert time.monotonic() < deadline, f"not reached in {timeout} s: {what}"
        time.sleep(0.05)
    return result


@pytest.mark.asyncio
async def test_a_new_version_takes_over_while_the_running_request_finishes_on_the_old(
        redis_server, tiny_llama_dir):
    model = f"follow-{uuid.uuid4().hex[:6]}"
    spec = {"now": ServeSpec("1", str(tiny_llama_dir), SETTINGS)}
    stop = threading.Event()
    follower = threading.Thread(target=follow_active_version, args=(model, lambda: spec["now"]),
                                kwargs={"redis_url": redis_server, "drain_timeout": 60, "poll_interval": 0.1,
                                        "stop": stop}, daemon=True)
    client = RedisEngineClient(redis_server)

    def versions() -> list[tuple[str, bool]]:
        return sorted((w.version, w.draining) for w in client.live_workers(model))

    follower.start()
    await asyncio.to_thread(wait_until, lambda: versions() == [("1", False)], what="v1 announced")
    stream = client.generate(GenerateRequest(f"req-{uuid.uuid4().hex}", model, [5, 6, 7],
                                             {"temperature": 0, "max_tokens": 200, "ignore_eos": True}))
    chunks = [await anext(stream)]

    spec["now"] = ServeSpec("2", str(tiny_llama_dir), {**SETTINGS, "max_num_seqs": 3})
    await asyncio.to_thread(wait_until, lambda: ("2", False) in versions(), what="v2 announced")
    assert ("1", True) in versions() or not any(v == "1" for v, _ in versions())  # v1 drains, if still there
    chunks += [chunk async for chunk in stream]

    last = chunks[-1]
    assert last.error is None and last.finish_reason == "length" and last.num_output_tokens == 200
    await asyncio.to_thread(wait_until, lambda: versions() == [("2", False)], what="v1 leaving")
    [worker] = client.live_workers(model)
    assert worker.max_num_seqs == 3

    spec["now"] = None  # no active version: the worker drains and the process waits
    await asyncio.to_thread(wait_until, lambda: versions() == [], 30, "the worker draining")
    assert follower.is_alive()
    spec["now"] = ServeSpec("3", str(tiny_llama_dir), SETTINGS)
    await asyncio.to_thread(wait_until, lambda: versions() == [("3", False)], what="v3 announced")

    stop.set()
    await asyncio.to_thread(follower.join, 30)
    assert not follower.is_alive() and versions() == []
