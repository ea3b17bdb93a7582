"""Turns a scheduler decision into the flat tensors of one forward pass."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.layers.attention_metadata import AttentionMetadata, DecodeGroup, PrefillSeq
from engine.scheduling.scheduler import ScheduledSequence

DECODE_GROUP_SIZE = 16  # decodes are padded per group of similar lengths, not to the batch max


@dataclass
class InputBatch:
    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    meta: AttentionMetadata
    # [S] rows of the flat batch whose next token is sampled; slice(None) when that is every row
    logits_rows: torch.Tensor | slice
    # the S rows' entries, in the same order: a speculative entry once per row (its k + 1 rows all
    # sample, engine/speculative/verify.py), any other once
    sampling: list[ScheduledSequence]
    sample_positions: list[int]  # [S] the position of the token each row samples
    ordered: list[ScheduledSequence]  # every entry, in the order of the flat batch's rows
    last_position: int = -1  # the largest of ``positions`` (-1: none)


def build_input_batch(entries: list[ScheduledSequence], block_size: int, device: torch.device,
                      use_triton: bool, fused_decode: bool = False,
                      window_tables: bool = False, fused_prefill: bool = False) -> InputBatch:
    """fused_decode (CPU): the decode rows run in engine/models/fused_decode.py, which reads their
    block tables and context lengths (as the Triton path does) instead of decode groups.
    fused_prefill (with fused_decode; the batch-invariant mode): every row runs there, a prompt
    chunk's tokens as rows of their own, each over its sequence's table up to its own position.
    window_tables: also ``meta.window``, the same step over the sequences' window tables (the
    sliding-window layers' own pool, engine/scheduling/window_blocks.py; CPU path)."""
    prefills = [e for e in entries if e.num_new_tokens > 1]
    decodes = sorted((e for e in entries if e.num_new_tokens == 1),
                     key=lambda e: e.start)  # by context length
    ordered = prefills + decodes

    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    logits_rows: list[int] = []
    sampling: list[ScheduledSequence] = []
    sample_positions: list[int] = []
    for e in ordered:
        table = e.seq.block_table
        end = e.start + e.num_new_tokens
        input_ids.extend(e.input_token_ids)
        positions.extend(range(e.start, end))
        slots.extend(table[p // block_size] * block_size + p % block_size for p in range(e.start, end))
        if e.draft:  # verified: every row samples
            logits_rows.extend(range(len(input_ids) - e.num_new_tokens, len(input_ids)))
            sampling.extend([e] * e.num_new_tokens)
            sample_positions.extend(range(e.start + 1, end + 1))
        elif e.is_sampling:
            logits_rows.append(len(input_ids) - 1)
            sampling.append(e)
            sample_positions.append(end)

    num_prefill_tokens = sum(e.num_new_tokens for e in prefills)
    # One host tensor (one host-to-device copy) for the step's ids, positions and slots; the
    # three are views of it. Logits rows: every row in order when only decodes sample.
    t = len(input_ids)
    every_row = len(logits_rows) == t  # rows are increasing, so then they are 0 .. t - 1
    flat = _tensor(input_ids + positions + slots + ([] if every_row else logits_rows), device)
    meta = AttentionMetadata(
        slot_mapping=flat[2 * t:3 * t],
        num_prefill_tokens=num_prefill_tokens,
        num_decode_tokens=len(decodes),
    )
    if fused_decode and fused_prefill:
        _fill_row_tables(meta, ordered, device)
    elif use_triton:
        _fill_triton_metadata(meta, prefills, decodes, block_size, device)
    else:
        _fill_torch_metadata(meta, prefills, [] if fused_decode else decodes, block_size, device)
        if fused_decode:
            _fill_decode_tables(meta, decodes, device)
    if window_tables:
        meta.window = _window_metadata(ordered, prefills, decodes, meta, block_size, device,
                                       fused_decode, fused_prefill)
    return InputBatch(
        input_ids=flat[:t],
        positions=flat[t:2 * t],
        meta=meta,
        logits_rows=slice(None) if every_row else flat[3 * t:],
        sampling=sampling,
        sample_positions=sample_positions,
        ordered=ordered,
        last_position=max((e.start + e.num_new_tokens for e in ordered), default=0) - 1,
    )


def _window_metadata(ordered, prefills, decodes, meta, block_size, device, fused_decode=False,
                     fused_prefill=False) -> AttentionMetadata:
    """The step's metadata over window tables: the same rows, their slots in the window pool; for
    the fused step's rows their window tables, as wide as ``meta``'s tables."""
    slots = [e.seq.window_table[p // block_size] * block_size + p % block_size
             for e in ordered for p in range(e.start, e.start + e.num_new_tokens)]
    window = AttentionMetadata(slot_mapping=_tensor(slots, device),
                               num_prefill_tokens=meta.num_prefill_tokens,
                               num_decode_tokens=meta.num_decode_tokens, workspace=meta.workspace)
    if fused_decode and fused_prefill:
        _fill_row_tables(window, ordered, device, "window_table")
    else:
        _fill_torch_metadata(window, prefills, [] if fused_decode else decodes, block_size, device,
                             table="window_table")
        if fused_decode:
            _fill_decode_tables(window, decodes, device, "window_table")
    # one width for both tables (decode_step.c's table_width)
    if meta.decode_block_tables is not None and window.decode_block_tables is not None:
        meta.decode_block_tables, window.decode_block_tables = _same_width(
            meta.decode_block_tables, window.decode_block_tables)
    return window


def _same_width(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two [rows, blocks] tables padded with block 0 to the wider's width."""
    width = max(a.shape[1], b.shape[1])
    return tuple(F.pad(t, (0, width - t.shape[1])) if t.shape[1] < width else t for t in (a, b))


def _fill_torch_metadata(meta, prefills, decodes, block_size, device, table="block_table") -> None:
    row = 0
    for e in prefills:
        context_len = e.start + e.num_new_tokens
        context_slots = None
        if e.start > 0:
            blocks = torch.tensor(getattr(e.seq, table)[:-(-context_len // block_size)], dtype=torch.long)
            offsets = torch.arange(block_size, dtype=torch.long)
            context_slots = (blocks[:, None] * block_size + offsets).flatten()[:context_len].to(device)
        meta.prefills.append(PrefillSeq(row, e.num_new_tokens, context_len, context_slots))
        row += e.num_new_tokens
    for g in range(0, len(decodes), DECODE_GROUP_SIZE):
        group = decodes[g:g + DECODE_GROUP_SIZE]
        context_lens = [e.start + 1 for e in group]
        num_blocks = -(-max(context_lens) // block_size)
        tables = [getattr(e.seq, table)[:num_blocks] for e in group]
        tables = [t + [0] * (num_blocks - len(t)) for t in tables]
        lens = torch.tensor(context_lens, dtype=torch.long)
        mask = torch.arange(num_blocks * block_size) < lens[:, None]  # [g, L]
        meta.decode_groups.append(DecodeGroup(
            row_start=g, row_end=g + len(group),
            flat_block_ids=_tensor([b for t in tables for b in t], device),
            mask=mask[:, None, None, :].to(device),
            block_run_start=(tables[0][0] if len(group) == 1
                             and _is_one_run(tables[0]) else None),
            context_len=context_lens[0],
        ))


def _is_one_run(blocks: list[int]) -> bool:
    """Whether ``blocks`` are consecutive block ids, ascending."""
    return blocks[-1] - blocks[0] == len(blocks) - 1 and all(
        b - a == 1 for a, b in zip(blocks, blocks[1:]))


def _fill_triton_metadata(meta, prefills, decodes, block_size, device) -> None:
    if prefills:
        cu = [0]
        for e in prefills:
            cu.append(cu[-1] + e.num_new_tokens)
        meta.prefill_cu_query_lens = _tensor(cu, device, torch.int32)
        meta.prefill_context_lens = _tensor([e.start + e.num_new_tokens for e in prefills], device,
                                            torch.int32)
        meta.prefill_block_tables = _padded_tables(prefills, device)
        meta.prefill_max_query_len = max(e.num_new_tokens for e in prefills)
    _fill_decode_tables(meta, decodes, device)


def _fill_decode_tables(meta, decodes, device, table="block_table") -> None:
    """Each decode's context length (its new token included) and block table, int32."""
    if decodes:
        meta.decode_context_lens = _tensor([e.start + 1 for e in decodes], device, torch.int32)
        meta.decode_block_tables = _padded_tables(decodes, device, table)


def _fill_row_tables(meta, ordered, device, table="block_table") -> None:
    """Every row's context length (its own token included) and its sequence's block table, int32:
    a prompt chunk's token at position p attends to positions 0..p, as that token's decode would."""
    meta.decode_context_lens = _tensor([p + 1 for e in ordered for p in range(e.start, e.start + e.num_new_tokens)],
                                       device, torch.int32)
    tables = _padded_tables(ordered, device, table)
    if any(e.num_new_tokens > 1 for e in ordered):  # else one row each: two torch calls fewer a decode step
        tables = tables.repeat_interleave(torch.tensor([e.num_new_tokens for e in ordered], device=device), dim=0)
    meta.decode_block_tables = tables


def _padded_tables(entries, device, table="block_table") -> torch.Tensor:
    tables = [getattr(e.seq, table) for e in entries]
    width = max(len(t) for t in tables)
    return _tensor([t + [0] * (width - len(t)) for t in tables], device, torch.int32)


def _tensor(data, device, dtype=torch.long) -> torch.Tensor:
    t = torch.tensor(data, dtype=dtype)
    return t.to(device, non_blocking=True) if t.device != device else t
