"""The Triton cache-write, decode and prefill kernels over an int8 / fp8 e4m3 KV cache (codes +
a float32 scale per token and KV head) against their plain-torch references, interpreted on CPU.

The references quantize with engine.kernels.kv_quant (the CPU engine's own code) and attend in
float32 over the dequantized cache; the kernels dequantize tile by tile as they load."""

import pytest
import torch

from engine.errors import InvalidParameterError
from engine.kernels.attention_decode import paged_decode_attention, paged_decode_attention_ref
from engine.kernels.attention_prefill import paged_prefill_attention, paged_prefill_attention_ref
from engine.kernels.cache import reshape_and_cache, reshape_and_cache_ref
from engine.kernels.common import is_interpreting
from engine.kernels import kv_quant

CODES = [torch.int8, torch.float8_e4m3fn]
NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 2, 64, 16


def quantized_cache(k_cache, v_cache, code_dtype):
    """A float paged cache quantized row by row: codes and their [blocks, bs, heads] scales."""
    kc, ks = kv_quant.quantize(k_cache, code_dtype)
    vc, vs = kv_quant.quantize(v_cache, code_dtype)
    return kc, vc, ks.contiguous(), vs.contiguous()


# Triton 3.9's interpreter casts float32 to fp8 e4m3 wrongly near powers of two (127.5 -> 64,
# not 128), so the fp8 write is checked on a GPU only; its reads cast correctly and are checked.
FP8_WRITE = pytest.param(torch.float8_e4m3fn, marks=pytest.mark.skipif(
    is_interpreting(), reason="the interpreter's float32 -> fp8 cast is not the hardware's"))


@pytest.mark.parametrize("code_dtype", [torch.int8, FP8_WRITE])
def test_cache_kernel_writes_the_references_codes_and_scales_and_skips_padding(device, code_dtype):
    gen = torch.Generator().manual_seed(0)
    slots = torch.tensor([5 * 16, 2 * 16 + 15, -1, 7, 5 * 16 + 1, -1, 3 * 16 + 9], device=device)
    # keys scaled per token over three orders of magnitude: one scale per (token, head) follows it
    key = (torch.randn(7, NUM_KV_HEADS, HEAD_DIM, generator=gen)
           * torch.logspace(-2, 1, 7)[:, None, None]).to(torch.bfloat16).to(device)
    value = torch.randn(7, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16).to(device)
    shape = (6, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    pools = [torch.zeros(shape, dtype=code_dtype, device=device) for _ in range(2)]
    scales = [torch.full(shape[:3], -1.0, device=device) for _ in range(2)]  # -1: never written
    expected = [t.clone() for t in pools], [t.clone() for t in scales]
    reshape_and_cache_ref(key, value, *expected[0], slots, *expected[1])
    reshape_and_cache(key, value, *pools, slots, *scales)
    for got, want in zip(scales, expected[1]):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
        assert (got == -1).sum() == (6 * BLOCK_SIZE - 5) * NUM_KV_HEADS  # padding not written
    for got, want in zip(pools, expected[0]):
        g, w = kv_quant.dequantize(got, torch.ones(shape[:3], device=device), torch.float32), \
            kv_quant.dequantize(want, torch.ones(shape[:3], device=device), torch.float32)
        if code_dtype == torch.int8:  # rounding ties go half-away here, half-even in torch
            assert (g - w).abs().max() <= 1 and (g != w).float().mean() < 1e-3
        else:
            assert torch.equal(g, w)
    # what the cache holds reads back within half a code of the written rows
    written = slots >= 0
    k_back = kv_quant.read_slots((*pools, *scales), slots[written], torch.float32)[0]
    step = scales[0].view(-1, NUM_KV_HEADS)[slots[written]][..., None]
    half_code = step / 2 if code_dtype == torch.int8 else step * 16  # e4m3: 3 mantissa bits
    assert ((k_back - key[written].float()).abs() <= half_code * 1.01).all()


@pytest.mark.parametrize("code_dtype", CODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_kernel_over_an_8bit_cache_matches_reference(paged_kv, device, assert_close,
                                                            code_dtype, dtype):
    gen = torch.Generator().manual_seed(1)
    lens = [1, 17, 40, 300]
    keys = [torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen) for n in lens]
    values = [torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen) for n in lens]
    k_cache, v_cache, tables = paged_kv(keys, values, BLOCK_SIZE, device)
    cache = quantized_cache(k_cache, v_cache, code_dtype)
    q = torch.randn(len(lens), NUM_KV_HEADS * 3, HEAD_DIM, generator=gen).to(dtype).to(device)
    context_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    expected = paged_decode_attention_ref(q, cache[0], cache[1], tables, context_lens, 0.125,
                                          None, *cache[2:])
    for num_splits in (1, 2):
        assert_close(paged_decode_attention(q, cache[0], cache[1], tables, context_lens, 0.125,
                                            num_splits, *cache[2:]), expected)
    # and the reference is attention over the float cache, up to the codes' rounding
    full = paged_decode_attention_ref(q.float(), k_cache, v_cache, tables, context_lens, 0.125)
    tol = 0.03 if code_dtype == torch.int8 else 0.15
    torch.testing.assert_close(expected.float(), full, atol=tol, rtol=0)


@pytest.mark.parametrize("code_dtype", CODES)
def test_prefill_kernel_over_an_8bit_cache_matches_reference(paged_kv, device, assert_close,
                                                             code_dtype):
    gen = torch.Generator().manual_seed(2)
    context, query = [5, 70, 33], [5, 20, 1]  # a whole prompt, a later chunk, a decode row
    keys = [torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen) for n in context]
    values = [torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen) for n in context]
    k_cache, v_cache, tables = paged_kv(keys, values, BLOCK_SIZE, device)
    cache = quantized_cache(k_cache, v_cache, code_dtype)
    q = torch.randn(sum(query), NUM_KV_HEADS * 2, HEAD_DIM, generator=gen).to(device)
    cu = torch.tensor([0, 5, 25, 26], dtype=torch.int32, device=device)
    lens = torch.tensor(context, dtype=torch.int32, device=device)
    assert_close(paged_prefill_attention(q, cache[0], cache[1], tables, cu, lens, 0.125, 20,
                                         *cache[2:]),
                 paged_prefill_attention_ref(q, cache[0], cache[1], tables, cu, lens, 0.125, 20,
                                             *cache[2:]))


def test_an_8bit_cache_without_its_scales_is_refused_naming_them(device):
    codes = torch.zeros(2, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=torch.int8, device=device)
    key = torch.zeros(1, NUM_KV_HEADS, HEAD_DIM, device=device)
    with pytest.raises(InvalidParameterError) as err:
        reshape_and_cache(key, key, codes, codes.clone(), torch.zeros(1, dtype=torch.int64, device=device))
    assert err.value.param == "k_scales"


@pytest.mark.slow
def test_the_engine_on_the_triton_kernels_with_an_int8_cache_gives_the_torch_paths_answers(tiny_llama_dir):
    from engine import LLM, SamplingParams

    settings = dict(num_kv_blocks=64, max_model_len=256, max_num_batched_tokens=32, device="cpu",
                    dtype="float32", kv_cache_dtype="int8")
    prompts = ["The quick brown fox jumps over the lazy dog. " * 4, "Once upon a time"]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=2)
    torch_out = LLM(str(tiny_llama_dir), use_triton=False, **settings).generate(prompts, params)
    triton_llm = LLM(str(tiny_llama_dir), use_triton=True, **settings)
    assert triton_llm.engine.runner.kv_pool.dtype == torch.int8
    triton_out = triton_llm.generate(prompts, params)
    for ref, out in zip(torch_out, triton_out):
        assert out.token_ids == ref.token_ids
        for a, b in zip(ref.logprobs, out.logprobs):
            assert abs(a.logprob - b.logprob) < 1e-3  # a rounding tie may land one code apart
