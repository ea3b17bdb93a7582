"""On CUDA the KV pool is sized by a profiling step: what gpu_memory_utilization leaves after the
memory in use and the activation peak of the largest step, and real steps stay under that peak."""

import gc
import logging

import pytest
import torch

from engine import LLM, SamplingParams

pytestmark = pytest.mark.gpu

GiB = 2**30


def test_kv_pool_is_what_the_profiled_step_leaves_of_the_utilization_budget(smollm2_path, caplog):
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    # Room for about 4 GiB beyond what this process and others already hold, whatever the GPU.
    utilization = min(1.0, (total - free + 4 * GiB) / total)
    with caplog.at_level(logging.INFO, logger="engine"):
        llm = LLM(str(smollm2_path), device="cuda", gpu_memory_utilization=utilization,
                  max_num_batched_tokens=1024, max_num_seqs=32)
    runner = llm.engine.runner
    profile = runner.memory_profile
    weights = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    assert profile.weights_bytes >= weights  # parameters, plus buffers (rotary tables)
    assert profile.activation_peak_bytes > 0
    # Budget-limited (the ceiling max_num_seqs * max_model_len is far larger): the pool is the
    # budget rounded down to whole blocks.
    assert 0 <= profile.kv_budget_bytes - runner.kv_cache_bytes < runner.bytes_per_block
    assert profile.in_use_bytes + runner.kv_cache_bytes + profile.activation_peak_bytes \
        <= utilization * total
    assert "activation peak" in caplog.text and "KV pool" in caplog.text

    # The largest steps: 32 prompts of 100 tokens prefilled 1024 tokens at a time, then 32 decodes.
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    prompts = [[1 + (i * 53 + j * 7) % 30000 for j in range(100)] for i in range(32)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert all(len(o.token_ids) == 8 for o in outputs)
    assert torch.cuda.max_memory_allocated() - base <= profile.activation_peak_bytes
    free_after, _ = torch.cuda.mem_get_info()
    slack = runner.cuda_graphs.memory_bytes + 512 * 2**20  # graphs' pool, allocator rounding
    assert total - free_after <= utilization * total + slack
    del llm, runner
    gc.collect()
    torch.cuda.empty_cache()
