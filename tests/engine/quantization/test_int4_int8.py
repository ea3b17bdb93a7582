"""The int4/int8 modules against their plain-torch dequantize references."""

import pytest
import torch
from torch import nn

from engine.quantization.int4 import (Int4WeightOnlyLinear, dequantize_int4, int4_linear_reference,
                                      pack_codes, quantize_int4, unpack_codes)
from engine.quantization.int8 import Int8WeightOnlyLinear, int8_linear_reference, quantize_int8


def _weight(out_features=96, in_features=256, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=gen) * 0.05


def test_cpu_int4_kernel_computes_q_minus_8_times_scale_plus_zero():
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (32, 64), dtype=torch.uint8, generator=gen)
    scales, zeros = torch.rand(32, 2, generator=gen) + 0.5, torch.randn(32, 2, generator=gen)
    x = torch.randn(3, 64, generator=gen)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    # float32 everywhere: the kernel's arithmetic, not bf16 rounding, is what is checked
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(
        x, packed, 32, torch.stack([scales.t(), zeros.t()], -1).contiguous())
    weight = ((codes.float() - 8).view(32, 2, 32) * scales[..., None] + zeros[..., None]).view(32, 64)
    torch.testing.assert_close(out, x @ weight.t(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_module_matches_its_dequantized_reference(group_size):
    weight, bias = _weight(), torch.randn(96) * 0.1
    codes, scales, zeros = quantize_int4(weight, group_size)
    module = Int4WeightOnlyLinear(codes, scales, zeros, group_size, bias)
    x = torch.randn(2, 5, 256)
    # the kernel rounds x to bf16 and returns bf16: relative error ~2^-8 of the output's size
    expected = int4_linear_reference(x, codes, scales, zeros, group_size, bias)
    out = module(x)
    assert out.shape == (2, 5, 96) and out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_quantization_error_is_within_half_a_step(group_size):
    weight = _weight()
    codes, scales, zeros = quantize_int4(weight, group_size)
    error = (dequantize_int4(codes, scales, zeros, group_size) - weight).abs()
    step = scales.float().repeat_interleave(group_size, dim=1)
    # half a step from rounding, plus bf16 rounding of z (2^-8 relative) at the group ends
    assert (error <= 0.5 * step + 2 ** -8 * zeros.float().abs().repeat_interleave(group_size, 1)
            + 1e-6).all()
    smaller_groups_err = (dequantize_int4(*quantize_int4(weight, 32), 32) - weight).pow(2).mean()
    assert smaller_groups_err <= error.pow(2).mean() + 1e-12


def test_int4_codes_round_trip_the_storage_nibbles():
    codes = torch.randint(0, 16, (16, 64), dtype=torch.uint8)
    assert torch.equal(unpack_codes(pack_codes(codes)), codes)


@pytest.mark.parametrize("shape, group_size, message", [
    ((96, 80), 32, "multiple of group_size"),
    ((90, 256), 32, "multiple of 16"),
    ((96, 256), 16, "group_size must be one of"),
    ((96, 576), 128, r"in_features \(576\)"),
])
def test_int4_refuses_shapes_the_kernel_cannot_run(shape, group_size, message):
    with pytest.raises(ValueError, match=message):
        Int4WeightOnlyLinear.from_float(torch.randn(*shape), group_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("in_features", [200, 208])  # bf16 kernel only where in % 16 == 0
def test_int8_module_matches_its_dequantized_reference(dtype, in_features):
    weight, bias = _weight(90, in_features), torch.randn(90) * 0.1  # odd out_features are fine
    q, scales = quantize_int8(weight)
    module = Int8WeightOnlyLinear(q, scales, bias, dtype=dtype)
    x = torch.randn(7, in_features).to(dtype)
    out = module(x)
    expected = int8_linear_reference(x, q, scales, bias).float()
    assert out.dtype == dtype
    # fp32: only summation order differs; bf16: output rounding (2^-8) and bf16 scales (2^-8)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol * expected.abs().max().item())


def test_int8_quantization_is_symmetric_per_row_within_half_a_step():
    weight = _weight(64, 128)
    q, scales = quantize_int8(weight)
    assert q.min() >= -127 and int(q.abs().amax(dim=1).min()) == 127
    assert ((q.float() * scales[:, None] - weight).abs() <= 0.5 * scales[:, None] + 1e-7).all()


def test_int8_module_follows_float_linear_closely():
    linear = nn.Linear(256, 64)
    module = Int8WeightOnlyLinear.from_float(linear.weight, linear.bias)
    x = torch.randn(4, 256)
    with torch.no_grad():
        expected = linear(x)
    rel = (module(x) - expected).norm() / expected.norm()
    assert rel < 1e-2
