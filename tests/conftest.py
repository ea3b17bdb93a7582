"""Suite-wide hooks and fixtures: GPU tests skip themselves without CUDA; a place for artifacts;
one compute thread per core under pytest-xdist; embedded engines at the web thread's priority."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.postgres import postgres_server, skip_other_vendors  # noqa: F401 - a fixture of the whole suite

REPO_ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS_DIR = REPO_ROOT / "test-artifacts"


def _share_cores_between_workers() -> None:
    """Under pytest-xdist each worker (and the servers it starts, which inherit the variable) gets
    its share of the cores for torch's and the native kernels' OpenMP threads. Left at the
    default, two workers on two cores run four spinning OpenMP teams, and every parallel region
    waits on a descheduled peer (tests/workers/conftest.py gives its worker processes one thread
    for the same reason). Runs before
    torch is imported (conftest files load before test modules); an explicit OMP_NUM_THREADS
    wins, and tests that compare thread counts set theirs themselves."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))


_share_cores_between_workers()

# The embedded engine runs below the web thread by default (nice 5: workers/serving.py), so it also
# yields to every other process of the host. Here that is the suite's other xdist worker, and an
# engine yielding to it measures the host, not the server (a tiny model's flooded TTFT doubled).
# The servers the tests start inherit this; the tests of the nice value set theirs.
os.environ.setdefault("PAGODA_EMBEDDED_ENGINE_NICE", "0")


# Fixtures whose every user is expensive, and the marker it gets (pytest.ini): a test that
# requests one, directly or through another fixture, is marked here, whatever order the tests
# run in (the guard in tests/marker_guard.py charges a shared fixture to whichever test is first).
MARKER_OF_FIXTURE = {
    "redis_server": "e2e",  # a redis-server process
    "serving_pair": "e2e",  # two engine worker processes (tests/workers/conftest.py)
    "postgres_server": "e2e",  # initdb and a postgres process
    "embedded_site": "e2e", "redis_site": "e2e",  # Daphne with workers (tests/e2e/conftest.py)
    "hf_smollm2": "slow",  # transformers' float32 load of the bundled GGUF
    "smollm2_llm": "slow",  # the bundled SmolLM2 in the engine (tests/engine: test_llm_engine, test_hf_parity)
    "smollm2_gguf_tokenizer": "slow",  # transformers' tokenizer converted from the GGUF (test_detokenizer)
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name in set(getattr(item, "fixturenames", ())) & MARKER_OF_FIXTURE.keys():
            item.add_marker(MARKER_OF_FIXTURE[name])
    skip_other_vendors(items)  # @pytest.mark.postgres / @pytest.mark.sqlite: see tests/postgres.py
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch  # only when a GPU test was collected: torch takes seconds to import

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is false)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """test-artifacts/ at the repository root (ignored by git): screenshots, logs, reports."""
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    return ARTIFACTS_DIR


# The tiny random Llama every layer of the suite uses: engine parity, workers, end to end.
# It carries the SmolLM2 tokenizer (vocab 49152) so text round-trips through it.
TINY_LLAMA_SIZES = dict(
    vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
)
LONG_CONTEXT = 8192  # long_llama_dir's context
REDIS_SERVER = "/usr/bin/redis-server"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    """A 2-layer random Llama with GQA saved the Hugging Face way (safetensors, tokenizer files)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.text.tokenizer import load_tokenizer

    directory = tmp_path_factory.mktemp("tiny_llama")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**TINY_LLAMA_SIZES)).save_pretrained(directory)
    load_tokenizer("smollm2").save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def long_llama_dir(tmp_path_factory) -> Path:
    """The tiny Llama with an 8k context: a stream long enough (seconds, even on a fast machine)
    to still be running when a test that needs it running acts."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.text.tokenizer import load_tokenizer

    directory = tmp_path_factory.mktemp("long_llama")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA_SIZES, "max_position_embeddings": LONG_CONTEXT})).save_pretrained(
        directory)
    load_tokenizer("smollm2").save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """URL of a private Debian redis-server on a free loopback port (no RDB, no AOF)."""
    import subprocess
    import time

    import redis

    port = free_port()
    data_dir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(data_dir), "--logfile", str(data_dir / "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"redis-server did not start: {(data_dir / 'redis.log').read_text()}")
            time.sleep(0.05)
    client.close()
    yield url
    proc.terminate()
    proc.wait(timeout=10)
