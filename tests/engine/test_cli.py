"""`python -m engine ...` as a user runs it."""

import subprocess
import sys

import pytest

from engine import LLM, SamplingParams


def run_cli(*args, input_text=None):
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True,
                          input=input_text, timeout=300)


@pytest.mark.e2e
def test_generate_prints_the_same_text_as_the_python_api(tiny_llama_dir):
    proc = run_cli("generate", "--model", str(tiny_llama_dir), "--prompt", "Hello there",
                   "--max-tokens", "12", "--kv-cache-memory-mib", "16")
    assert proc.returncode == 0, proc.stderr
    expected = LLM(str(tiny_llama_dir), num_kv_blocks=32).generate(
        "Hello there", SamplingParams(temperature=0, max_tokens=12))[0].text
    assert proc.stdout == expected + "\n"
    assert "KV cache:" in proc.stderr and "tokens/s" in proc.stderr


@pytest.mark.e2e
def test_chat_streams_replies_and_exits_on_eof(tiny_llama_dir):
    proc = run_cli("chat", "--model", str(tiny_llama_dir), "--max-tokens", "5", "--temperature", "0",
                   "--kv-cache-memory-mib", "16", input_text="hi\nand again\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("assistant> ") == 2


@pytest.mark.e2e
def test_bad_model_path_is_a_clear_error(tmp_path):
    proc = run_cli("generate", "--model", str(tmp_path / "nope"), "--prompt", "x")
    assert proc.returncode == 2
    assert "error:" in proc.stderr and "nope" in proc.stderr
