"""Weight-only quantized products y = x @ dequantize(W)^T (+ b), reading the packed codes directly.

Two layouts, those the quantized layers keep off the CPU (engine/quantization/):
- int4, group-wise asymmetric: codes uint8 [N, K / 2] (``pack_codes``: column 2j in the low
  nibble of byte j, 2j + 1 in the high one), ``scales_and_zeros`` [K / group, N, 2];
  w = (q - 8) * s + z for the group of ``group_size`` input columns (32, 64, 128 or 256).
- int8, per output channel: q int8 [N, K], scales [N]; w = q * s.

Neither kernel widens the weight before the product. The integer part goes through the dot as it
is ((q - 8) and q are exact in bf16 and fp16), accumulated in float32, and the scales come after:
for one K tile inside one int4 group, x . w_n = s_n * (x . (q_n - 8)) + z_n * sum(x), so a tile
costs one dot, one row sum of x and two multiply-adds per output. A program covers a
BLOCK_M x BLOCK_N tile of y; the tile sizes depend only on the number of rows (``_blocks``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.common import (
    FLOAT_DTYPES, dot_precision, dot_upcast, innermost_contiguous, require,
)
from engine.kernels.quant_reference import (GROUP_SIZES, int4_linear_reference, int8_linear_reference,
                                           unpack_codes)


def _blocks(num_rows: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) for a product of ``num_rows`` rows; int4 takes
    BLOCK_K = min(it, group_size), so that a K tile lies in one group.

    Decode (few rows) reads the weight once and is bound by memory: small N tiles give many
    programs (N / 32 of them: 128 for a 4096-wide projection); prefill is bound by the dots:
    128 x 128 tiles, K tiles of 64 so three pipeline stages of float32 tiles take 96 KiB of
    shared memory (fits an A100's 164 KiB as well as an H200's 227 KiB; 128 would take 192).
    16 is the smallest M a tensor-core dot takes.
    """
    if num_rows <= 64:
        return max(16, triton.next_power_of_2(num_rows)), 32 if num_rows <= 16 else 64, 128, 4
    return 128, 128, 64, 8


@triton.jit
def _int4_matmul_kernel(
    x_ptr, w_ptr, sz_ptr, bias_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_sg, stride_sn, stride_om,
    GROUP_SIZE: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    row_mask, col_mask = rows < M, cols < N
    pairs = tl.arange(0, BLOCK_K // 2)  # byte j of a tile: columns 2j (low) and 2j + 1 (high)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    w_cols = w_ptr + cols.to(tl.int64)[None, :] * stride_wn  # [1, BLOCK_N]
    sz_cols = sz_ptr + cols * stride_sn  # [BLOCK_N]
    dot_dtype = tl.float32 if DOT_UPCAST else x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, K, BLOCK_K):  # K is a multiple of GROUP_SIZE, GROUP_SIZE of BLOCK_K
        even = x_rows + (k + 2 * pairs)[None, :]
        x_even = tl.load(even, mask=row_mask[:, None], other=0.0)  # [BLOCK_M, BLOCK_K / 2]
        x_odd = tl.load(even + 1, mask=row_mask[:, None], other=0.0)
        packed = tl.load(w_cols + (k // 2 + pairs)[:, None], mask=col_mask[None, :], other=0)
        lo = ((packed & 0xF).to(tl.float32) - 8.0).to(dot_dtype)  # [BLOCK_K / 2, BLOCK_N]
        hi = ((packed >> 4).to(tl.float32) - 8.0).to(dot_dtype)
        part = tl.dot(x_even.to(dot_dtype), lo, input_precision=DOT_PRECISION)
        part = tl.dot(x_odd.to(dot_dtype), hi, part, input_precision=DOT_PRECISION)
        x_sum = tl.sum(x_even.to(tl.float32), axis=1) + tl.sum(x_odd.to(tl.float32), axis=1)
        group = sz_cols + (k // GROUP_SIZE) * stride_sg
        s = tl.load(group, mask=col_mask, other=0.0).to(tl.float32)  # [BLOCK_N]
        z = tl.load(group + 1, mask=col_mask, other=0.0).to(tl.float32)
        acc += part * s[None, :] + x_sum[:, None] * z[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _int8_matmul_kernel(
    x_ptr, w_ptr, scales_ptr, bias_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    row_mask, col_mask = rows < M, cols < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    w_cols = w_ptr + cols.to(tl.int64)[None, :] * stride_wn  # [1, BLOCK_N]
    dot_dtype = tl.float32 if DOT_UPCAST else x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, K, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        x = tl.load(x_rows + ks[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        q = tl.load(w_cols + ks[:, None], mask=k_mask[:, None] & col_mask[None, :], other=0)
        acc = tl.dot(x.to(dot_dtype), q.to(dot_dtype), acc, input_precision=DOT_PRECISION)
    acc *= tl.load(scales_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


def _check_x(x: torch.Tensor, in_features: int) -> None:
    require(x.dim() == 2, "x", f"must be [num_tokens, in_features], got {tuple(x.shape)}")
    require(x.dtype in FLOAT_DTYPES, "x", f"unsupported dtype {x.dtype}")
    require(x.shape[1] == in_features, "x",
            f"has {x.shape[1]} columns, the weight takes {in_features}")


def _check_bias(bias: torch.Tensor | None, out_features: int) -> None:
    require(bias is None or tuple(bias.shape) == (out_features,), "bias",
            f"must be [{out_features}], got {None if bias is None else tuple(bias.shape)}")


def _check_int4(x, packed, scales_and_zeros, group_size, bias) -> None:
    require(packed.dim() == 2 and packed.dtype == torch.uint8, "weight_packed",
            f"must be uint8 [out_features, in_features / 2], got {packed.dtype} {tuple(packed.shape)}")
    require(group_size in GROUP_SIZES, "group_size", f"must be one of {GROUP_SIZES}, got {group_size}")
    out_features, in_features = packed.shape[0], 2 * packed.shape[1]
    _check_x(x, in_features)
    require(in_features % group_size == 0, "group_size",
            f"in_features ({in_features}) must be a multiple of it ({group_size})")
    expected = (in_features // group_size, out_features, 2)
    require(tuple(scales_and_zeros.shape) == expected and scales_and_zeros.dtype in FLOAT_DTYPES,
            "scales_and_zeros", f"must be float {expected}, got {scales_and_zeros.dtype} "
                                f"{tuple(scales_and_zeros.shape)}")
    _check_bias(bias, out_features)


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor,
                group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float, packed uint8 [N, K / 2], scales_and_zeros [K / group, N, 2] -> [M, N] in x.dtype."""
    _check_int4(x, packed, scales_and_zeros, group_size, bias)
    x, packed = innermost_contiguous(x), innermost_contiguous(packed)
    scales_and_zeros = innermost_contiguous(scales_and_zeros)
    (num_rows, in_features), out_features = x.shape, packed.shape[0]
    out = torch.empty((num_rows, out_features), dtype=x.dtype, device=x.device)
    if num_rows == 0 or out_features == 0:
        return out
    block_m, block_n, block_k, num_warps = _blocks(num_rows)
    grid = (triton.cdiv(num_rows, block_m), triton.cdiv(out_features, block_n))
    _int4_matmul_kernel[grid](
        x, packed, scales_and_zeros, out if bias is None else bias, out,
        num_rows, out_features, in_features,
        x.stride(0), packed.stride(0), scales_and_zeros.stride(0), scales_and_zeros.stride(1),
        out.stride(0),
        GROUP_SIZE=group_size, HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=min(group_size, block_k),
        DOT_UPCAST=dot_upcast(x.dtype), DOT_PRECISION=dot_precision(x.dtype),
        num_warps=num_warps,
    )
    return out


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float, q int8 [N, K], scales [N] -> [M, N] in x.dtype."""
    require(q.dim() == 2 and q.dtype == torch.int8, "weight_int8",
            f"must be int8 [out_features, in_features], got {q.dtype} {tuple(q.shape)}")
    _check_x(x, q.shape[1])
    require(tuple(scales.shape) == (q.shape[0],), "scales",
            f"must be [{q.shape[0]}], got {tuple(scales.shape)}")
    _check_bias(bias, q.shape[0])
    x, q = innermost_contiguous(x), innermost_contiguous(q)
    (num_rows, in_features), out_features = x.shape, q.shape[0]
    out = torch.empty((num_rows, out_features), dtype=x.dtype, device=x.device)
    if num_rows == 0 or out_features == 0:
        return out
    block_m, block_n, block_k, num_warps = _blocks(num_rows)
    grid = (triton.cdiv(num_rows, block_m), triton.cdiv(out_features, block_n))
    _int8_matmul_kernel[grid](
        x, q, scales.contiguous(), out if bias is None else bias, out,
        num_rows, out_features, in_features,
        x.stride(0), q.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        DOT_UPCAST=dot_upcast(x.dtype), DOT_PRECISION=dot_precision(x.dtype),
        num_warps=num_warps,
    )
    return out


def int4_matmul_ref(x, packed, scales_and_zeros, group_size, bias=None):
    """int4_matmul in plain torch: the layer's float32 reference on the unpacked codes."""
    _check_int4(x, packed, scales_and_zeros, group_size, bias)
    return int4_linear_reference(x, unpack_codes(packed), scales_and_zeros[..., 0].t(),
                                 scales_and_zeros[..., 1].t(), group_size, bias)


def int8_matmul_ref(x, q, scales, bias=None):
    """int8_matmul in plain torch (float32 products, x's dtype out)."""
    return int8_linear_reference(x, q, scales, bias)
