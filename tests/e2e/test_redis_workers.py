"""Two worker processes for one model behind Daphne and Redis, one of them stopped by SIGTERM.

A site of its own (Daphne, database) on the session's redis-server, under model slugs no other
site uses: "pair" (two `run_engine_worker` processes, drain timeout 30 s) and "brief" (one
process whose drain timeout, 0.3 s, is far shorter than a long generation). Which worker served a
request is read where the workers publish it: the claim on the request's reply stream, and each
worker's heartbeat (its pid, its draining flag, how many requests it has taken).
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import redis

from tests.e2e.sites import TINY_SETTINGS, Site, make_site
from workers.protocol import HEARTBEAT_INTERVAL_S, Reply
from workers.redis_transport import RedisEngineClient, reply_stream

pytestmark = pytest.mark.e2e

PAIR, BRIEF = "pair", "brief"
# Four sequences a worker: a burst of twelve long requests cannot all fit in one of them.
PAIR_SETTINGS = {**TINY_SETTINGS, "max_num_seqs": 4}
PAIR_DRAIN_S, BRIEF_DRAIN_S = 30.0, 0.05  # BRIEF: far shorter than 480 tokens on an idle machine
LONG = dict(prompt="Once upon a time", temperature=0, max_tokens=480, extra_body={"ignore_eos": True})
END_USER = "customer-1234"


@pytest.fixture(scope="module")
def site(tmp_path_factory, tiny_llama_dir, redis_server):
    site = make_site(tmp_path_factory.mktemp("workers_site"), {"REDIS_URL": redis_server})
    site.manage("register_model", PAIR, str(tiny_llama_dir), "--engine-settings", json.dumps(PAIR_SETTINGS))
    site.manage("register_model", BRIEF, str(tiny_llama_dir), "--engine-settings", json.dumps(TINY_SETTINGS))
    site.key = site.create_key("workers test")
    site.engine = RedisEngineClient(redis_server)
    site.redis = redis.Redis.from_url(redis_server, decode_responses=True)
    site.num_spawned = 0
    # The burst below is about the shared queue spreading requests over both workers: the gate
    # before Django admits by default only the seats the workers run (8 here) and refuses the
    # rest at once, so this site lets up to 16 in, the rest of the burst waiting for a worker.
    site.start_daphne({"PAGODA_MAX_REQUESTS_IN_FLIGHT": "16"})
    try:
        yield site
    finally:
        site.stop()


def spawn_worker(site, model: str, drain_timeout: float):
    site.num_spawned += 1
    return site.spawn(f"{model}-worker{site.num_spawned}", [
        sys.executable, "manage.py", "run_engine_worker", "--model", model, "--drain-timeout", str(drain_timeout)])


def serving(site, model: str) -> dict[int, dict]:
    """pid -> heartbeat (WorkerInfo as a dict) of the model's live workers that take requests."""
    return {w.pid: {"worker_id": w.worker_id, "draining": w.draining, **w.stats}
            for w in site.engine.live_workers(model) if not w.draining}


def wait_for_workers(site, model: str, procs) -> None:
    pids = {p.pid for p in procs}
    site.wait_until(lambda: pids <= set(serving(site, model)), f"{len(pids)} {model} workers announcing themselves")


def forget(site, proc) -> None:
    """A worker expected to exit: Site.wait_until must not take its death for a failure."""
    if proc in site.procs:
        site.procs.remove(proc)


@pytest.fixture
def pair(site):
    """Two live workers of "pair" (spawned again when an earlier test stopped one)."""
    site.pair = [p for p in getattr(site, "pair", []) if p.poll() is None]
    while len(site.pair) < 2:
        site.pair.append(spawn_worker(site, PAIR, PAIR_DRAIN_S))
    wait_for_workers(site, PAIR, site.pair)
    return list(site.pair)


@pytest.fixture
def client(site):
    return openai.OpenAI(base_url=f"{site.url}/v1", api_key=site.key, max_retries=0, timeout=120)


def requests_taken(site, model: str) -> dict[int, int]:
    time.sleep(1.5 * HEARTBEAT_INTERVAL_S)  # every heartbeat now counts what happened before
    return {pid: info["num_requests"] for pid, info in serving(site, model).items()}


def claimant(site, request_id: str) -> str:
    """The worker id that claimed ``request_id`` (the first message on its reply stream)."""
    first = site.redis.xrange(reply_stream(request_id), count=1)
    claim = Reply.from_dict(json.loads(first[0][1]["data"]))
    assert claim.kind == "claimed"
    return claim.worker_id


def claims_by(site, worker_id: str) -> int:
    """How many requests' reply streams open with a claim by ``worker_id``."""
    count = 0
    for key in site.redis.scan_iter(match=reply_stream("*"), count=1000):
        first = site.redis.xrange(key, count=1)
        if first and Reply.from_dict(json.loads(first[0][1]["data"])).worker_id == worker_id:
            count += 1
    return count


def first_text_chunk(chunks):
    chunk = next(chunks)
    while not (chunk.choices and chunk.choices[0].text):
        chunk = next(chunks)
    return chunk


def test_a_burst_is_served_by_both_workers_and_every_record_keeps_the_end_user(site, pair, client):
    before = requests_taken(site, PAIR)

    def call(i: int):
        stream = i % 2 == 1
        if i % 4 < 2:
            response = client.completions.create(model=PAIR, **{**LONG, "max_tokens": 128}, user=END_USER,
                                                 stream=stream)
        else:
            response = client.chat.completions.create(
                model=PAIR, messages=[{"role": "user", "content": f"Story {i}"}], temperature=0, max_tokens=128,
                extra_body={"ignore_eos": True}, user=END_USER, stream=stream)
        if not stream:
            return response.id, response.choices[0].finish_reason
        chunks = list(response)
        return chunks[0].id, next(c.choices[0].finish_reason for c in chunks if c.choices and
                                  c.choices[0].finish_reason)

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(call, range(12)))

    after = requests_taken(site, PAIR)
    taken = {pid: after[pid] - before[pid] for pid in before}
    print(f"requests taken per worker: {taken}")
    assert [reason for _id, reason in results] == ["length"] * 12
    assert sum(taken.values()) == 12
    assert all(n > 0 for n in taken.values()), taken
    records = [site.usage(request_id) for request_id, _reason in results]
    assert {(r["status"], r["end_user"], r["completion_tokens"]) for r in records} == {("ok", END_USER, 128)}


def test_sigterm_finishes_the_running_stream_sends_new_requests_to_the_other_worker_and_exits_0(
        site, pair, client):
    before = requests_taken(site, PAIR)
    stream = client.completions.create(model=PAIR, **LONG, stream=True, stream_options={"include_usage": True})
    chunks = iter(stream)
    first = first_text_chunk(chunks)
    worker_id = claimant(site, first.id)
    stopped = next(p for p in pair if serving(site, PAIR)[p.pid]["worker_id"] == worker_id)
    other = next(p for p in pair if p is not stopped)

    forget(site, stopped)
    stopped.send_signal(signal.SIGTERM)
    sigterm_at = time.monotonic()

    # New requests go elsewhere once the worker says it drains (its next loop iteration, ms later).
    def draining():
        return [w for w in site.engine.live_workers(PAIR) if w.pid == stopped.pid and w.draining]
    site.wait_until(draining, "the worker announcing that it drains", timeout=5)
    assert draining()[0].stats["num_inflight"] == 1  # the SIGTERM came while it was streaming
    with ThreadPoolExecutor(4) as pool:
        later = list(pool.map(lambda i: client.completions.create(model=PAIR, prompt=f"Later {i}", max_tokens=8,
                                                                   extra_body={"ignore_eos": True}), range(4)))
    rest = list(chunks)
    code = stopped.wait(timeout=PAIR_DRAIN_S + 10)
    exited_after = time.monotonic() - sigterm_at
    print(f"SIGTERMed worker exited {exited_after:.1f} s after the signal with code {code}")

    text = first.choices[0].text + "".join(c.choices[0].text for c in rest if c.choices)
    assert [c.choices[0].finish_reason for c in rest if c.choices][-1] == "length"
    assert rest[-1].usage.completion_tokens == 480 and text
    assert site.usage(first.id)["status"] == "ok"
    assert code == 0 and exited_after < PAIR_DRAIN_S
    assert [r.choices[0].finish_reason for r in later] == ["length"] * 4
    assert requests_taken(site, PAIR) == {other.pid: before[other.pid] + 4}  # all four went to the other


def test_a_drain_timeout_shorter_than_the_generation_ends_requests_with_worker_lost_and_error_usage(
        site, client, tiny_tokenizer):
    worker = spawn_worker(site, BRIEF, BRIEF_DRAIN_S)
    wait_for_workers(site, BRIEF, [worker])
    outcome = {}

    def non_streamed():
        try:
            outcome["response"] = client.completions.create(model=BRIEF, **LONG)
        except openai.APIError as exc:
            outcome["error"] = exc

    worker_id = serving(site, BRIEF)[worker.pid]["worker_id"]
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(non_streamed)
        # claimed before the SIGTERM, or the draining worker hands it back unstarted (no_worker)
        deadline = time.monotonic() + 30  # polled tightly: the generation itself takes about a second
        while claims_by(site, worker_id) < 1:
            assert time.monotonic() < deadline and not pending.done(), "the non-streamed request unclaimed"
            time.sleep(0.01)
        chunks = iter(client.completions.create(model=BRIEF, **LONG, stream=True))
        first = first_text_chunk(chunks)
        forget(site, worker)
        worker.send_signal(signal.SIGTERM)
        sigterm_at = time.monotonic()
        num_text_chunks = 1
        with pytest.raises(openai.APIError) as caught:
            for chunk in chunks:
                num_text_chunks += bool(chunk.choices and chunk.choices[0].text)
        told_after = time.monotonic() - sigterm_at
        pending.result(timeout=30)
    code = worker.wait(timeout=15)
    print(f"stream: {caught.value.code} {told_after:.2f} s after SIGTERM, {num_text_chunks} text chunks")

    assert code == 0
    assert caught.value.code == "worker_lost" and "stopped before it finished" in caught.value.message
    assert told_after < BRIEF_DRAIN_S + 5
    assert num_text_chunks < LONG["max_tokens"]
    record = site.usage(first.id)
    assert (record["status"], record["error_code"]) == ("error", "worker_lost")
    assert record["prompt_tokens"] == len(tiny_tokenizer.encode(LONG["prompt"]))
    assert 0 < record["completion_tokens"] < LONG["max_tokens"]
    error = outcome.get("error")
    assert isinstance(error, openai.InternalServerError), outcome
    assert (error.status_code, error.code) == (503, "worker_lost")
    record = site.usage(error.response.headers["X-Request-Id"])
    assert (record["status"], record["error_code"]) == ("error", "worker_lost")


def test_sigterm_to_daphne_aborts_streams_still_running_after_its_drain_timeout_and_records_them(
        site, pair, client):
    """Distributed mode: the workers are not Daphne's to drain; what outlives its drain timeout
    is aborted (in the worker too) and recorded as aborted before the process exits."""
    drain_timeout = 0.05
    web = Site(site.root, site.env)  # a second Daphne on the same database and Redis
    daphne = web.spawn("daphne-drain", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(web.port),
                                        "webapp.config.asgi:application"],
                       {"PAGODA_DRAIN_TIMEOUT": str(drain_timeout)})
    web.wait_until(lambda: httpx.get(f"{web.url}/healthz", timeout=5).status_code == 200, "Daphne listening")
    aborted_before = sum(w.stats["num_requests_finished"]["abort"] for w in site.engine.live_workers(PAIR))
    drained = openai.OpenAI(base_url=f"{web.url}/v1", api_key=site.key, max_retries=0, timeout=60)

    chunks = iter(drained.completions.create(model=PAIR, **LONG, stream=True))
    first = first_text_chunk(chunks)
    # The tiny model writes 480 tokens in well under a second: freeze both workers (SIGSTOP) so
    # the generation is still running, whatever the machine's speed, when the drain gives up.
    for worker in pair:
        worker.send_signal(signal.SIGSTOP)
    try:
        web.procs.remove(daphne)
        daphne.send_signal(signal.SIGTERM)
        sent_at = time.monotonic()
        # The stream is cut: it ends without a finish_reason, whether the connection then breaks
        # (an error here) or Daphne closes the response cleanly (the iteration just stops).
        finish_reasons = []
        with contextlib.suppress(httpx.HTTPError, openai.APIError):
            finish_reasons += [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        code = daphne.wait(timeout=drain_timeout + 15)
        exited_after = time.monotonic() - sent_at
    finally:
        for worker in pair:
            worker.send_signal(signal.SIGCONT)  # the claimant now reads the abort Daphne sent
    print(f"Daphne exited {exited_after:.1f} s after SIGTERM with code {code}")

    assert finish_reasons == []
    assert code == 0 and exited_after < drain_timeout + 10
    record = site.usage(first.id)
    assert record["status"] == "aborted" and 0 < record["completion_tokens"] < LONG["max_tokens"]
    site.wait_until(lambda: sum(w.stats["num_requests_finished"]["abort"]
                                for w in site.engine.live_workers(PAIR)) == aborted_before + 1,
                    "the worker aborting the generation", timeout=10)
