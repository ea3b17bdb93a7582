"""One tensor a hot path writes a step's large temporaries into, kept from step to step.

A new tensor past glibc's mmap threshold (32 MiB) is mapped afresh on every allocation, then
faulted in and zeroed page by page as it is first written: Gemma 3's [32, 262,144] float32 logits
cost ~14 ms a step that way (bench/decode_profile.py). The step's logits (ModelRunner), the
sampler's work (Sampler) and the fused decode step's work areas (FusedDecode) each keep one.
A step uses its views up before the next step asks again; nothing else may hold them.
"""

from __future__ import annotations

import math

import torch


class KeptBuffer:
    """Views of one ``dtype`` tensor, grown geometrically (at most to ``limit_bytes``). A request
    larger than ``limit_bytes`` gets a tensor of its own, so a rare large step (a long prompt's
    rows) does not pin its size for the life of the process."""

    def __init__(self, dtype: torch.dtype, limit_bytes: int | None = None):
        self.dtype = dtype
        self.limit_bytes = limit_bytes
        self._tensor: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        """What is kept now."""
        return 0 if self._tensor is None else self._tensor.numel() * self._tensor.element_size()

    def take(self, *shape: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """A contiguous tensor of ``shape`` (uninitialised): a view of the kept one when it fits."""
        numel = math.prod(shape)
        limit = None if self.limit_bytes is None else self.limit_bytes // self.dtype.itemsize
        if limit is not None and numel > limit:
            return torch.empty(shape, dtype=self.dtype, device=device)
        kept, device = self._tensor, torch.device(device)
        if kept is None or kept.device != device:
            kept = None  # grown from nothing on another device
        if kept is None or kept.numel() < numel:
            grown = numel if kept is None else max(numel, 2 * kept.numel())
            kept = self._tensor = torch.empty(grown if limit is None else min(grown, limit),
                                              dtype=self.dtype, device=device)
        return kept[:numel].view(shape)
