"""RMSNorm, with the residual add fused in (HF Llama semantics, computed in float32)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, use_triton: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.use_triton = use_triton

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x: [T, D]. With ``residual``: returns (norm(x + residual), x + residual)."""
        if self.use_triton:
            from engine.kernels.layernorm import fused_add_rms_norm, rms_norm
            if residual is None:
                return rms_norm(x, self.weight, self.eps)
            return fused_add_rms_norm(x, residual, self.weight, self.eps)
        if residual is not None:
            # in place: the residual stream is this model's own tensor (the embedding's output,
            # then these sums), and x + r == r + x bit for bit
            x = residual = residual.add_(x)
        if self.weight.dtype == torch.float32 and x.dtype == torch.float32:
            # one call instead of seven; the same ops in the same order, bit-identical to HF's
            out = F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        else:
            # HF's float32 normalisation rounded to the model's dtype before the scale, as HF
            # rounds it: F.rms_norm upcasts a bf16/fp16 x itself and, without a weight, returns
            # that rounding (bit-identical to x.float() -> rms_norm -> .to(dtype), two casts fewer)
            out = self.weight * F.rms_norm(x, self.weight.shape, None, self.eps)
        return out if residual is None else (out, residual)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: scales by (1 + weight), normalises and scales in float32 then rounds (HF's
    Gemma3RMSNorm, op for op); no fused residual (Gemma adds it after a second norm)."""

    def __init__(self, hidden_size: int, eps: float, use_triton: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, D] -> [T, D]."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)
