"""The default fast path on the bundled SmolLM2 (GGUF Q4_1 projections straight into int4, bf16
activations where the CPU has them, a bf16 KV pool either way, int8 LM head for small steps) follows transformers' float32
reading of the same GGUF: each greedy token is its argmax at least 95% of the time and within
its top 5 at least 99.5%."""

import pytest
import torch

from engine import LLM
from engine.kernels.cpu.cpu_info import has_fast_bf16
from engine.layers.linear import Int4Linear


@pytest.mark.slow
def test_default_int4_bf16_path_agrees_with_transformers_fp32(smollm2_path, chat_fidelity):
    llm = LLM(str(smollm2_path), max_model_len=1024)  # the defaults: dtype and quantization auto
    runner = llm.engine.runner
    assert isinstance(runner.model.model.layers[0].self_attn.qkv_proj, Int4Linear)
    assert runner.dtype == (torch.bfloat16 if has_fast_bf16() else torch.float32)
    assert runner.kv_pool.dtype == torch.bfloat16  # float32 activations too (resolve_kv_cache_dtype)
    total = chat_fidelity(llm)
    print(f"fidelity over {total.num_tokens} tokens: top-1 {total.top1:.1%}, top-5 {total.top5:.1%}")
    assert total.top1 >= 0.95
    assert total.top5 >= 0.995
