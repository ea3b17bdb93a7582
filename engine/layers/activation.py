"""Gated activations over a fused [gate | up] projection: SiLU (Llama), tanh GELU (Gemma)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    def __init__(self, use_triton: bool = False):
        super().__init__()
        self.use_triton = use_triton

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, 2 * I] -> [T, I]."""
        if self.use_triton:
            from engine.kernels.activation import silu_and_mul
            return silu_and_mul(x)
        half = x.shape[-1] // 2
        return F.silu(x[..., :half]).mul_(x[..., half:])  # into silu's own output


class GeluAndMul(nn.Module):
    """GELU(gate, tanh approximation) * up over a fused [gate | up] projection (Gemma's GeGLU,
    transformers' gelu_pytorch_tanh)."""

    def __init__(self, use_triton: bool = False):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, 2 * I] -> [T, I]."""
        half = x.shape[-1] // 2
        return F.gelu(x[..., :half], approximate="tanh").mul_(x[..., half:])
