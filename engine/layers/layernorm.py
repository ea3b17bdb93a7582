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
            x = x + residual
            residual = x
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # one call instead of seven; the same ops in the same order, bit-identical to HF's
            out = F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        else:
            # HF's float32 normalisation in one call (the same values as its four ops), rounded
            # to the model's dtype before the scale, as HF rounds it
            h = F.rms_norm(x.float(), self.weight.shape, None, self.eps)
            out = self.weight * h.to(x.dtype)
        return out if residual is None else (out, residual)
