"""A projection with batched LoRA: ``y = base(x)``, then for each adapter slot in the step the
rows under it get ``(x[rows] @ A[slot]^T) @ B[slot]^T`` added (B already scaled); rows of the base
model skip. One product pair per adapter present, never a merge per request.

The base layer is whatever the loader built (float, int4 or int8; a GGUF's quantized blocks
included): the delta is added in the activation dtype on top of its product. A fused layer
(q/k/v, gate/up) keeps one A block of ``max_rank`` rows per shard, so its A product is one GEMM
for all shards; each shard's B multiplies its own block into its own output rows.

Which rows belong to which slot is per step and shared by every wrapped projection (``LoRAStep``,
set by engine/lora/runtime.py before the forward): the layers' forward signatures stay as the
model files wrote them.
"""

from __future__ import annotations

import torch
from torch import nn


class LoRAStep:
    """This step's rows per adapter slot: [(slot, row indices [t] long)], empty for a base-only
    step (the wrapped projections then cost one attribute check)."""

    def __init__(self):
        self.groups: list[tuple[int, torch.Tensor]] = []


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Module, shards: list[tuple[int, int]], *, num_slots: int,
                 max_rank: int, step: LoRAStep, dtype: torch.dtype, device: torch.device):
        """shards: (first row, rows) of each shard the adapters address, in row order."""
        super().__init__()
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.shards, self.max_rank, self.step = shards, max_rank, step
        # [slots, shards * R, in] and [slots, out, R]: shard s uses A rows s*R .. s*R + r
        self.register_buffer("lora_a", torch.zeros(num_slots, len(shards) * max_rank,
                                                   self.in_features, dtype=dtype, device=device))
        self.register_buffer("lora_b", torch.zeros(num_slots, self.out_features, max_rank,
                                                   dtype=dtype, device=device))

    def set_slot(self, slot: int, weights: dict[int, tuple[torch.Tensor, torch.Tensor]],
                 scale: float) -> None:
        """Load shard index -> (A [r, in], B [rows, r]) into ``slot``; shards not given are zero."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        r0 = self.max_rank
        for s, (a, b) in weights.items():
            start, rows = self.shards[s]
            r = a.shape[0]
            self.lora_a[slot, s * r0:s * r0 + r].copy_(a)
            self.lora_b[slot, start:start + rows, :r].copy_(b * scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # [T, out]
        for slot, rows in self.step.groups:
            xa = x.index_select(0, rows) @ self.lora_a[slot].T  # [t, shards * R]
            b = self.lora_b[slot]
            if len(self.shards) == 1:
                delta = xa @ b.T  # [t, out]
            else:
                r = self.max_rank
                delta = torch.cat([xa[:, i * r:(i + 1) * r] @ b[start:start + n].T
                                   for i, (start, n) in enumerate(self.shards)], dim=1)
            y.index_add_(0, rows, delta.to(y.dtype))
        return y
