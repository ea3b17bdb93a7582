"""``make stack`` for real: the local launcher's whole topology driven through the official client.

One stack for the module (python -m deploy.stack.launch, what ``make stack`` runs): its own
PostgreSQL and Redis, two Daphne processes, two engine workers of the tiny random Llama
(registered with ``--also register_model``, so no bundled model is exported), Celery worker and
beat, under honcho. What it must show: the two web processes enforce one key's limits together,
each request lands one usage record, and killing a web process or a worker loses nothing else
(the supervisor starts it again): not even the usage of a request the killed web process was
streaming (webapp/usage/reconcile.py). Usage and keys are read and set in its PostgreSQL directly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import psycopg
import pytest
import redis

from deploy.stack.postgres import find_binary
from tests.e2e.sites import READYZ_TOKEN, REPO_ROOT, TINY_SETTINGS, Site, free_port
from workers.protocol import Reply
from workers.redis_transport import RedisEngineClient, reply_stream

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(find_binary("initdb") is None, reason="PostgreSQL's initdb is not installed")]

MODEL = "tiny"
LEASE_TTL_S = 5  # the stack's web processes' (PAGODA_LEASE_TTL_S)
RECONCILE_INTERVAL_S = 1  # its beat's usage reconciler (PAGODA_USAGE_RECONCILE_INTERVAL_S)
PROMPT = "Once upon a time"
LONG = dict(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=400, extra_body={"ignore_eos": True})
MAX_NOTICE_S = 10.0  # heartbeat TTL (5 s) + a watch interval, with room to spare


class Stack:
    def __init__(self, root: Path, env: dict, ports: dict):
        self.root, self.env, self.ports = root, env, ports
        self.webs = [Site(root, env, port=ports[f"web{i}"]) for i in (1, 2)]
        self.database_url = env["DATABASE_URL"]
        self.redis = redis.Redis.from_url(env["REDIS_URL"], decode_responses=True)
        self.engine = RedisEngineClient(env["REDIS_URL"])
        self.launcher: subprocess.Popen | None = None

    def pid(self, name: str) -> int:
        return int((self.root / "run" / f"{name}.pid").read_text())

    def log(self) -> str:
        return (self.root / "stack.log").read_text(errors="replace")[-6000:]

    def wait_until(self, ready, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():
                    return
            except (httpx.HTTPError, OSError, ValueError):
                pass
            if self.launcher.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{what} did not happen:\n{self.log()}")
            time.sleep(0.25)

    def workers(self) -> dict[int, str]:
        """pid -> worker id of the live workers of MODEL (their heartbeats in Redis)."""
        return {w.pid: w.worker_id for w in self.engine.live_workers(MODEL) if not w.draining}

    def ready(self) -> bool:
        return (all(httpx.get(f"{w.url}/readyz", timeout=5).status_code == 200 for w in self.webs)
                and set(self.workers()) == {self.pid("worker1"), self.pid("worker2")})

    def sql(self, query: str, *params) -> list[tuple]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def usage(self, request_id: str, timeout: float = 10.0, *, ended: bool = True) -> list[dict]:
        """The usage records of a request, waiting for the first (``ended``: for it to have ended; a
        request that reached a worker has a running record from then until it ends)."""
        deadline = time.monotonic() + timeout
        while True:
            with psycopg.connect(self.database_url, row_factory=psycopg.rows.dict_row) as conn:
                rows = conn.execute("SELECT * FROM usage_usagerecord WHERE request_id = %s", (request_id,)).fetchall()
            if (rows and not (ended and any(r["status"] == "running" for r in rows))) or time.monotonic() > deadline:
                return rows
            time.sleep(0.1)

    def key(self, **limits) -> str:
        raw = self.webs[0].create_key(f"stack {len(limits)} {time.monotonic()}")
        if limits:
            assignments = ", ".join(f"{name} = %s" for name in limits)
            self.sql(f"UPDATE keys_apikey SET {assignments} WHERE key_hash = encode(sha256(%s::bytea), 'hex')",
                     *limits.values(), raw)
        return raw

    def client(self, web: int, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.webs[web].url}/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def stack(tiny_llama_dir):
    root = Path(tempfile.mkdtemp(prefix="pagoda-stack-test-"))
    root.chmod(0o755)  # under root, PostgreSQL runs as its own account, which must reach root/postgres
    (root / "stack_settings.py").write_text(
        "from webapp.config.settings.serve import *  # noqa: F403\n"
        f"MEDIA_ROOT = {str(root / 'media')!r}\n")
    ports = {name: free_port() for name in ("pg", "redis", "web1", "web2")}
    env = {name: value for name, value in os.environ.items()
           if name not in ("REDIS_URL", "DATABASE_URL", "PAGODA_EMBEDDED_WORKERS", "PAGODA_DATA_DIR")}
    env.update({"DJANGO_SETTINGS_MODULE": "stack_settings", "PYTHONPATH": os.pathsep.join([str(root), str(REPO_ROOT)]),
                "PAGODA_READYZ_TOKEN": READYZ_TOKEN, "OMP_NUM_THREADS": "1", "LOG_LEVEL": "INFO",
                "PAGODA_LEASE_TTL_S": str(LEASE_TTL_S), "PAGODA_USAGE_RECONCILE_INTERVAL_S": str(RECONCILE_INTERVAL_S)})
    command = [sys.executable, "-m", "deploy.stack.launch", "--dir", str(root), "--pg-port", str(ports["pg"]),
               "--redis-port", str(ports["redis"]), "--web-ports", f"{ports['web1']},{ports['web2']}",
               "--model", MODEL, "--no-bundled-model",
               "--also", f"register_model {MODEL} {tiny_llama_dir} --engine-settings '{json.dumps(TINY_SETTINGS)}'"]
    started = time.monotonic()
    with open(root / "stack.log", "wb") as log:
        launcher = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
    stack = Stack(root, {**env, "DATABASE_URL": f"postgres://pagoda@127.0.0.1:{ports['pg']}/pagoda",
                         "REDIS_URL": f"redis://127.0.0.1:{ports['redis']}/0", "PAGODA_DATA_DIR": str(root / "data")},
                  ports)
    stack.launcher = launcher
    try:
        stack.wait_until(stack.ready, "both web processes ready and both workers announced")
        print(f"stack up in {time.monotonic() - started:.1f} s")
        yield stack
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGINT)
            try:
                launcher.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


def claimant(stack: Stack, request_id: str) -> str:
    """The id of the worker that claimed ``request_id`` (the first reply on its stream)."""
    first = stack.redis.xrange(reply_stream(request_id), count=1)
    claim = Reply.from_dict(json.loads(first[0][1]["data"]))
    assert claim.kind == "claimed"
    return claim.worker_id


def first_text_chunk(chunks):
    chunk = next(chunks)
    while not (chunk.choices and chunk.choices[0].text):
        chunk = next(chunks)
    return chunk


def short(client: openai.OpenAI, i: int = 0, max_tokens: int = 8):
    return client.completions.create(model=MODEL, prompt=f"Story {i}", max_tokens=max_tokens,
                                     extra_body={"ignore_eos": True})


def test_both_web_processes_serve_and_each_request_lands_exactly_one_usage_record(stack):
    key = stack.key()

    def call(i: int) -> tuple[str, int]:
        client = stack.client(i % 2, key)
        if i % 4 < 2:
            response = short(client, i, max_tokens=16)
            return response.id, response.usage.completion_tokens
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Tale {i}"}], max_tokens=16, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        return chunks[0].id, chunks[-1].usage.completion_tokens

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(8)))
    assert [tokens for _id, tokens in results] == [16] * 8
    for request_id, _tokens in results:
        records = stack.usage(request_id)
        assert [(r["status"], r["completion_tokens"]) for r in records] == [("ok", 16)], request_id
    (count,), = stack.sql("SELECT count(*) FROM usage_usagerecord u JOIN keys_apikey k ON u.api_key_id = k.id "
                          "WHERE k.key_hash = encode(sha256(%s::bytea), 'hex')", key)
    assert count == 8


def test_one_keys_concurrency_limit_holds_across_both_web_processes(stack):
    key = stack.key(max_concurrent_requests=1)
    chunks = iter(stack.client(0, key).completions.create(**LONG, stream=True))
    first_text_chunk(chunks)
    # Freeze both workers for a moment so the stream is certainly still running (the tiny model
    # is fast); well under the heartbeat TTL, so nobody takes them for dead.
    workers = [stack.pid("worker1"), stack.pid("worker2")]
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(openai.RateLimitError) as caught:
            short(stack.client(1, key))
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
    assert caught.value.code == "rate_limit_exceeded" and "1 concurrent" in caught.value.message
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert short(stack.client(1, key)).choices[0].finish_reason == "length"  # the slot came back


def test_one_keys_token_budget_holds_across_both_web_processes(stack, tiny_tokenizer):
    worst = len(tiny_tokenizer.encode("Story 0")) + 16  # every request's prompt has as many tokens
    budget = 3 * worst + worst // 2
    key = stack.key(token_budget=budget)

    def call(i: int):
        try:
            return short(stack.client(i % 2, key), i, max_tokens=16).usage.total_tokens
        except openai.RateLimitError as exc:
            return exc.code

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(8)))
    assert sorted(results, key=str) == sorted([worst] * 3 + ["budget_exhausted"] * 5, key=str), results
    (row,) = stack.sql("SELECT tokens_used, tokens_reserved FROM keys_apikey "
                       "WHERE key_hash = encode(sha256(%s::bytea), 'hex')", key)
    assert row == (3 * worst, 0)


def test_a_killed_web_process_leaves_the_other_serving_and_comes_back(stack):
    key = stack.key()
    killed = stack.pid("web1")
    os.kill(killed, signal.SIGKILL)
    with pytest.raises(openai.APIConnectionError):
        short(stack.client(0, key))
    response = short(stack.client(1, key))
    assert response.choices[0].finish_reason == "length"
    assert [r["status"] for r in stack.usage(response.id)] == ["ok"]
    stack.wait_until(lambda: stack.pid("web1") != killed and
                     httpx.get(f"{stack.webs[0].url}/healthz", timeout=5).status_code == 200,
                     "the supervisor starting web1 again", timeout=60)
    assert short(stack.client(0, key)).choices[0].finish_reason == "length"


def test_a_request_in_flight_on_a_killed_web_process_gives_its_concurrency_slot_back(stack):
    """The killed process's lease lapses (LEASE_TTL_S here, 30 s by default): the other web process
    then takes the slot back for the key's next request (webapp/keys/leases.py), not after an hour."""
    key = stack.key(max_concurrent_requests=1)
    chunks = iter(stack.client(0, key).completions.create(**LONG, stream=True))
    first_text_chunk(chunks)  # streaming from web1 when the kill lands
    killed = stack.pid("web1")
    os.kill(killed, signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        refused_while_leased = 0
        while True:
            try:
                answer = short(stack.client(1, key))
                break
            except openai.RateLimitError:
                refused_while_leased += 1
                assert time.monotonic() - killed_at < LEASE_TTL_S + 15, "the slot never came back"
                time.sleep(0.5)
        took = time.monotonic() - killed_at
        print(f"the key served again {took:.1f} s after the kill ({refused_while_leased} 429s meanwhile)")
        assert answer.choices[0].finish_reason == "length"
        assert refused_while_leased  # the slot was held while the lease lived, then given back
    finally:
        stack.wait_until(lambda: stack.pid("web1") != killed and
                         httpx.get(f"{stack.webs[0].url}/healthz", timeout=5).status_code == 200,
                         "the supervisor starting web1 again", timeout=60)


def last_chunk(stack: Stack, request_id: str):
    """The last chunk the worker sent for ``request_id``, from its reply stream (nobody reads it now)."""
    replies = [Reply.from_dict(json.loads(fields["data"])) for _id, fields in stack.redis.xrange(reply_stream(request_id))]
    return [r.chunk for r in replies if r.chunk is not None][-1]


@pytest.mark.slow
def test_a_request_on_a_killed_web_process_is_billed_with_what_its_worker_generated(stack, tiny_tokenizer):
    """SIGKILL: no drain, no usage written by the process. Its record, written running when the
    request went to a worker, is ended by the beat's reconciler once the process's lease lapses,
    with the worker's count: all it generated, at least what the client received."""
    key = stack.key()
    chunks = iter(stack.client(0, key).completions.create(**LONG, stream=True, logprobs=0))
    first = first_text_chunk(chunks)
    received = len(first.choices[0].logprobs.tokens)
    (running,) = stack.usage(first.id, ended=False)
    killed = stack.pid("web1")
    os.kill(killed, signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        with pytest.raises(openai.APIConnectionError):
            for chunk in chunks:
                received += len(chunk.choices[0].logprobs.tokens) if chunk.choices and chunk.choices[0].logprobs else 0
        deadline = killed_at + LEASE_TTL_S * 4 / 3 + 4 * RECONCILE_INTERVAL_S + 15
        while (record := stack.usage(first.id, ended=False)[0])["status"] == "running":
            assert time.monotonic() < deadline, "the killed process's usage record was never ended"
            time.sleep(0.2)
        took = time.monotonic() - killed_at
        worker_said = last_chunk(stack, first.id)
        print(f"usage of the killed process's request ended {took:.1f} s after SIGKILL: "
              f"{record['completion_tokens']} tokens generated ({worker_said.finish_reason}), {received} received")

        assert (running["status"], running["prompt_tokens"]) == ("running", len(tiny_tokenizer.encode(PROMPT)))
        assert running["completion_tokens"] <= received  # a checkpoint may have written some already
        assert f"-{killed}-" in running["process_id"]  # named the process that was killed
        assert (record["status"], record["error_code"], record["process_id"]) == ("error", "web_process_lost", "")
        assert worker_said.finished and worker_said.finish_reason in ("length", "abort")
        assert (record["prompt_tokens"], record["completion_tokens"]) == \
            (worker_said.num_prompt_tokens, worker_said.num_output_tokens)
        assert record["completion_tokens"] >= received > 0
        (charged,) = stack.sql("SELECT tokens_used, tokens_reserved FROM keys_apikey "
                               "WHERE key_hash = encode(sha256(%s::bytea), 'hex')", key)
        assert charged == (record["prompt_tokens"] + record["completion_tokens"], 0)
    finally:
        stack.wait_until(lambda: stack.pid("web1") != killed and
                         httpx.get(f"{stack.webs[0].url}/healthz", timeout=5).status_code == 200,
                         "the supervisor starting web1 again", timeout=60)


def test_a_killed_worker_ends_its_request_with_worker_lost_and_the_other_worker_serves(stack, tiny_tokenizer):
    key = stack.key()
    chunks = iter(stack.client(0, key).completions.create(**LONG, stream=True))
    first = first_text_chunk(chunks)
    victim = next(pid for pid, worker_id in stack.workers().items() if worker_id == claimant(stack, first.id))
    survivor = next(pid for pid in stack.workers() if pid != victim)
    os.kill(victim, signal.SIGSTOP)  # frozen mid-generation, then killed: no goodbye, no last chunk
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()

    with ThreadPoolExecutor(4) as pool:  # meanwhile, on both web processes, the other worker answers
        others = list(pool.map(lambda i: short(stack.client(i % 2, key), i), range(4)))
    with pytest.raises(openai.APIError) as caught:
        for _chunk in chunks:
            pass
    noticed_after = time.monotonic() - killed_at
    print(f"worker_lost {noticed_after:.2f} s after SIGKILL")

    assert caught.value.code == "worker_lost" and noticed_after < MAX_NOTICE_S
    (record,) = stack.usage(first.id)
    assert (record["status"], record["error_code"]) == ("error", "worker_lost")
    assert record["prompt_tokens"] == len(tiny_tokenizer.encode(PROMPT))
    assert 0 < record["completion_tokens"] < LONG["max_tokens"]
    assert [r.choices[0].finish_reason for r in others] == ["length"] * 4
    assert all(stack.usage(r.id)[0]["status"] == "ok" for r in others)
    stack.wait_until(lambda: victim not in stack.workers() and survivor in stack.workers() and stack.ready(),
                     "the supervisor starting the killed worker again", timeout=120)


def test_stopping_the_stack_stops_every_process_it_started(stack):
    pids = [int(p.read_text()) for p in (stack.root / "run").rglob("*.pid")]
    assert len(pids) == 8  # two web, two workers, celery, beat; postgres and redis
    started = time.monotonic()
    os.kill(stack.launcher.pid, signal.SIGINT)  # Ctrl-C: the launcher is honcho by now (exec)
    code = stack.launcher.wait(timeout=30)
    print(f"stack stopped in {time.monotonic() - started:.1f} s (honcho exit code {code})")
    alive = [pid for pid in pids if _alive(pid)]
    assert alive == [], alive


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")
