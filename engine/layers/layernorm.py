"""RMSNorm, with the residual add fused in (HF Llama semantics, computed in float32)."""

from __future__ import annotations

import torch
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
            x = x + residual
            residual = x
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * h.to(dtype)
        return out if residual is None else (out, residual)
