"""Per-step attention metadata, built once by the model runner and shared by every layer.

The flattened batch holds the tokens of prefilling sequences first, then one token
per decoding sequence. K/V of this step's tokens are written into the paged cache
at ``slot_mapping`` before attention reads them back through the block tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PrefillSeq:
    """One sequence's prompt chunk in this step (CPU path)."""

    query_start: int  # row of its first query token in the flat batch
    query_len: int
    context_len: int  # tokens in the cache after this step's write, including the chunk
    context_slots: torch.Tensor | None  # [context_len] cache slots; None when nothing came before


@dataclass
class DecodeGroup:
    """Decoding sequences of similar context length, padded to the group's longest (CPU path)."""

    row_start: int  # rows [row_start, row_end) of the flat batch
    row_end: int
    flat_block_ids: torch.Tensor  # [g * max_blocks_in_group] long, row-major block tables
    mask: torch.Tensor  # [g, 1, 1, max_blocks_in_group * block_size] bool, True = attend
    # A group of one sequence whose blocks are consecutive in the pool (a lone stream's usually
    # are): its first block, so a float32 cache is read through a view (no gather, no mask).
    block_run_start: int | None = None
    context_len: int = 0  # of the group's first sequence, this step's token included
    _additive: dict = field(default_factory=dict, repr=False, compare=False)

    def additive_mask(self, dtype: torch.dtype, window: int | None = None) -> torch.Tensor:
        """``mask`` as 0 / -inf in ``dtype``, converted once per step instead of inside every
        layer's scaled_dot_product_attention (which converts a bool mask to exactly this).
        window: also -inf before each row's last ``window`` tokens (sliding-window layers)."""
        m = self._additive.get((dtype, window))
        if m is None:
            mask = self.mask
            if window is not None:
                lens = mask.sum(dim=-1, keepdim=True)  # [g, 1, 1, 1] context lengths
                mask = mask & (torch.arange(mask.shape[-1], device=mask.device) >= lens - window)
            m = self._additive[dtype, window] = torch.zeros(
                mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        return m


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] long
    num_prefill_tokens: int
    num_decode_tokens: int
    # CPU path
    prefills: list[PrefillSeq] = field(default_factory=list)
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    # Triton path (decode tables and lengths also for the CPU's fused decode step)
    prefill_block_tables: torch.Tensor | None = None  # [Np, max_blocks] int32
    prefill_cu_query_lens: torch.Tensor | None = None  # [Np + 1] int32
    prefill_context_lens: torch.Tensor | None = None  # [Np] int32
    prefill_max_query_len: int = 0
    decode_block_tables: torch.Tensor | None = None  # [Nd, max_blocks] int32
    decode_context_lens: torch.Tensor | None = None  # [Nd] int32
    workspace: object = None  # layers.attention.Workspace shared by every layer (CPU path)
    # The same step over the sliding-window layers' own pool (engine/scheduling/window_blocks.py),
    # when the model keeps one; those layers read this instead.
    window: AttentionMetadata | None = None

    def prefill_part(self) -> AttentionMetadata:
        """This step's prefill rows alone (CPU path), for a step whose decode rows run elsewhere
        (engine/models/fused_decode.py): the same prefills, no decodes."""
        return AttentionMetadata(slot_mapping=self.slot_mapping[:self.num_prefill_tokens],
                                 num_prefill_tokens=self.num_prefill_tokens, num_decode_tokens=0,
                                 prefills=self.prefills, workspace=self.workspace,
                                 window=None if self.window is None else self.window.prefill_part())
