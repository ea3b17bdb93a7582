"""kv_cache_dtype int8 on the CPU path (fp8_e4m3 is refused there): the same memory holds about
twice the tokens of bf16, greedy answers do not depend on what the prefix cache or chunking held, and the
8-bit cache's answers follow the float cache's on the tiny random Llama."""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.errors import InvalidParameterError
from engine.memory.estimate import estimate_memory
from engine.kernels import kv_quant

MIB = 1 << 20
SETTINGS = dict(max_model_len=256, device="cpu", max_num_seqs=8)
PROMPTS = ["The quick brown fox jumps over the lazy dog. " * 4, "Once upon a time, there was"]
PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, elem", [("bfloat16", 2), ("float32", 4)])
def test_an_8bit_kv_cache_holds_about_twice_the_bf16_tokens_in_the_same_memory(tiny_llama_dir, dtype, elem):
    tokens = {}
    for kv in ("auto", "int8"):
        settings = dict(SETTINGS, dtype=dtype, kv_cache_dtype=kv, kv_cache_memory=MIB, max_num_seqs=64)
        runner = LLM(str(tiny_llama_dir), **settings).engine.runner
        tokens[kv] = runner.num_blocks * runner.block_size
        assert runner.kv_cache_bytes <= MIB
        # the console's and the CLI's estimate count the same tokens before anything loads
        assert estimate_memory(str(tiny_llama_dir), settings).kv_tokens == tokens[kv]
        if kv == "int8":
            assert runner.kv_pool.dtype == torch.int8 and runner.kv_scale_pool.dtype == torch.float32
    # head_dim codes + a 4-byte scale instead of head_dim elements: x1.6 at the tiny model's
    # head_dim 16, x1.88 at SmolLM2's 64, x1.94 at 128 (bf16; twice that against float32)
    head_dim = runner.model_config.head_dim
    assert tokens["int8"] / tokens["auto"] == pytest.approx(head_dim * elem / (head_dim + 4), rel=0.01)


@pytest.mark.slow
@pytest.mark.parametrize("kv", ["int8"])
def test_8bit_kv_greedy_answer_is_the_same_with_and_without_prefix_cache_and_chunking(tiny_llama_dir, kv):
    chunked = LLM(str(tiny_llama_dir), dtype="bfloat16", kv_cache_dtype=kv, num_kv_blocks=64,
                  max_num_batched_tokens=16, **SETTINGS)
    first = chunked.generate(PROMPTS, PARAMS)
    again = chunked.generate(PROMPTS, PARAMS)  # the prompts' full blocks now come from the cache
    assert chunked.engine.scheduler.block_manager.num_prefix_hit_tokens >= 32
    whole = LLM(str(tiny_llama_dir), dtype="bfloat16", kv_cache_dtype=kv, num_kv_blocks=64,
                enable_prefix_caching=False, **SETTINGS).generate(PROMPTS, PARAMS)
    for a, b, c in zip(first, again, whole):
        assert a.token_ids == b.token_ids == c.token_ids
        assert [t.logprob for t in a.logprobs] == [t.logprob for t in b.logprobs] == \
            [t.logprob for t in c.logprobs]


@pytest.mark.slow
@pytest.mark.parametrize("kv, tol", [("int8", 0.02)])
def test_8bit_kv_answers_follow_the_float_cache(tiny_llama_dir, kv, tol):
    outputs = {k: LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype=k, num_kv_blocks=64,
                      **SETTINGS).generate(PROMPTS, PARAMS) for k in ("auto", kv)}
    for ref, out in zip(outputs["auto"], outputs[kv]):
        assert out.token_ids == ref.token_ids
        diff = max(abs(a.logprob - b.logprob) for a, b in zip(ref.logprobs, out.logprobs))
        assert 0 < diff < tol  # quantized (not the float cache by mistake), and close


def test_int8_codes_read_back_within_half_a_step_of_each_row():
    x = torch.randn(50, 3, 64) * torch.logspace(-3, 2, 50)[:, None, None]
    codes, scales = kv_quant.quantize(x, torch.int8)
    assert codes.dtype == torch.int8 and scales.shape == (50, 3)
    assert codes.abs().amax(dim=-1).ge(126).all()  # every row uses the range (scales rounded up)
    assert torch.equal(scales, scales.bfloat16().float())  # each scale is a bf16 value
    back = kv_quant.dequantize(codes, scales, torch.float32)
    assert ((back - x).abs() <= scales[..., None] / 2 * 1.0001).all()


def test_an_unknown_kv_cache_dtype_is_refused_naming_the_setting():
    with pytest.raises(InvalidParameterError) as err:
        EngineConfig(model="smollm2", kv_cache_dtype="int4")
    assert err.value.param == "kv_cache_dtype" and "fp8_e4m3" in str(err.value)


@pytest.mark.parametrize("code_dtype", [torch.int8, torch.float8_e4m3fn])
def test_dequantizing_in_bf16_gives_the_float32_products_rounded_once(code_dtype):
    x = torch.randn(40, 3, 64) * torch.logspace(-3, 2, 40)[:, None, None]
    codes, scales = kv_quant.quantize(x, code_dtype)
    exact = (codes.float() * scales[..., None]).bfloat16()
    assert torch.equal(kv_quant.dequantize(codes, scales, torch.bfloat16), exact)


def test_writes_and_gathers_through_one_pool_allocation_match_separate_tensors():
    from engine.layers.attention import Workspace

    pool = torch.zeros(2, 3, 10, 16, 2, 8, dtype=torch.int8)  # [K/V, layers, blocks, bs, KVH, D]
    scales = torch.zeros(2, 3, 10, 16, 2)
    one = (pool[0, 1], pool[1, 1], scales[0, 1], scales[1, 1])  # K and V in one op each
    separate = tuple(t.clone() for t in one)  # one op per tensor
    assert kv_quant.stacked(one[0], one[1]) is not None and kv_quant.stacked(*separate[:2]) is None
    k, v = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    slots = torch.tensor([3, 17, 40, 41, 100])
    for cache in (one, separate):
        kv_quant.write(cache, k, v, slots)
    assert all(torch.equal(a, b) for a, b in zip(one, separate))
    assert pool[:, 0].abs().sum() == 0 and pool[:, 2].abs().sum() == 0  # other layers untouched
    ids = torch.tensor([6, 0, 2, 1])
    got = [kv_quant.gather_blocks(c, ids, torch.bfloat16, Workspace(torch.device("cpu")))
           for c in (one, separate)]
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])
    assert torch.equal(got[0][1][2, 8].float(), kv_quant.read_slots(  # ids[2] = block 2, row 8 = slot 40
        separate, torch.tensor([40]), torch.float32)[1][0].bfloat16().float())


@pytest.mark.slow
def test_fp8_kv_cache_on_a_cpu_is_refused_naming_the_setting(tiny_llama_dir):
    with pytest.raises(InvalidParameterError) as err:
        LLM(str(tiny_llama_dir), kv_cache_dtype="fp8_e4m3", num_kv_blocks=8, **SETTINGS)
    assert err.value.param == "kv_cache_dtype" and "int8" in str(err.value)
