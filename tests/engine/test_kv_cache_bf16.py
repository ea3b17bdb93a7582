"""kv_cache_dtype bfloat16 under float32 activations: the pool stores bf16 (twice float32's tokens
in the same memory, counted alike by the estimate), every read widens what was stored, so a
greedy answer does not depend on the prefix cache, chunking or which decode path ran, and it
follows the float32 cache's answer."""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import InvalidParameterError
from engine.memory.estimate import estimate_memory
from engine.kernels.cpu import decode_step

MIB = 1 << 20
SETTINGS = dict(max_model_len=256, device="cpu", max_num_seqs=8, dtype="float32")
PROMPTS = ["The quick brown fox jumps over the lazy dog. " * 4, "Once upon a time, there was"]
PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)


def _answers(outputs):
    return [(o.token_ids, [t.logprob for t in o.logprobs]) for o in outputs]


@pytest.mark.slow
def test_a_bf16_pool_holds_twice_the_float32_tokens_in_the_same_memory(tiny_llama_dir):
    tokens = {}
    for kv in ("auto", "bfloat16"):
        settings = dict(SETTINGS, kv_cache_dtype=kv, kv_cache_memory=MIB, max_num_seqs=64)
        runner = LLM(str(tiny_llama_dir), **settings).engine.runner
        tokens[kv] = runner.num_blocks * runner.block_size
        assert runner.kv_cache_bytes <= MIB
        assert estimate_memory(str(tiny_llama_dir), settings).kv_tokens == tokens[kv]
        assert runner.kv_pool.dtype == (torch.bfloat16 if kv == "bfloat16" else torch.float32)
    assert runner._kv_storage() == "bfloat16, read as float32"
    assert tokens["bfloat16"] / tokens["auto"] == pytest.approx(2, rel=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("quantization", [None, "int4"])
def test_the_greedy_answer_does_not_depend_on_prefix_cache_chunking_or_the_decode_path(
        tiny_llama_dir, quantization, monkeypatch):
    settings = dict(SETTINGS, kv_cache_dtype="bfloat16", num_kv_blocks=64, quantization=quantization)
    chunked = LLM(str(tiny_llama_dir), max_num_batched_tokens=16, **settings)
    if quantization == "int4" and decode_step.library() is not None:
        assert chunked.engine.runner.fused_decode is not None  # reads the bf16 pool itself
    first = _answers(chunked.generate(PROMPTS, PARAMS))
    again = _answers(chunked.generate(PROMPTS, PARAMS))  # the prompts' full blocks from the cache
    assert chunked.engine.scheduler.block_manager.num_prefix_hit_tokens >= 32
    whole = _answers(LLM(str(tiny_llama_dir), enable_prefix_caching=False, **settings)
                     .generate(PROMPTS, PARAMS))
    assert first == again == whole
    if quantization == "int4":  # the torch decode path reads the same stored values
        monkeypatch.setenv("PAGODA_FUSED_DECODE", "0")
        llm = LLM(str(tiny_llama_dir), **settings)
        assert llm.engine.runner.fused_decode is None
        torch_path = llm.generate(PROMPTS, PARAMS)
        for (tokens, logprobs), out in zip(first, torch_path):
            assert out.token_ids == tokens
            assert max(abs(a - b.logprob) for a, b in zip(logprobs, out.logprobs)) < 1e-3


@pytest.mark.slow
def test_bf16_kv_answers_follow_the_float32_cache(tiny_llama_dir):
    outputs = {k: LLM(str(tiny_llama_dir), kv_cache_dtype=k, num_kv_blocks=64, **SETTINGS)
               .generate(PROMPTS, PARAMS) for k in ("auto", "bfloat16")}
    for ref, out in zip(outputs["auto"], outputs["bfloat16"]):
        assert out.token_ids == ref.token_ids
        diff = max(abs(a.logprob - b.logprob) for a, b in zip(ref.logprobs, out.logprobs))
        assert 0 < diff < 0.02  # rounded (not the float32 cache by mistake), and close


@pytest.mark.slow
def test_the_triton_path_refuses_a_bf16_pool_under_float32_naming_the_setting(tiny_llama_dir):
    with pytest.raises(InvalidParameterError, match="kv_cache_dtype"):
        LLM(str(tiny_llama_dir), kv_cache_dtype="bfloat16", use_triton=True, num_kv_blocks=64,
            **SETTINGS)


@pytest.mark.slow
@pytest.mark.parametrize("quantization, stored", [("none", torch.float32), ("int4", torch.bfloat16)])
def test_auto_stores_bf16_under_float32_only_over_quantized_projections(tiny_llama_dir, quantization,
                                                                         stored):
    settings = dict(SETTINGS, quantization=quantization, kv_cache_memory=MIB, max_num_seqs=64)
    runner = LLM(str(tiny_llama_dir), **settings).engine.runner
    assert runner.kv_pool.dtype == stored  # none: the path token-identical to transformers keeps float32
    assert estimate_memory(str(tiny_llama_dir), settings).kv_tokens == runner.num_blocks * runner.block_size
