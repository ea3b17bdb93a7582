"""Real Redis, real worker processes, a tiny random Llama.

``redis_server`` runs Debian's redis-server on a free loopback port without persistence.
``tiny_llama_dir`` is a 2-layer random Llama saved the Hugging Face way with the SmolLM2
tokenizer (as in tests/engine/conftest.py), so text round-trips and a worker loads in seconds.
``spawn_worker`` starts ``python -m workers`` processes and kills what is left
of them at the end of the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# The settings every tiny worker runs with; the reference engine in the tests uses the same.
TINY_SETTINGS = {"num_kv_blocks": 64, "max_model_len": 256}
WORKER_START_TIMEOUT_S = 90



@pytest.fixture(scope="session")
def redis_server(redis_server):
    """The suite's redis-server, database 1: these tests count the workers they see, so they must
    not see the end-to-end tests' workers (database 0). Keys are per database; the abort
    channels are not, but they carry unique request ids."""
    return redis_server.rsplit("/", 1)[0] + "/1"

@pytest.fixture(scope="session")
def reference_llm(tiny_llama_dir):
    """The engine itself, in this process, with the workers' settings."""
    from engine import LLM

    return LLM(str(tiny_llama_dir), **TINY_SETTINGS)


class WorkerProcess:
    def __init__(self, proc: subprocess.Popen, model: str, log_path: Path):
        self.proc = proc
        self.model = model
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signum)


def wait_for_workers(redis_url: str, model: str, count: int, procs=()) -> list:
    """Block until ``count`` workers of ``model`` are announced; fail with their logs if not."""
    from workers.redis_transport import RedisEngineClient

    client = RedisEngineClient(redis_url)
    deadline = time.monotonic() + WORKER_START_TIMEOUT_S
    while len(live := client.live_workers(model)) < count:
        dead = [p for p in procs if p.proc.poll() is not None]
        if dead or time.monotonic() > deadline:
            logs = "\n".join(p.log()[-3000:] for p in procs)
            pytest.fail(f"{count} workers of {model!r} did not come up:\n{logs}")
        time.sleep(0.1)
    return live


def start_worker(redis_url: str, model_dir: Path, log_dir: Path, model: str,
                 **settings) -> WorkerProcess:
    """``python -m workers`` for ``model``; not waited for (see wait_for_workers)."""
    args = [sys.executable, "-m", "workers", "--model-path", str(model_dir),
            "--model", model, "--redis-url", redis_url, "--version", "test"]
    for key, value in {**TINY_SETTINGS, **settings}.items():
        args += ["--setting", f"{key}={value}"]
    log_path = log_dir / f"worker-{model}-{time.monotonic_ns()}.log"
    # One torch thread: several workers share this machine's cores with the test process, and
    # oversubscribed OpenMP threads make every engine step wait on a descheduled peer.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return WorkerProcess(proc, model, log_path)


def kill_all(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        worker.signal(signal.SIGKILL)
        worker.proc.wait(timeout=10)


@pytest.fixture
def spawn_worker(redis_server, tiny_llama_dir, tmp_path):
    """spawn_worker(model, **settings) -> WorkerProcess; whatever still runs is killed after."""
    started: list[WorkerProcess] = []

    def spawn(model: str, **settings) -> WorkerProcess:
        started.append(start_worker(redis_server, tiny_llama_dir, tmp_path, model, **settings))
        return started[-1]

    yield spawn
    kill_all(started)


@pytest.fixture
def wait_workers(redis_server):
    """wait_workers(model, count, procs) -> the live WorkerInfos once ``count`` are announced."""
    return lambda model, count, procs=(): wait_for_workers(redis_server, model, count, procs)


@pytest.fixture(scope="session")
def serving_pair(redis_server, tiny_llama_dir, tmp_path_factory):
    """Two worker processes sharing the model "tiny"; two sequences each, so that a burst of
    requests has to be spread over both."""
    log_dir = tmp_path_factory.mktemp("worker_logs")
    workers = [start_worker(redis_server, tiny_llama_dir, log_dir, "tiny", max_num_seqs=2)
               for _ in range(2)]
    try:
        wait_for_workers(redis_server, "tiny", 2, workers)
        yield workers
    finally:
        kill_all(workers)


@pytest.fixture(scope="session")
def tiny_settings():
    """Engine settings of every tiny worker (and of ``reference_llm``)."""
    return dict(TINY_SETTINGS)
