"""A model's workers over their lifetime: a new version takes over, old ones drain, stops and deaths.

The same hand-over (new worker ready -> older ones drain) is checked in embedded mode (threads of
this process, the in-process broker) and in a worker process following the active version
(``follow_active_version`` in a thread of the test, so without signal handlers, over the real
redis-server); both run workers.serving.ModelServer. Then the ways a worker stops: past its
drain timeout, SIGKILL, SIGTERM, and a version that cannot load.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import uuid

import pytest
import redis

from workers import embedded
from workers.connect import get_engine_client
from workers.protocol import GenerateRequest, Reply
from workers.redis_transport import RedisEngineClient, reply_stream
from workers.serving import ModelServer, ServeSpec, embedded_engine_nice, follow_active_version

PROMPT = [11, 12, 13]
SETTINGS = {"num_kv_blocks": 64, "max_model_len": 256, "max_num_seqs": 4}


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


@pytest.fixture
def client():
    """The in-process client of embedded workers; every embedded worker is stopped after."""
    yield get_engine_client(None)
    embedded.stop_embedded_workers(drain_timeout=5)


# ------------------------------------------------------------------ a new version takes over
@pytest.mark.slow
def test_embedded_a_new_version_takes_over_and_the_old_worker_leaves(client, tiny_llama_dir,
                                                                    tiny_settings):
    embedded.start_embedded_worker("tiny-swap", "v1", str(tiny_llama_dir), tiny_settings)
    assert embedded.wait_for_embedded_worker("tiny-swap", timeout=60)

    embedded.start_embedded_worker("tiny-swap", "v2", str(tiny_llama_dir), tiny_settings)
    assert embedded.wait_for_embedded_worker("tiny-swap", timeout=60)

    deadline = time.monotonic() + 5
    while len(client.live_workers("tiny-swap")) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [w.version for w in client.live_workers("tiny-swap")] == ["v2"]


# ------------------------------------------------------------------ the web thread first
def _thread_nices() -> dict[int, int]:
    return {int(tid): os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir("/proc/self/task")}


@pytest.mark.slow
@pytest.mark.asyncio
async def test_an_embedded_worker_and_the_kernel_threads_it_starts_run_below_the_web_thread(
        client, tiny_llama_dir, tiny_settings, monkeypatch):
    """In embedded mode the engine worker is a thread of the web process: it and the threads its
    kernels start (they inherit its nice value) yield the CPU to the web thread."""
    monkeypatch.setenv("PAGODA_EMBEDDED_ENGINE_NICE", "7")
    before = _thread_nices()
    embedded.start_embedded_worker("tiny-nice", "v1", str(tiny_llama_dir), tiny_settings)
    assert embedded.wait_for_embedded_worker("tiny-nice", timeout=60)
    chunks = [chunk async for chunk in client.generate(request("tiny-nice", 8))]
    assert chunks[-1].error is None and chunks[-1].num_output_tokens == 8
    new = {tid: nice for tid, nice in _thread_nices().items() if tid not in before}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0  # this thread: the web's
    at_7 = [tid for tid, nice in new.items() if nice == 7]
    assert at_7, f"no thread at nice 7 among the worker's: {new}"
    import torch
    if torch.get_num_threads() > 1:  # the worker's OpenMP team: its own thread and the others
        assert len(at_7) >= torch.get_num_threads(), new


def test_the_embedded_engines_nice_value_is_read_and_checked(monkeypatch):
    monkeypatch.delenv("PAGODA_EMBEDDED_ENGINE_NICE", raising=False)
    assert embedded_engine_nice() == 5  # the default: the web thread first
    for raw, value in (("0", 0), ("19", 19), (" 3 ", 3)):
        monkeypatch.setenv("PAGODA_EMBEDDED_ENGINE_NICE", raw)
        assert embedded_engine_nice() == value
    for raw in ("-1", "20", "five", ""):
        monkeypatch.setenv("PAGODA_EMBEDDED_ENGINE_NICE", raw)
        with pytest.raises(ValueError, match="PAGODA_EMBEDDED_ENGINE_NICE must be a whole number"):
            embedded_engine_nice()
    monkeypatch.setenv("PAGODA_EMBEDDED_ENGINE_NICE", "5")
    assert ModelServer("m", redis_url=None).nice == 5
    assert ModelServer("m", redis_url="redis://127.0.0.1:1/0").nice == 0  # its own process


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_following_a_new_version_takes_over_while_the_running_request_finishes_on_the_old(
        redis_server, tiny_llama_dir):
    model = f"follow-{uuid.uuid4().hex[:6]}"
    spec = {"now": ServeSpec("1", str(tiny_llama_dir), SETTINGS)}
    stop = threading.Event()
    follower = threading.Thread(target=follow_active_version, args=(model, lambda: spec["now"]),
                                kwargs={"redis_url": redis_server, "drain_timeout": 60,
                                        "poll_interval": 0.1, "stop": stop}, daemon=True)
    client = RedisEngineClient(redis_server)

    def versions() -> list[tuple[str, bool]]:
        return sorted((w.version, w.draining) for w in client.live_workers(model))

    def until(predicate, what: str, timeout: float = 90.0):
        return asyncio.to_thread(wait_until, predicate, timeout, lambda: what)

    follower.start()
    await until(lambda: versions() == [("1", False)], "v1 announced")
    stream = client.generate(GenerateRequest(f"req-{uuid.uuid4().hex}", model, [5, 6, 7],
                                             {"temperature": 0, "max_tokens": 200, "ignore_eos": True}))
    chunks = [await anext(stream)]

    spec["now"] = ServeSpec("2", str(tiny_llama_dir), {**SETTINGS, "max_num_seqs": 3})
    await until(lambda: ("2", False) in versions(), "v2 announced")
    # v2's announcement comes first, then v1 is told to drain and says so: a snapshot between the
    # two sees both taking requests, so wait for v1's draining (or its leaving), not assert it
    await until(lambda: ("1", True) in versions() or not any(v == "1" for v, _ in versions()),
                "v1 draining once v2 is ready")
    chunks += [chunk async for chunk in stream]

    last = chunks[-1]
    assert last.error is None and last.finish_reason == "length" and last.num_output_tokens == 200
    await until(lambda: versions() == [("2", False)], "v1 leaving")
    [worker] = client.live_workers(model)
    assert worker.max_num_seqs == 3

    spec["now"] = None  # no active version: the worker drains and the process waits
    await until(lambda: versions() == [], "the worker draining", 30)
    assert follower.is_alive()
    spec["now"] = ServeSpec("3", str(tiny_llama_dir), SETTINGS)
    await until(lambda: versions() == [("3", False)], "v3 announced")

    stop.set()
    await asyncio.to_thread(follower.join, 30)
    assert not follower.is_alive() and versions() == []


@pytest.mark.slow
def test_a_version_that_cannot_load_is_not_retried_until_the_spec_changes_or_a_stop(
        client, tiny_llama_dir, tiny_settings, tmp_path):
    server = ModelServer("tiny-broken", redis_url=None, drain_timeout=5)
    good = ServeSpec("1", str(tiny_llama_dir), tiny_settings)
    broken = ServeSpec("2", str(tmp_path / "missing"), tiny_settings)
    assert server.serve(good) and server.wait_ready(60)

    assert server.serve(broken)
    wait_until(lambda: server.failed == broken, 30, lambda: "the broken version failing")
    assert not server.serve(broken)  # the same spec again: not reloaded
    assert [w.version for w in client.live_workers("tiny-broken")] == ["1"]  # the old one serves

    assert server.stop()  # forgets the failure: the same spec is tried again
    assert server.serve(broken)
    wait_until(lambda: server.failed == broken, 30, lambda: "the broken version failing again")
    assert server.join(10)


# ------------------------------------------------------------------ stopping and dying
@pytest.mark.slow
@pytest.mark.asyncio
async def test_stopping_past_the_drain_timeout_ends_running_requests_with_worker_lost(
        client, tiny_llama_dir, tiny_settings):
    embedded.start_embedded_worker("tiny-stop", "v1", str(tiny_llama_dir), tiny_settings)
    assert embedded.wait_for_embedded_worker("tiny-stop", timeout=60)
    stream = client.generate(request("tiny-stop", 240))
    first = await anext(stream)

    stopping = asyncio.create_task(asyncio.to_thread(embedded.stop_embedded_workers, 0.1))
    rest = [chunk async for chunk in stream]
    await asyncio.wait_for(stopping, 10)

    assert first.error is None
    assert rest[-1].error is not None and rest[-1].error.code == "worker_lost"
    assert sum(len(c.token_ids) for c in [first, *rest]) < 240
    assert client.live_workers("tiny-stop") == []


@pytest.mark.e2e
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


@pytest.mark.e2e
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
