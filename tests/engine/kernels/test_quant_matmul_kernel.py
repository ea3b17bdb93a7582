"""The int4 and int8 weight-only matmul kernels against the layers' plain-torch references.

Tolerance, from what the two sides compute. Both read the same activations (the reference widens
x's own values) and the same weight values, so they differ only (1) in the order and grouping of
float32 sums (the kernel adds s * sum x (q - 8) and z * sum x per group; the reference sums
x * w), each within the textbook bound K * 2^-24 * sum_k |x_k| |term_k|, and (2) in the one final
rounding to x's dtype, where the interpreter truncates and torch rounds to nearest: one unit in
the last place, 2^-7 |y| for bfloat16 and 2^-10 |y| for float16. A wrong nibble, group or scale
moves a result by a whole |w|, orders of magnitude past this bound.
"""

import pytest
import torch

from engine.errors import InvalidParameterError
from engine.kernels.quant_matmul import int4_matmul, int4_matmul_ref, int8_matmul
from engine.quantization.int4 import int4_linear_reference, pack_codes, quantize_int4
from engine.quantization.int8 import int8_linear_reference, quantize_int8

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
LAST_PLACE = {torch.float32: 0.0, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}
ROWS = [1, 3, 17, 70]  # one and a few decode rows, and a prefill tile (70 rows: BLOCK_M 128)


def assert_within_rounding(actual, expected, x, abs_terms, bias=None):
    """abs_terms [N, K]: |each weight term| the kernel or the reference adds per column."""
    assert actual.dtype == expected.dtype == x.dtype and actual.shape == expected.shape
    sums = x.float().abs() @ abs_terms.t()  # [M, N] sum of |products|
    if bias is not None:
        sums = sums + bias.float().abs()
    tol = 2 * x.shape[1] * 2.0 ** -24 * sums + LAST_PLACE[x.dtype] * expected.float().abs()
    err = (actual.cpu().float() - expected.cpu().float()).abs()
    worst = (err - tol.cpu()).max().item()
    assert worst <= 0, f"error exceeds the rounding bound by {worst:.3g} (max error {err.max():.3g})"


def int4_case(rows, out_features, in_features, group_size, dtype, has_bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    codes, scales, zeros = quantize_int4(torch.randn(out_features, in_features, generator=gen),
                                         group_size)
    x = (2 * torch.randn(rows, in_features, generator=gen)).to(dtype)
    bias = torch.randn(out_features, generator=gen).to(dtype) if has_bias else None
    # the layer's layout off the CPU (Int4WeightOnlyLinear.set_weight)
    scales_and_zeros = torch.stack([scales.t(), zeros.t()], dim=-1).contiguous()
    q = codes.float().reshape(out_features, -1, group_size) - 8
    abs_terms = (q.abs() * scales.float()[..., None] + zeros.float().abs()[..., None])
    return x, codes, scales, zeros, pack_codes(codes), scales_and_zeros, bias, abs_terms.flatten(1)


def to(device, *tensors):
    return [None if t is None else t.to(device) for t in tensors]


@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [32, 64, 128, 256])
@pytest.mark.parametrize("rows", ROWS)
def test_int4_kernel_matches_the_layer_reference(device, rows, group_size, dtype, has_bias):
    # K = 3 groups, not a power of two. (An int4 K is always whole K tiles: a tile is at most a
    # group; the int8 test takes the ragged K.) N = 48 or 144 leaves a partial N tile (32, 64 or
    # 128 wide).
    out_features = 48 if rows < 70 else 144
    x, codes, scales, zeros, packed, sz, bias, terms = int4_case(
        rows, out_features, 3 * group_size, group_size, dtype, has_bias)
    expected = int4_linear_reference(x, codes, scales, zeros, group_size, bias)
    actual = int4_matmul(*to(device, x, packed, sz), group_size, *to(device, bias))
    assert_within_rounding(actual, expected, x, terms, bias)


def test_int4_kernel_covers_several_row_tiles(device):
    x, codes, scales, zeros, packed, sz, _, terms = int4_case(300, 32, 96, 32, torch.bfloat16, False)
    expected = int4_linear_reference(x, codes, scales, zeros, 32)
    assert_within_rounding(int4_matmul(*to(device, x, packed, sz), 32), expected, x, terms)


def test_int4_reference_reads_the_layers_packing():
    x, codes, scales, zeros, packed, sz, bias, _ = int4_case(5, 32, 128, 64, torch.float32, True)
    torch.testing.assert_close(int4_matmul_ref(x, packed, sz, 64, bias),
                               int4_linear_reference(x, codes, scales, zeros, 64, bias),
                               rtol=0, atol=0)


def int8_case(rows, out_features, in_features, dtype, has_bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, scales = quantize_int8(torch.randn(out_features, in_features, generator=gen))
    scales = scales.to(dtype)  # the layer keeps its scales in the activation dtype
    x = (2 * torch.randn(rows, in_features, generator=gen)).to(dtype)
    bias = torch.randn(out_features, generator=gen).to(dtype) if has_bias else None
    return x, q, scales, bias, q.float().abs() * scales.float()[:, None]


# K 100 and 300: neither a multiple of the K tile (128 for up to 64 rows, 64 above).
@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_features", [100, 300])
@pytest.mark.parametrize("rows", ROWS)
def test_int8_kernel_matches_the_layer_reference(device, rows, in_features, dtype, has_bias):
    out_features = 48 if rows < 70 else 144
    x, q, scales, bias, terms = int8_case(rows, out_features, in_features, dtype, has_bias)
    expected = int8_linear_reference(x, q, scales, bias)
    actual = int8_matmul(*to(device, x, q, scales, bias))
    assert_within_rounding(actual, expected, x, terms, bias)


def test_kernels_read_rows_of_a_wider_activation(device):
    x, codes, scales, zeros, packed, sz, _, terms = int4_case(3, 32, 64, 32, torch.float32, False)
    wide = torch.randn(3, 64 + 8, generator=torch.Generator().manual_seed(1))
    wide[:, :64] = x
    strided = wide.to(device)[:, :64]  # row stride 72
    assert_within_rounding(int4_matmul(strided, *to(device, packed, sz), 32),
                           int4_linear_reference(x, codes, scales, zeros, 32), x, terms)
    x8, q, s8, _, terms8 = int8_case(3, 32, 64, torch.float32, False)
    wide[:, :64] = x8
    strided = wide.to(device)[:, :64]
    assert_within_rounding(int8_matmul(strided, *to(device, q, s8)),
                           int8_linear_reference(x8, q, s8), x8, terms8)


def test_kernels_return_an_empty_product_for_no_rows(device):
    _, _, _, _, packed, sz, _, _ = int4_case(1, 32, 64, 32, torch.bfloat16, False)
    x = torch.empty(0, 64, dtype=torch.bfloat16, device=device)
    assert int4_matmul(x, *to(device, packed, sz), 32).shape == (0, 32)
    _, q, scales, _, _ = int8_case(1, 32, 64, torch.bfloat16, False)
    assert int8_matmul(x, *to(device, q, scales)).shape == (0, 32)


@pytest.mark.parametrize("change, param", [
    (dict(x=torch.zeros(2, 32)), "x"),
    (dict(x=torch.zeros(2, 64, dtype=torch.int32)), "x"),
    (dict(sz=torch.zeros(1, 32, 2)), "scales_and_zeros"),
    (dict(group_size=48), "group_size"),
    (dict(packed=torch.zeros(32, 32, dtype=torch.int8)), "weight_packed"),
    (dict(bias=torch.zeros(16)), "bias"),
])
def test_int4_kernel_names_the_argument_it_cannot_use(change, param):
    _, _, _, _, packed, sz, _, _ = int4_case(1, 32, 64, 32, torch.float32, False)
    args = dict(x=torch.zeros(2, 64), packed=packed, sz=sz, group_size=32, bias=None) | change
    with pytest.raises(InvalidParameterError) as err:
        int4_matmul(args["x"], args["packed"], args["sz"], args["group_size"], args["bias"])
    assert err.value.param == param


@pytest.mark.parametrize("change, param", [
    (dict(x=torch.zeros(2, 63)), "x"),
    (dict(q=torch.zeros(32, 64, dtype=torch.uint8)), "weight_int8"),
    (dict(scales=torch.ones(31)), "scales"),
])
def test_int8_kernel_names_the_argument_it_cannot_use(change, param):
    args = dict(x=torch.zeros(2, 64), q=torch.zeros(32, 64, dtype=torch.int8),
                scales=torch.ones(32)) | change
    with pytest.raises(InvalidParameterError) as err:
        int8_matmul(args["x"], args["q"], args["scales"])
    assert err.value.param == param
