"""A batch's share of the engine (webapp/batches/share.py), against a real embedded worker serving
the tiny Llama and real interactive requests through its engine client: a batch alone is never
set aside for its own lines, running lines step aside for an interactive request and run after it,
and interactive requests that never stop still let one line in at a time (the minimum share)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from engine.llm_engine import LLMEngine
from tests.webapp.test_batches import (MODEL, PROMPTS, auth, jsonl, keys, request_line, served,  # noqa: F401
                                       upload, worker)
from webapp.batches.models import Batch, BatchLine
from webapp.batches.runner import batch_run
from webapp.usage.models import UsageRecord
from workers.connect import get_engine_client
from workers.protocol import GenerateRequest

LINE_TOKENS = 300  # with the interactive request's 300, within the pool's 1,024 tokens


def create_batch(client, raw_key: str, lines: list[dict]) -> int:
    file = upload(client, raw_key, jsonl(lines)).json()
    public_id = client.post("/v1/batches", json.dumps({"input_file_id": file["id"], "endpoint": "/v1/completions",
                                                       "completion_window": "24h"}),
                            content_type="application/json", **auth(raw_key)).json()["id"]
    return Batch.objects.get(public_id=public_id).pk


def wait_until_the_worker_holds_a_request(engine, timeout: float = 60.0) -> None:
    """As a heartbeat sent from now on says (the last one may still count the previous test's lines)."""
    since, deadline = time.time(), time.monotonic() + timeout
    while time.monotonic() < deadline and not any(w.stats.get("num_inflight") and w.last_heartbeat > since
                                                  for w in engine.live_workers(MODEL)):
        time.sleep(0.05)


async def interactive(engine, request_id: str, max_tokens: int) -> str | None:
    """One interactive request to its end; its finish reason."""
    request = GenerateRequest(request_id=request_id, model=MODEL, prompt_token_ids=[1, 2, 3],
                              params={"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0})
    finish_reason = None
    async for chunk in engine.generate(request):
        finish_reason = chunk.finish_reason
    return finish_reason


@pytest.mark.slow
def test_a_batch_running_alone_is_never_preempted_and_keeps_its_lines_in_flight(client, served, keys):
    """Its own lines are not taken for someone else's: the workers' counts (as of their last
    heartbeat) include lines the runner has just sent. (Counting them before a refill, the runner
    once saw others' requests in 3 of 5 waves and preempted every line for 3 s each time.)"""
    batch_id = create_batch(client, keys["alice"], [request_line(i, PROMPTS[i % 5], max_tokens=40, ignore_eos=True)
                                                    for i in range(12)])

    assert batch_run(batch_id=batch_id) == "completed"

    lines = list(BatchLine.objects.filter(batch_id=batch_id))
    assert [line.status for line in lines] == ["completed"] * 12 and all(line.num_attempts == 1 for line in lines)
    assert not UsageRecord.objects.filter(status="aborted").exists()  # no line was preempted


@pytest.mark.slow
def test_running_lines_step_aside_for_an_interactive_request_and_run_again_after_it(client, served, keys,
                                                                                  monkeypatch, settings):
    """Engine steps paced (20 ms) so both outlast the runner's look at the workers (a few 1 s
    heartbeats): the interactive request arrives while lines run, they are preempted (aborted,
    queued again) and finish after it. (At 10 ms and 150 tokens a line could end before the runner
    saw the interactive request: the PostgreSQL run caught it.) The minimum share would let a line
    in after PAGODA_BATCH_MAX_STARVATION_S of waiting; the interactive request takes 6 s at the
    least (300 paced steps) and more on a loaded machine, so the share is set past the helper's
    60 s here: this test is about stepping aside, the next one about the share."""
    settings.PAGODA_BATCH_MAX_STARVATION_S = 120.0
    step = LLMEngine.step
    monkeypatch.setattr(LLMEngine, "step", lambda self: (time.sleep(0.02), step(self))[1])
    engine = get_engine_client(None)
    ended = {}

    def when_lines_run():
        wait_until_the_worker_holds_a_request(engine)
        ended["finish_reason"] = asyncio.run(interactive(engine, "interactive-1", 300))
        ended["at"] = timezone.now()

    batch_id = create_batch(client, keys["alice"], [request_line(i, p, max_tokens=LINE_TOKENS, ignore_eos=True)
                                                    for i, p in enumerate(PROMPTS[:2])])
    helper = threading.Thread(target=when_lines_run)
    helper.start()
    assert batch_run(batch_id=batch_id) == "completed"
    helper.join(60)

    lines = list(BatchLine.objects.filter(batch_id=batch_id))
    assert ended["finish_reason"] == "length" and [line.status for line in lines] == ["completed"] * 2
    assert all(line.num_attempts == 1 for line in lines)  # a preemption is not an attempt
    final = UsageRecord.objects.filter(request_id__in=[line.request_id for line in lines])
    assert [(r.status, r.completion_tokens) for r in final] == [("ok", LINE_TOKENS)] * 2
    assert all(r.created_at > ended["at"] for r in final), ([r.created_at for r in final], ended["at"])
    preempted = UsageRecord.objects.filter(api_key__owner__username="alice", status="aborted")
    assert preempted.count() >= 1  # the tokens they used are on record


STARVATION_S = 1.5


@pytest.mark.slow
def test_interactive_requests_that_never_stop_still_let_one_line_in_at_a_time(client, served, keys, settings):
    """Interactive requests back to back from before the batch starts until it ends (60 s at most):
    without a minimum share the batch would wait for them to stop. Each line gets in after the
    batch has waited STARVATION_S with none running, runs alone and to its end (not preempted),
    and the batch steps aside again for STARVATION_S before the next."""
    settings.PAGODA_BATCH_MAX_STARVATION_S = STARVATION_S
    engine = get_engine_client(None)
    stop, spans = threading.Event(), []

    def traffic():  # two streams, so that the gap between two requests of one is never idle
        async def back_to_back(stream: int):
            deadline = time.monotonic() + 60
            while not stop.is_set() and time.monotonic() < deadline:
                started = timezone.now()
                await interactive(engine, f"interactive-{stream}-{len(spans)}", 100)
                spans.append((started, timezone.now()))

        async def both():
            await asyncio.gather(back_to_back(0), back_to_back(1))
        asyncio.run(both())

    helper = threading.Thread(target=traffic)
    helper.start()
    try:
        wait_until_the_worker_holds_a_request(engine)
        batch_id = create_batch(client, keys["alice"], [request_line(i, p, max_tokens=20, ignore_eos=True)
                                                        for i, p in enumerate(PROMPTS[:3])])
        began = timezone.now()
        assert batch_run(batch_id=batch_id) == "completed"
        batch_ended = timezone.now()
    finally:
        stop.set()
        helper.join(60)

    lines = list(BatchLine.objects.filter(batch_id=batch_id).order_by("line_number"))
    assert [line.status for line in lines] == ["completed"] * 3 and all(line.num_attempts == 1 for line in lines)
    assert not UsageRecord.objects.filter(api_key__owner__username="alice", status="aborted").exists()
    records = sorted(UsageRecord.objects.filter(request_id__in=[line.request_id for line in lines]),
                     key=lambda r: r.created_at)
    runs = [(r.created_at - timedelta(seconds=r.latency), r.created_at) for r in records]
    # the interactive requests never stopped: they ran from before the batch began to after it ended
    assert min(start for start, _ in spans) < began and any(s <= batch_ended <= e for s, e in spans)
    assert (runs[0][0] - began).total_seconds() >= STARVATION_S - 0.5, (began, runs)
    for (_, previous_end), (start, _) in zip(runs, runs[1:]):  # one at a time, STARVATION_S apart
        assert (start - previous_end).total_seconds() >= STARVATION_S - 0.5, runs
