"""Each request's usage report (workers/protocol.py UsageReport): kept by the transport, not by the
web process, so a web process that dies mid-request leaves its tokens readable to the reconciler
(webapp/usage/reconcile.py). Written by the worker side with every chunk it sends, read and
aborted through the client side without an event loop.

The same scenario runs on both transports: the in-process broker (embedded mode) and real Redis.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from workers.memory_transport import MemoryBroker, MemoryEngineClient, MemoryWorkerTransport
from workers.protocol import WORKER_LOST, Chunk, ErrorInfo, GenerateRequest, Reply, WorkerInfo
from workers.redis_transport import RedisEngineClient, reply_stream, usage_key
from workers.redis_worker_transport import RedisWorkerTransport


def chunk(request_id: str, num_output_tokens: int, *, finished: bool = False) -> Chunk:
    return Chunk(request_id, "x" * num_output_tokens, list(range(num_output_tokens)), None, finished,
                 "length" if finished else None, 7, num_output_tokens, 3, 0.25)


def exchange_chunks(transport, request_id: str, reply_to: str, *chunks: Chunk) -> None:
    transport.exchange([(reply_to, Reply("chunk", transport.worker_id, c)) for c in chunks], 0, 0.0)


def the_report_follows_the_chunks_and_a_failure_keeps_the_counts(transport, client, reply_to) -> None:
    finished_id, failed_id = f"req-{uuid.uuid4().hex}", f"req-{uuid.uuid4().hex}"
    exchange_chunks(transport, finished_id, reply_to(finished_id), chunk(finished_id, 4), chunk(finished_id, 9))
    exchange_chunks(transport, failed_id, reply_to(failed_id), chunk(failed_id, 5))
    running = client.usage_reports([finished_id, failed_id, "req-never-sent"])

    exchange_chunks(transport, finished_id, reply_to(finished_id), chunk(finished_id, 12, finished=True))
    exchange_chunks(transport, failed_id, reply_to(failed_id),
                    Chunk.failure(failed_id, ErrorInfo(WORKER_LOST, "the worker shut down")))
    ended = client.usage_reports([finished_id, failed_id])

    assert set(running) == {finished_id, failed_id}
    assert (running[finished_id].num_output_tokens, running[finished_id].finished) == (9, False)
    assert ended[finished_id].finished and ended[finished_id].finish_reason == "length"
    assert (ended[finished_id].num_prompt_tokens, ended[finished_id].num_output_tokens,
            ended[finished_id].num_cached_tokens, ended[finished_id].time_to_first_token) == (7, 12, 3, 0.25)
    assert (ended[finished_id].worker_id, ended[finished_id].model) == (transport.worker_id, "tiny")
    assert ended[failed_id].finished and ended[failed_id].error_code == WORKER_LOST
    assert (ended[failed_id].num_prompt_tokens, ended[failed_id].num_output_tokens) == (7, 5)


def test_the_embedded_broker_keeps_each_requests_report():
    broker = MemoryBroker()
    the_report_follows_the_chunks_and_a_failure_keeps_the_counts(
        MemoryWorkerTransport(broker, "tiny", "worker-a"), MemoryEngineClient(broker), lambda r: f"memory:{r}")


def test_redis_keeps_each_requests_report_for_its_ttl_after_the_last_chunk(redis_server):
    transport = RedisWorkerTransport(redis_server, "tiny", f"worker-{uuid.uuid4().hex[:6]}")
    client = RedisEngineClient(redis_server)
    try:
        the_report_follows_the_chunks_and_a_failure_keeps_the_counts(transport, client, reply_stream)
        some_id = f"req-{uuid.uuid4().hex}"
        exchange_chunks(transport, some_id, reply_stream(some_id), chunk(some_id, 1))
        assert 590 < transport.r.ttl(usage_key(some_id)) <= 600
    finally:
        transport.close()


def test_abort_now_reaches_the_workers_of_the_model_without_an_event_loop(redis_server):
    broker = MemoryBroker()
    memory_side = MemoryWorkerTransport(broker, "tiny", "worker-a")
    memory_side.heartbeat(WorkerInfo("worker-a", "tiny", "v1", "host", 1, 0.0, 0.0, 1, 16))
    redis_side = RedisWorkerTransport(redis_server, "tiny", f"worker-{uuid.uuid4().hex[:6]}")
    try:
        MemoryEngineClient(broker).abort_now("tiny", ["req-1", "req-2"])
        RedisEngineClient(redis_server).abort_now("tiny", ["req-3"])
        heard, deadline = [], time.monotonic() + 5
        while not heard and time.monotonic() < deadline:
            heard = redis_side.poll_aborts()
            time.sleep(0.02)
        assert memory_side.poll_aborts() == ["req-1", "req-2"]
        assert heard == ["req-3"]
    finally:
        redis_side.close()


def test_a_real_worker_reports_what_its_last_chunk_says(redis_server, serving_pair):
    client = RedisEngineClient(redis_server)
    req = GenerateRequest(f"req-{uuid.uuid4().hex}", "tiny", [5, 6, 7, 8, 9],
                          {"temperature": 0, "max_tokens": 6, "ignore_eos": True})

    async def collect():
        return [c async for c in client.generate(req)]

    last = asyncio.run(collect())[-1]
    report = client.usage_reports([req.request_id])[req.request_id]

    assert last.finished and report.finished
    assert (report.num_prompt_tokens, report.num_output_tokens, report.num_cached_tokens, report.finish_reason) == \
        (last.num_prompt_tokens, last.num_output_tokens, last.num_cached_tokens, last.finish_reason) == \
        (5, 6, last.num_cached_tokens, "length")
    assert report.worker_id in {w.worker_id for w in client.live_workers("tiny")}
