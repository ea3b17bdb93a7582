"""The memory estimate (engine/memory/estimate.py, ``python -m engine estimate``) against what loading
really takes: the bundled SmolLM2 loaded in a fresh process in three configurations, its
resident anonymous memory measured with every KV block in use; the engine's own count of its
tensors; the KV formula; tensor-parallel shards; no torch needed to estimate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import InvalidParameterError
from engine.memory.estimate import estimate_memory

REPO_ROOT = Path(__file__).resolve().parents[2]
# Loads SmolLM2 with the settings in argv[1]; prints RssAnon growth (after malloc_trim, so freed
# load-time buffers glibc keeps do not count) once every page of the KV pool is written, as at
# full use, and the engine's own byte count of the model's tensors.
MEASURE = r"""
import ctypes, gc, json, sys
import torch
from engine.memory.gpu_memory import weights_bytes
from engine.llm import LLM
from engine.text.tokenizer import load_tokenizer

trim = ctypes.CDLL("libc.so.6").malloc_trim
def anon():
    gc.collect()
    trim(0)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("RssAnon:"))

load_tokenizer("smollm2")  # the tokenizer is not the model's memory
torch.ones(64, 64, dtype=torch.bfloat16) @ torch.ones(64, 64, dtype=torch.bfloat16)
for settings in json.loads(sys.argv[1]):
    before = anon()
    llm = LLM("smollm2", **settings)
    runner = llm.engine.runner
    runner.kv_pool.fill_(1)
    print(json.dumps({"resident": anon() - before, "weights": sum(weights_bytes(runner.model).values()),
                      "kv_pool": runner.kv_cache_bytes}), flush=True)
    del llm, runner
    from engine.models import gguf_loader
    gguf_loader._cached_reader.cache_clear()  # the next load parses the file again, as a new worker
"""
CONFIGS = [  # GGUF int4 as stored, a small pool; int8 at load; float bf16 with a 1.5 GiB pool
    {"num_kv_blocks": 64},
    {"quantization": "int8", "num_kv_blocks": 1024},
    {"quantization": "none", "num_kv_blocks": 4096, "max_model_len": 2048},
]


@pytest.fixture(scope="module")
def measured() -> list[dict]:
    """Each configuration loaded in turn in one fresh process (one torch start-up for all three)."""
    result = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(CONFIGS)], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.strip().splitlines()[-len(CONFIGS):]]


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=["int4-gguf", "int8", "float"])
def test_estimate_is_within_15_percent_of_resident_memory_of_loading_smollm2(measured, index):
    settings, measured = CONFIGS[index], measured[index]
    estimate = estimate_memory("smollm2", settings)

    assert estimate.weights_bytes == measured["weights"]  # tensor for tensor, as the engine counts
    assert estimate.kv_cache_bytes == measured["kv_pool"]
    assert abs(estimate.resident_bytes - measured["resident"]) <= 0.15 * measured["resident"], (
        estimate.describe(), measured)
    assert estimate.total_bytes > estimate.resident_bytes  # the largest step's workspace on top


def test_kv_cache_is_two_x_layers_x_kv_heads_x_head_dim_x_bytes_x_tokens(tiny_llama_dir):
    estimate = estimate_memory(str(tiny_llama_dir), {"num_kv_blocks": 10, "block_size": 16, "dtype": "float32"})
    # TINY_LLAMA_SIZES: 2 layers, 2 KV heads, head_dim 64 / 4 = 16
    assert estimate.kv_tokens == 160
    assert estimate.kv_cache_bytes == 2 * 2 * 2 * 16 * 4 * 160


def test_tensor_parallel_ranks_each_hold_a_shard_of_projections_vocabulary_and_kv_heads(tiny_llama_dir):
    settings = {"num_kv_blocks": 32, "dtype": "float32", "quantization": "none"}
    one = estimate_memory(str(tiny_llama_dir), settings)
    two = estimate_memory(str(tiny_llama_dir), {**settings, "tensor_parallel_size": 2})

    assert two.kv_cache_bytes * 2 == one.kv_cache_bytes
    assert one.weights_bytes / 2 < two.weights_bytes < one.weights_bytes * 0.55  # norms, RoPE replicated
    with pytest.raises(InvalidParameterError, match="tensor_parallel_size.*num_attention_heads \\(4\\)"):
        estimate_memory(str(tiny_llama_dir), {**settings, "tensor_parallel_size": 3})


@pytest.mark.slow
def test_estimate_equals_the_engines_tensor_bytes_for_a_safetensors_checkpoint(tiny_llama_dir):
    from engine.memory.gpu_memory import weights_bytes
    from engine.llm import LLM

    for settings in ({"num_kv_blocks": 8}, {"num_kv_blocks": 8, "quantization": "int8"}):
        llm = LLM(str(tiny_llama_dir), **settings)
        assert estimate_memory(str(tiny_llama_dir), settings).weights_bytes == sum(
            weights_bytes(llm.engine.runner.model).values()), settings


def test_a_bad_setting_is_refused_naming_it(tiny_llama_dir):
    with pytest.raises(InvalidParameterError, match="max_num_seqs"):
        estimate_memory(str(tiny_llama_dir), {"max_num_seqs": 0})


def test_estimating_loads_no_torch():
    code = ("import sys; from engine.memory.estimate import estimate_memory; "
            "estimate_memory('smollm2', {'quantization': 'int4'}); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert (result.returncode, result.stdout.strip()) == (0, "False"), result.stderr


@pytest.mark.e2e
def test_estimate_cli_prints_the_figures_as_json():
    result = subprocess.run([sys.executable, "-m", "engine", "estimate", "smollm2", "--quantization", "int8",
                             "--num-kv-blocks", "64", "--json"], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])

    assert figures["layouts"] == {"float": 0, "int4": 0, "int8": 210}
    assert figures["kv_tokens"] == 64 * 16
    assert figures["total_bytes"] == (figures["weights_bytes"] + figures["kv_cache_bytes"]
                                      + figures["tokenizer_bytes"] + figures["activation_bytes"])


@pytest.mark.e2e
def test_estimate_cli_names_a_setting_that_does_not_fit_the_model():
    result = subprocess.run([sys.executable, "-m", "engine", "estimate", "smollm2", "--tensor-parallel-size", "2"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "tensor_parallel_size: num_attention_heads (9) is not divisible by 2" in result.stderr


def test_a_draft_model_is_counted_with_the_settings_its_engine_gets(tiny_llama_dir):
    settings = {"num_kv_blocks": 10, "max_model_len": 256, "dtype": "float32"}
    alone = estimate_memory(str(tiny_llama_dir), settings)
    drafted = estimate_memory(str(tiny_llama_dir), {**settings, "speculative_model": str(tiny_llama_dir)})
    # the draft's engine: the same weights, and a pool of two 256-token sequences (2 x 16 + 1 blocks)
    draft = estimate_memory(str(tiny_llama_dir), {**settings, "num_kv_blocks": 33, "max_num_seqs": 4})
    assert drafted.draft_bytes == draft.weights_bytes + draft.kv_cache_bytes + draft.tokenizer_bytes
    assert drafted.resident_bytes == alone.resident_bytes + drafted.draft_bytes
    assert "draft model" in drafted.describe() and "draft model" not in alone.describe()
