"""SiLU-and-multiply: the gated activation of a Llama MLP, silu(gate) * up, in one pass."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.kernels.common import FLOAT_DTYPES, innermost_contiguous, require

BLOCK_I = 1024  # columns per program


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, I, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + I + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor) -> None:
    require(x.dim() == 2 and x.shape[1] % 2 == 0, "x",
            f"must be [num_tokens, 2 * intermediate], got {tuple(x.shape)}")
    require(x.dtype in FLOAT_DTYPES, "x", f"unsupported dtype {x.dtype}")


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, 2 * I] (gate then up) -> [num_tokens, I] in x.dtype."""
    _check(x)
    x = innermost_contiguous(x)
    num_tokens, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_tokens, inter), dtype=x.dtype, device=x.device)
    if num_tokens > 0 and inter > 0:
        block = min(BLOCK_I, triton.next_power_of_2(inter))
        grid = (num_tokens, triton.cdiv(inter, block))
        _silu_and_mul_kernel[grid](x, out, x.stride(0), out.stride(0), inter, BLOCK=block)
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    _check(x)
    gate, up = x.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)
