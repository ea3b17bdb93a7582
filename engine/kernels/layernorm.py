"""RMSNorm, alone and fused with the residual add that precedes it in every Llama block.

Rounding follows Hugging Face's LlamaRMSNorm so the engine matches it in half precision:
normalize in float32, round to x.dtype, then multiply by the weight and round again.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.common import FLOAT_DTYPES, innermost_contiguous, require


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr,
    stride_x, stride_r, stride_o, stride_nr,
    eps,
    D: tl.constexpr, BLOCK_D: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):
    # One program per row; D fits one tile (hidden sizes are <= 16K).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(new_residual_ptr.dtype.element_ty)
        tl.store(new_residual_ptr + row * stride_nr + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    normed = (xf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    require(x.dim() == 2, "x", f"must be [num_tokens, hidden], got {tuple(x.shape)}")
    require(x.dtype in FLOAT_DTYPES, "x", f"unsupported dtype {x.dtype}")
    require(weight.shape == (x.shape[1],), "weight",
            f"must be [{x.shape[1]}], got {tuple(weight.shape)}")


def _launch(x, residual, weight, eps):
    x = innermost_contiguous(x)
    weight = weight.contiguous()
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    new_residual = out if residual is None else torch.empty_like(out)
    residual = x if residual is None else innermost_contiguous(residual)
    num_rows, d = x.shape
    block_d = triton.next_power_of_2(d)
    if num_rows > 0:
        _rms_norm_kernel[(num_rows,)](
            x, residual, weight, out, new_residual,
            x.stride(0), residual.stride(0), out.stride(0), new_residual.stride(0),
            float(eps),
            D=d, BLOCK_D=block_d, HAS_RESIDUAL=new_residual is not out,
            num_warps=min(max(block_d // 256, 1), 16),  # ~8 values per thread per tensor
        )
    return out, new_residual


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [num_tokens, hidden], weight: [hidden] -> [num_tokens, hidden] in x.dtype."""
    _check(x, weight)
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (rms_norm(x + residual), x + residual); the sum is rounded to x.dtype first."""
    _check(x, weight)
    require(residual.shape == x.shape and residual.dtype == x.dtype, "residual",
            f"must match x ({tuple(x.shape)}, {x.dtype}), got ({tuple(residual.shape)}, "
            f"{residual.dtype})")
    return _launch(x, residual, weight, eps)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check(x, weight)
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed.to(x.dtype).float() * weight.float()).to(x.dtype)


def fused_add_rms_norm_ref(x, residual, weight, eps):
    _check(x, weight)
    new_residual = (x.float() + residual.float()).to(x.dtype)
    return rms_norm_ref(new_residual, weight, eps), new_residual
