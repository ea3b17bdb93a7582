"""Suite-wide hooks and fixtures: GPU tests skip themselves without CUDA; a place for artifacts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.postgres import MARKERS as DATABASE_MARKERS
from tests.postgres import postgres_server, skip_other_vendors  # noqa: F401 - a fixture of the whole suite

REPO_ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS_DIR = REPO_ROOT / "test-artifacts"


def pytest_configure(config: pytest.Config) -> None:
    for line in DATABASE_MARKERS:
        config.addinivalue_line("markers", line)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
