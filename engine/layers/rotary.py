"""Rotary position embedding (HF rotate_half layout); the frequency tables of every scaling type
come from engine/layers/rope_scaling.py."""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.rope_scaling import rope_tables


class RotaryEmbedding(nn.Module):
    """One per model, shared by its layers: the tables depend only on the positions.

    On the PyTorch path a step looks up its positions once (``prepare``) and every layer then
    rotates its Q and K heads together in four ops (``rotate``); the Triton path rotates in place.
    """

    def __init__(self, head_dim: int, max_position: int, base: float, scaling: dict | None,
                 use_triton: bool = False, freq_factors: list[float] | None = None):
        super().__init__()
        self.head_dim = head_dim
        self.use_triton = use_triton
        cos, sin = rope_tables(head_dim, max_position, base, scaling, freq_factors)
        # [max_position, head_dim] float32: cos of the half-frequencies, then their sin (the Triton
        # kernel's and the fused CPU step's layout; half of a full-width cos and sin: Gemma 3's two
        # tables of 32,768 positions were 128 MiB, a third of its weights' memory).
        self.register_buffer("cos_sin_cache", torch.cat([cos, sin], dim=-1), persistent=False)

    def prepare(self, positions: torch.Tensor, dtype: torch.dtype):
        """Once per step: the (cos, sin) tables of ``positions`` for ``rotate``, each [T, 1, D]
        in ``dtype``: full-width cos, and sin with rotate_half's sign folded in, so that
        rotate_half(x) * sin == roll(x, D/2) * [-sin, sin] exactly; None on the Triton path."""
        if self.use_triton:
            return None
        cos, sin = self.cos_sin_cache[positions].to(dtype).unsqueeze(1).chunk(2, dim=-1)
        return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)

    def rotate(self, x: torch.Tensor, table) -> torch.Tensor:
        """x: [T, N, D] (any strides), table from ``prepare``.
        Returns rotated [T, N, D] (HF's x * cos + rotate_half(x) * sin, rounding included).
        (A flip of [T, N, 2, D/2] swaps the halves too, but measured slower than roll at 32 rows.)"""
        cos, sin = table
        out = x * cos
        out += x.roll(self.head_dim // 2, dims=-1) * sin
        return out

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions: [T]; q: [T, H * D]; k: [T, KVH * D]. Returns rotated (q, k)."""
        if self.use_triton:
            from engine.kernels.rotary import rotary_embedding
            rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_dim)
            return q, k
        table = self.prepare(positions, q.dtype)
        t = q.shape[0]
        return (self.rotate(q.view(t, -1, self.head_dim), table).view(q.shape),
                self.rotate(k.view(t, -1, self.head_dim), table).view(k.shape))
