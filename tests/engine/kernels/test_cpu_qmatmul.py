"""The engine's own CPU int4/int8 kernels (engine/kernels/cpu/qmatmul.c) against plain-torch references:
its exact arithmetic (the same int8-rounded activations, float64), the dequantized fp32 product,
and the layers that use it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from engine.kernels.cpu import build, native, qmatmul as q4
from engine.layers.linear import LMHead
from engine.quantization.int4 import (Int4WeightOnlyLinear, dequantize_int4, int4_linear_reference,
                                      quantize_int4)

pytestmark = pytest.mark.skipif(q4.library() is None, reason="no C compiler or no AVX2/FMA/F16C here")


def _weight(n: int, k: int, group: int = 32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    codes, scales, zeros = quantize_int4(torch.randn(n, k, generator=gen) * 0.05, group)
    return codes, scales, zeros


def _ref4(x, packed, bias=None):
    codes, d, m = q4.unpack_int4(*packed)
    return q4.reference(x, codes, d, m, bias)


@pytest.mark.parametrize("rows", [1, 3, 8, 17, 70])
@pytest.mark.parametrize("n,k", [(16, 64), (48, 96), (64, 576)])
def test_kernel_computes_exactly_the_int8_activation_product(rows, n, k):
    codes, scales, zeros = _weight(n, k, seed=rows)
    packed = q4.pack_int4(codes, scales, zeros, 32)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(k))
    bias = torch.randn(n)
    expected = _ref4(x, packed, bias)
    got = q4.int4_matmul(x, *packed, bias)
    # fp32 output: the float64 result up to the kernel's float32 accumulation
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    got16 = q4.int4_matmul(x.to(torch.bfloat16), *packed, bias)
    expected16 = _ref4(x.to(torch.bfloat16), packed, bias)
    assert got16.dtype == torch.bfloat16
    torch.testing.assert_close(got16.float(), expected16, rtol=2 ** -7, atol=1e-3 * expected16.abs().max().item())


@pytest.mark.parametrize("rows", [1, 16, 21])
def test_an_odd_number_of_row_groups_is_computed_exactly(rows):
    # from 16 rows the AVX2 kernel takes two groups of G output rows at a time: the last one alone
    n, k = 3 * q4.rows_per_group(), 64
    gen = torch.Generator().manual_seed(rows)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales, zeros = torch.rand(n, k // 32, generator=gen) * 0.01, torch.randn(n, k // 32, generator=gen) * 0.01
    packed = q4.pack_int4(codes, scales, zeros, 32)
    x = torch.randn(rows, k, generator=gen)
    expected = _ref4(x, packed)
    torch.testing.assert_close(q4.int4_matmul(x, *packed), expected, rtol=1e-5,
                               atol=1e-5 * expected.abs().max().item())


def test_int8_activations_cost_well_under_a_percent_against_the_fp32_product():
    codes, scales, zeros = _weight(256, 576)
    x = torch.randn(32, 576)
    exact = int4_linear_reference(x, codes, scales, zeros, 32)
    got = q4.int4_matmul(x, *q4.pack_int4(codes, scales, zeros, 32))
    rel = ((got - exact).norm() / exact.norm()).item()
    assert rel < 0.01, rel  # 8-bit activations a block: ~0.5% measured


def test_a_rows_result_does_not_depend_on_its_batch_or_the_threads():
    codes, scales, zeros = _weight(192, 576, seed=5)
    packed = q4.pack_int4(codes, scales, zeros, 32)
    x = torch.randn(37, 576, dtype=torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        whole = q4.int4_matmul(x, *packed)
        alone = torch.cat([q4.int4_matmul(x[i:i + 1], *packed) for i in range(37)])
        torch.set_num_threads(1)
        one_thread = q4.int4_matmul(x, *packed)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(whole, alone)
    assert torch.equal(whole, one_thread)


@pytest.mark.parametrize("rows", [8, 13, 16, 33, 70])
def test_the_amx_tiles_agree_bit_for_bit_with_the_vnni_path(rows):
    lib = q4.library()
    if not lib.pagoda_q4_set_amx(1):
        pytest.skip("no AMX here (or the kernel did not grant the tile state)")
    codes, scales, zeros = _weight(192, 576 + 32 * (rows % 2), seed=rows)  # an odd block count too
    packed = q4.pack_int4(codes, scales, zeros, 32)
    q, d = q4.quantize_int8_blocks(torch.randn(64, codes.shape[1]))
    packed8 = q4.pack_int8(q, d)
    bias = torch.randn(192)
    results = {}
    try:
        for amx in (1, 0):
            lib.pagoda_q4_set_amx(amx)
            for dtype in (torch.bfloat16, torch.float32):
                x = torch.randn(rows, codes.shape[1], generator=torch.Generator().manual_seed(1)).to(dtype)
                results[amx, dtype] = (q4.int4_matmul(x, *packed, bias=bias),
                                       q4.int8_matmul(x, *packed8, out_dtype=torch.float32))
    finally:
        lib.pagoda_q4_set_amx(1)
    for dtype in (torch.bfloat16, torch.float32):
        for amx_out, vnni_out in zip(results[1, dtype], results[0, dtype]):
            assert torch.equal(amx_out, vnni_out)
    x = torch.randn(rows, codes.shape[1], generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(results[1, torch.float32][0], _ref4(x, packed, bias), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_pack_keeps_every_weight_and_larger_groups_share_their_scale(group):
    codes, scales, zeros = _weight(32, 256, group)
    nibbles, d, m = q4.pack_int4(codes, scales, zeros, group)
    back, d32, m32 = q4.unpack_int4(nibbles, d, m)
    assert torch.equal(back, codes)
    dequantized = (back.float().reshape(32, -1, 32) * d32[..., None] + m32[..., None]).reshape(32, 256)
    reference = dequantize_int4(codes, scales, zeros, group)
    torch.testing.assert_close(dequantized, reference, rtol=0, atol=2e-3 * reference.abs().max().item())


@pytest.mark.slow  # compiles a second build of the native library: 10 s with a cold kernel cache
def test_the_avx2_build_agrees_bit_for_bit_with_this_machines():
    avx2 = build.load(("-mavx2", "-mfma", "-mf16c"))
    if avx2 is None:
        pytest.skip("the AVX2 build did not compile")
    native.declare(avx2)
    codes, scales, zeros = _weight(64, 576, seed=9)
    x = torch.randn(11, 576, dtype=torch.bfloat16)
    here = q4.int4_matmul(x, *q4.pack_int4(codes, scales, zeros, 32))
    other = q4.int4_matmul(x, *q4.pack_int4(codes, scales, zeros, 32, rows=q4.rows_per_group(avx2)), lib=avx2)
    assert torch.equal(here, other)
    q, d = q4.quantize_int8_blocks(torch.randn(64, 576))
    here8 = q4.int8_matmul(x, *q4.pack_int8(q, d), out_dtype=torch.float32)
    other8 = q4.int8_matmul(x, *q4.pack_int8(q, d, rows=q4.rows_per_group(avx2)), out_dtype=torch.float32, lib=avx2)
    assert torch.equal(here8, other8)


def test_int4_layer_runs_the_native_kernel_in_fp32_and_bf16():
    codes, scales, zeros = _weight(96, 576, seed=2)
    bias = torch.randn(96)
    layer = Int4WeightOnlyLinear(codes, scales, zeros, 32, bias)
    assert layer.native
    x = torch.randn(2, 3, 576)
    reference = int4_linear_reference(x.reshape(6, 576), codes, scales, zeros, 32, bias).reshape(2, 3, 96)
    for dtype, tol in ((torch.float32, 0.01), (torch.bfloat16, 0.02)):
        out = layer(x.to(dtype))
        assert out.dtype == dtype and out.shape == (2, 3, 96)
        assert ((out.float() - reference).norm() / reference.norm()).item() < tol
    torch.testing.assert_close(layer.dequantized_weight(), dequantize_int4(codes, scales, zeros, 32),
                               rtol=0, atol=1e-3)


@pytest.mark.e2e  # an engine process of its own
def test_turning_native_kernels_off_falls_back_to_torchs_kernel(tmp_path):
    script = ("import torch; from engine.quantization.int4 import Int4WeightOnlyLinear, quantize_int4;"
              "c, s, z = quantize_int4(torch.randn(32, 64), 32); l = Int4WeightOnlyLinear(c, s, z, 32);"
              "print(l.native, l(torch.randn(1, 64, dtype=torch.bfloat16)).shape)")
    env = {**os.environ, "PAGODA_NATIVE_KERNELS": "0", "PAGODA_KERNEL_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))),
                         check=True).stdout
    assert out.split() == ["False", "torch.Size([1,", "32])"]
    assert not list(tmp_path.iterdir())  # nothing was built


@pytest.mark.slow  # compiles the library (every source, ~7 s on 2 cores)
def test_the_build_is_cached_per_source_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(build, "_loaded", {})
    assert build.load() is not None
    first = sorted(tmp_path.iterdir())
    monkeypatch.setattr(build, "_loaded", {})
    assert build.load() is not None
    assert sorted(tmp_path.iterdir()) == first and len(first) == 1  # built once, then reused


@pytest.mark.parametrize("rows", [1, 5, 33])
def test_int8_kernel_computes_exactly_the_int8_activation_product(rows):
    w = torch.randn(80, 192, generator=torch.Generator().manual_seed(rows))
    q, d = q4.quantize_int8_blocks(w)
    packed = q4.pack_int8(q, d)
    back_q, back_d = q4.unpack_int8(*packed)
    assert torch.equal(back_q, q) and torch.equal(back_d, d)
    assert q.abs().max() <= 127 and (w - (q.float().reshape(80, -1, 32) * d[..., None]).reshape(80, 192)).abs().max() <= d.max() / 2 + 1e-6
    x = torch.randn(rows, 192)
    bias = torch.randn(80)
    expected = q4.reference(x, q.float(), d, None, bias)
    got = q4.int8_matmul(x, *packed, bias)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    got32 = q4.int8_matmul(x.to(torch.bfloat16), *packed, out_dtype=torch.float32)
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32, q4.reference(x.to(torch.bfloat16), q.float(), d, None),
                               rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_lm_head_gives_float32_logits_that_do_not_depend_on_the_batch(dtype):
    weight = torch.nn.Parameter((torch.randn(512, 64) * 0.1).to(dtype), requires_grad=False)
    head = LMHead(64, 512, tied=weight)
    head.prepare(int8_small_rows=True)
    assert head.q8_weight is not None and head.small_rows is None and head.packed_fp32 is None
    hidden = torch.randn(40, 64).to(dtype)
    logits = head(hidden)
    assert logits.dtype == torch.float32 and logits.shape == (40, 512)
    assert torch.equal(logits[3:4], head(hidden[3:4]))  # one row alone, the same bits
    exact = hidden.float() @ weight.float().t()
    assert ((logits - exact).norm() / exact.norm()).item() < 0.01
    # not rounded to bf16: far more distinct values than bf16 has near these magnitudes
    assert not torch.equal(logits, logits.bfloat16().float())


@pytest.mark.parametrize("k", [32, 64, 96, 576, 1536, 8192])
def test_the_scratch_python_reserves_is_what_the_kernel_writes(k):
    for rows in (1, 7, 300):
        assert q4._scratch_bytes(rows, k) == q4.library().pagoda_q4_scratch_bytes(rows, k)


@pytest.mark.slow  # loads SmolLM2
def test_a_tied_embedding_reads_the_lm_heads_int8_table_and_the_float_table_is_freed():
    from engine import LLM
    from engine.layers.int8_embedding import Int8Embedding

    llm = LLM("smollm2")
    runner = llm.engine.runner
    embed, head = runner.model.model.embed_tokens, runner.model.lm_head
    assert isinstance(embed, Int8Embedding) and head.weight is None
    assert embed.codes is head.q8_weight  # one table, not two
    ids = torch.tensor([0, 1, 17, 4093, 49151])
    rows = embed(ids)
    assert rows.dtype == runner.dtype and rows.shape == (5, 576)
    codes, d = q4.unpack_int8(head.q8_weight, head.q8_scales)
    expected = (codes[ids].float().reshape(5, -1, 32) * d[ids][..., None]).reshape(5, 576)
    assert torch.equal(rows, expected.to(runner.dtype))
    # the table is the GGUF's own Q8_0 blocks, not a re-rounding of their float copy
    from engine.models.gguf_file import GGUFFile
    from engine.models.registry import resolve_model_path
    from engine.quantization.gguf import int8_blocks

    (token_embd,) = [t for t in GGUFFile(resolve_model_path("smollm2")).tensors if t.name == "token_embd.weight"]
    assert token_embd.tensor_type.name == "Q8_0"
    file_codes, file_d = int8_blocks(token_embd.data, (49152, 576), "Q8_0")
    assert torch.equal(codes, file_codes) and torch.equal(d, file_d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_embeddings_int8_blocks_become_the_lm_heads_codes_as_they_are(dtype):
    """A GGUF's Q8_0 token_embd reaches the (tied) embedding as its blocks: the float table is
    written from them, and the LM head packs them as they are. Codes that do not reach 127 in a
    block (a re-rounding of the table would stretch them to) prove it is not re-rounded."""
    from engine.layers.linear import LMHead, embedding_weight_loader
    from engine.quantization.int8 import Int8Weight

    torch.manual_seed(0)
    n, k = 64, 96
    q = torch.randint(-60, 61, (n, k), dtype=torch.int8)
    d = torch.rand(n, k // 32) / 100 + 1e-3
    d = d.half().float()  # fp16 scales, as a GGUF stores them
    table = torch.nn.Parameter(torch.empty(n, k, dtype=dtype), requires_grad=False)
    embedding_weight_loader(table, Int8Weight(q, d))
    dense = (q.float().reshape(n, -1, 32) * d[..., None]).reshape(n, k)
    assert torch.equal(table, dense.to(dtype))
    head = LMHead(k, n, tied=table)
    head.prepare(int8_small_rows=True)
    codes, scales = q4.unpack_int8(head.q8_weight, head.q8_scales)
    assert torch.equal(codes, q) and torch.equal(scales, d)
    assert table.int8_blocks is None  # not kept beside the packed copy
