"""GGUF Q4_0 / Q4_1 / Q8_0 blocks into the int4/int8 layouts, against gguf's own dequantize."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from engine.quantization.gguf import int8_blocks, int8_from_blocks, q4_k_to_int4, q4_to_int4, q8_0_to_int8
from engine.quantization.int4 import Int4WeightOnlyLinear, dequantize_int4
from engine.quantization.int8 import Int8Weight, dequantize_int8, quantize_int8

OUT, IN = 48, 128


def _blocks(qtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(raw bytes as GGUFReader hands them, [OUT, bytes a row]; gguf's float32 dequantization)."""
    weight = np.random.default_rng(seed).normal(0.01, 0.05, (OUT, IN)).astype(np.float32)
    raw = quantize(weight, GGMLQuantizationType[qtype])
    return raw, dequantize(raw, GGMLQuantizationType[qtype]).reshape(OUT, IN)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_q4_blocks_keep_the_files_fp16_scales_and_dequantize_like_gguf(qtype):
    raw, reference = _blocks(qtype)
    codes, scales, zeros = q4_to_int4(raw, (OUT, IN), qtype)
    blocks = raw.reshape(OUT, IN // 32, -1)
    d = torch.from_numpy(blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))
    assert scales.dtype == torch.float32 and torch.equal(scales, d)  # unrounded
    if qtype == "Q4_1":  # d q + m = d (q - 8) + (m + 8 d)
        m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
        assert torch.equal(zeros - 8 * d, m)
    # gguf's own dequantization, up to float32 rounding of d (q - 8) + (m + 8 d)
    ours = dequantize_int4(codes, scales, zeros, 32)
    torch.testing.assert_close(ours, torch.from_numpy(reference), rtol=0, atol=1e-6)


def test_q4_0_has_zero_zero_points():
    raw, _ = _blocks("Q4_0")
    assert not q4_to_int4(raw, (OUT, IN), "Q4_0")[2].any()


def test_q4_1_module_from_blocks_matches_gguf_product():
    raw, reference = _blocks("Q4_1", seed=3)
    module = Int4WeightOnlyLinear(*q4_to_int4(torch.from_numpy(raw), (OUT, IN), "Q4_1"), 32)
    x = torch.randn(3, IN)
    expected = x @ torch.from_numpy(reference).t()
    torch.testing.assert_close(module(x), expected, rtol=3e-2, atol=3e-2 * expected.abs().max().item())


def test_q8_0_to_per_channel_int8_error_is_bounded_and_measured():
    raw, reference = _blocks("Q8_0")
    q, scales = q8_0_to_int8(raw, (OUT, IN))
    reference = torch.from_numpy(reference)
    error = dequantize_int8(q, scales) - reference
    # re-rounding onto the row's largest block scale costs at most half a step of it
    assert (error.abs() <= 0.5 * scales[:, None] + 1e-7).all()
    # about as good as quantizing the Q8_0 weight per row from scratch (the kernel's own limit)
    direct = dequantize_int8(*quantize_int8(reference)) - reference
    assert error.pow(2).mean() <= 1.05 * direct.pow(2).mean()


@pytest.mark.parametrize("call, message", [
    (lambda raw: q4_to_int4(raw, (OUT, IN + 32), "Q4_1"), "needs"),
    (lambda raw: q4_to_int4(raw, (OUT, 100), "Q4_1"), "multiple of 32"),
    (lambda raw: q4_to_int4(raw, (OUT, IN), "Q5_0"), "Q4_0 or Q4_1"),
])
def test_block_import_refuses_mismatched_shapes_and_types(call, message):
    raw, _ = _blocks("Q4_1")
    with pytest.raises(ValueError, match=message):
        call(raw)


def _k_blocks(qtype: str, out_features: int, in_features: int, seed: int = 0) -> np.ndarray:
    """Random but valid K-quant bytes [out, bytes a row]: every byte random except the fp16
    super-block scales, set to small finite values."""
    from gguf.constants import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[getattr(GGMLQuantizationType, qtype)]
    rng = np.random.default_rng(seed)
    n = out_features * in_features // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    halves = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (size - 2,)}[qtype]
    for at in halves:
        raw[:, at:at + 2] = (rng.random(n) * 0.01).astype(np.float16).view(np.uint8).reshape(n, 2)
    return raw.reshape(out_features, -1)


def test_q4_k_blocks_load_into_groups_of_32_exactly():
    raw = _k_blocks("Q4_K", 32, 512)
    codes, scales, zeros = q4_k_to_int4(raw, (32, 512))
    assert codes.shape == (32, 512) and scales.shape == zeros.shape == (32, 16)
    reference = dequantize(raw, GGMLQuantizationType.Q4_K).reshape(32, 512)
    assert np.array_equal(dequantize_int4(codes, scales, zeros, 32).numpy(), reference)


@pytest.mark.parametrize("qtype", ["Q5_K", "Q6_K"])
def test_k_quant_blocks_of_5_and_6_bits_load_into_per_row_int8_within_half_a_step(qtype):
    raw = _k_blocks(qtype, 16, 256, seed=1)
    q, row_scale = int8_from_blocks(raw, (16, 256), qtype)
    reference = torch.from_numpy(dequantize(raw, getattr(GGMLQuantizationType, qtype)).reshape(16, 256))
    ours = q.float() * row_scale[:, None]
    assert ((ours - reference).abs() <= row_scale[:, None] * (0.5 + 1e-5)).all()  # + float32 rounding


def test_q4_k_needs_whole_super_blocks():
    with pytest.raises(ValueError, match="multiple of 256"):
        q4_k_to_int4(np.zeros((4, 144), dtype=np.uint8), (4, 288))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q5_0"])
def test_q8_0_and_q5_0_load_into_int8_blocks_of_32_exactly(qtype):
    raw, reference = _blocks(qtype)
    q, d = int8_blocks(raw, (OUT, IN), qtype)
    assert q.dtype == torch.int8 and d.shape == (OUT, IN // 32)
    assert torch.equal(Int8Weight(q, d).dequantize(), torch.from_numpy(reference))


def test_q5_1_loads_into_int8_blocks_within_half_a_step_of_each_block():
    raw, reference = _blocks("Q5_1")
    q, d = int8_blocks(raw, (OUT, IN), "Q5_1")
    error = (Int8Weight(q, d).dequantize() - torch.from_numpy(reference)).abs().reshape(OUT, -1, 32)
    assert (error <= d[..., None] * (0.5 + 1e-5)).all()


def test_a_fused_layer_of_int8_block_shards_multiplies_them_in_the_native_kernel():
    from engine.kernels.cpu import qmatmul
    from engine.layers.linear import Int8Linear, QKVLinear
    if not qmatmul.supports(64, IN):
        pytest.skip("the native int8 kernel does not build here")
    like = QKVLinear(IN, 16, 2, 1)  # q [32, IN], k and v [16, IN]
    layer = Int8Linear(like, torch.float32)
    parts = {}
    for shard, (rows, qtype) in zip("qkv", ((32, "Q5_0"), (16, "Q5_0"), (16, "Q8_0"))):
        raw = quantize(np.random.default_rng(rows).normal(0, 0.05, (rows, IN)).astype(np.float32),
                       GGMLQuantizationType[qtype])
        parts[shard] = Int8Weight(*int8_blocks(raw, (rows, IN), qtype))
        layer.weight_loader(layer.weight, parts[shard], shard)
    assert layer._native_args is not None and layer.weight_int8 is None
    x = torch.randn(5, IN)
    q = torch.cat([parts[s].q for s in "qkv"]).float()
    d = torch.cat([parts[s].scales for s in "qkv"])
    torch.testing.assert_close(layer(x), qmatmul.reference(x, q, d, None), rtol=1e-5, atol=1e-5)
