"""A projection with batched LoRA: ``y = base(x)``, then for each adapter slot in the step the
rows under it get ``(x[rows] @ A[slot]^T) @ B[slot]^T`` added (B already scaled); rows of the base
model skip. One product pair per adapter present, never a merge per request.

The base layer is whatever the loader built (float, int4 or int8; a GGUF's quantized blocks
included): the delta is added in the activation dtype on top of its product. A fused layer
(q/k/v, gate/up) keeps one A block of ``max_rank`` rows per shard and a B whose shard rows read
only their own block (zeros elsewhere), so a slot costs two GEMMs whatever the shards: on a CPU
the step's time is mostly per-op overhead at decode sizes (bench/lora.py).

Which rows belong to which slot is per step and shared by every wrapped projection (``LoRAStep``,
set by engine/lora/runtime.py before the forward): the layers' forward signatures stay as the
model files wrote them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LoRAStep:
    """This step's rows under adapters, set by engine/lora/runtime.py: with one adapter in the step,
    ``groups`` = [(slot, row indices [t] long, or None for every row)]; with several, ``mask``
    [T, slots] (1 where a row runs under a slot). Neither: a base-only step (the wrapped
    projections then cost one attribute check)."""

    def __init__(self):
        self.groups: list[tuple[int, torch.Tensor | None]] = []
        self.mask: torch.Tensor | None = None


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Module, shards: list[tuple[int, int]], *, num_slots: int,
                 max_rank: int, step: LoRAStep, dtype: torch.dtype, device: torch.device):
        """shards: (first row, rows) of each shard the adapters address, in row order."""
        super().__init__()
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.shards, self.max_rank, self.step = shards, max_rank, step
        # A [slots, shards * R, in], B [out, slots, shards * R]: shard s uses A rows and B columns
        # s*R .. s*R + r, and B's rows of shard s are zero outside them. Each is also one matrix
        # over every slot ([slots * shards * R, in] and [out, slots * shards * R]) for mask steps.
        width = len(shards) * max_rank
        self.register_buffer("lora_a", torch.zeros(num_slots, width, self.in_features, dtype=dtype,
                                                   device=device))
        self.register_buffer("lora_b", torch.zeros(self.out_features, num_slots, width, dtype=dtype,
                                                   device=device))

    def set_slot(self, slot: int, weights: dict[int, tuple[torch.Tensor, torch.Tensor]],
                 scale: float) -> None:
        """Load shard index -> (A [r, in], B [rows, r]) into ``slot``; shards not given are zero."""
        self.lora_a[slot].zero_()
        self.lora_b[:, slot].zero_()
        r0 = self.max_rank
        for s, (a, b) in weights.items():
            start, rows = self.shards[s]
            r = a.shape[0]
            self.lora_a[slot, s * r0:s * r0 + r].copy_(a)
            self.lora_b[start:start + rows, slot, s * r0:s * r0 + r].copy_(b * scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # [T, out]
        mask = self.step.mask
        if mask is not None:  # every slot's product at once, each row keeping its own slot's
            t, num_slots = mask.shape
            xa = F.linear(x, self.lora_a.view(-1, self.in_features)).view(t, num_slots, -1)
            return y.add_(F.linear((xa * mask[:, :, None]).view(t, -1),
                                   self.lora_b.view(self.out_features, -1)))
        for slot, rows in self.step.groups:
            xs = x if rows is None else x.index_select(0, rows)
            delta = F.linear(F.linear(xs, self.lora_a[slot]), self.lora_b[:, slot])  # [t, out]
            if rows is None:
                y.add_(delta)
            else:
                y.index_add_(0, rows, delta)
        return y
