"""Paged decode attention: one new query token per sequence against its cached context.

Flash-decoding: each sequence's context is cut into num_splits partitions processed by separate
programs, which write a normalized partial output and its log-sum-exp; a reduce kernel combines
them. One program serves all `group` query heads of a KV head, so each K/V tile is loaded once
per group. The launch reads only shapes (no device sync), so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from engine.kernels.attention_tile import attend_tile
from engine.kernels.kv_quant import bits, dequantize
from engine.kernels.common import (
    FLOAT_DTYPES, check_heads, scale_args, check_kv_cache, dot_precision, dot_upcast, innermost_contiguous, require,
)

BLOCK_N = 64  # context tokens per tile; split lengths are multiples of it
MIN_SPLIT_TOKENS = 256  # a partition shorter than this costs more to reduce than it saves
MAX_SPLITS = 64


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr,
    qk_scale, num_splits,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bt,
    stride_ob, stride_oh,
    stride_pob, stride_poh, stride_pos,
    stride_plb, stride_plh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, IS_SPLIT: tl.constexpr,
    DOT_UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    k_scale_ptr, v_scale_ptr, stride_sb, stride_st, QUANT: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)

    rows = tl.arange(0, BLOCK_H)  # query heads of this KV head, padded to a tl.dot tile
    heads = kv_head * GROUP + rows
    row_mask = rows < GROUP
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=row_mask[:, None] & dim_mask[None, :], other=0.0)  # [BLOCK_H, BLOCK_D]
    if DOT_UPCAST:
        q = q.to(tl.float32)

    split_len = tl.cdiv(tl.cdiv(context_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, context_len)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max, log2 units
    l = tl.zeros([BLOCK_H], tl.float32)  # running sum of exp2(s - m)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq * stride_bt
    for tile in range(start, end, BLOCK_N):
        m, l, acc = attend_tile(q, m, l, acc, k_cache_ptr, v_cache_ptr, table, kv_head, tile, end,
                                0, dims, dim_mask, qk_scale,
                                stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                                BLOCK_SIZE, BLOCK_N, False, True, DOT_UPCAST, DOT_PRECISION,
                                k_scale_ptr, v_scale_ptr, stride_sb, stride_st, QUANT)

    o = acc / tl.where(l > 0, l, 1.0)[:, None]  # an empty partition or context gives zeros
    out_mask = row_mask[:, None] & dim_mask[None, :]
    if IS_SPLIT:
        lse = m + tl.log2(tl.where(l > 0, l, 1.0))  # -inf for an empty partition (m = -inf)
        tl.store(part_out_ptr + seq * stride_pob + heads[:, None] * stride_poh + split * stride_pos
                 + dims[None, :], o, mask=out_mask)
        tl.store(part_lse_ptr + seq * stride_plb + heads * stride_plh + split, lse, mask=row_mask)
    else:
        tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _decode_reduce_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, num_splits,
    stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    # One program per (sequence, query head): weight each partition by exp2(lse - max lse).
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    split_mask = splits < num_splits
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < HEAD_DIM
    lse = tl.load(part_lse_ptr + seq * stride_plb + head * stride_plh + splits,
                  mask=split_mask, other=float("-inf"))
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(lse_max > float("-inf"), lse_max, 0.0)  # all partitions empty: weights 0
    weights = tl.exp2(lse - lse_max)  # [BLOCK_S]
    total = tl.sum(weights, axis=0)
    parts = tl.load(part_out_ptr + seq * stride_pob + head * stride_poh
                    + splits[:, None] * stride_pos + dims[None, :],
                    mask=split_mask[:, None] & dim_mask[None, :], other=0.0)
    o = tl.sum(parts * weights[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims, o.to(out_ptr.dtype.element_ty),
             mask=dim_mask)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: any small number exercises the same code


def choose_num_splits(batch_size: int, num_kv_heads: int, max_context_len: int,
                      num_sms: int) -> int:
    """Partitions per sequence so that about two waves of programs cover the GPU's SMs,
    without cutting partitions shorter than MIN_SPLIT_TOKENS; a power of two <= MAX_SPLITS."""
    programs = max(1, batch_size * num_kv_heads)
    by_occupancy = triton.cdiv(2 * num_sms, programs)
    by_length = max_context_len // MIN_SPLIT_TOKENS
    splits = max(1, min(by_occupancy, by_length, MAX_SPLITS))
    return 1 << (splits.bit_length() - 1)


def _check(q, k_cache, v_cache, block_tables, context_lens, num_splits, k_scales=None,
           v_scales=None) -> int:
    _, num_kv_heads, head_dim = check_kv_cache(k_cache, v_cache, k_scales, v_scales)
    require(q.dim() == 3, "q", f"must be [num_seqs, num_heads, head_dim], got {tuple(q.shape)}")
    require(q.dtype == k_cache.dtype or k_scales is not None, "q",
            f"dtype {q.dtype} != cache dtype {k_cache.dtype}")
    require(q.dtype in FLOAT_DTYPES, "q", f"must be a float dtype, got {q.dtype}")
    group = check_heads(q, num_kv_heads, head_dim)
    num_seqs = q.shape[0]
    require(block_tables.dim() == 2 and block_tables.shape[0] == num_seqs
            and block_tables.dtype == torch.int32, "block_tables",
            f"must be [{num_seqs}, max_blocks] int32, got {tuple(block_tables.shape)} "
            f"{block_tables.dtype}")
    require(context_lens.shape == (num_seqs,) and context_lens.dtype == torch.int32,
            "context_lens", f"must be [{num_seqs}] int32, got {tuple(context_lens.shape)} "
            f"{context_lens.dtype}")
    require(num_splits is None or (isinstance(num_splits, int) and num_splits >= 1),
            "num_splits", f"must be None or a positive int, got {num_splits!r}")
    return group


def paged_decode_attention(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    context_lens: torch.Tensor,  # [num_seqs] int32, cached tokens including this one
    scale: float,
    num_splits: int | None = None,  # None: chosen from the batch size and max_blocks
    k_scales: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32
    v_scales: torch.Tensor | None = None,  # of an int8 / fp8 cache (codes), else None
) -> torch.Tensor:
    """Attention of each sequence's query over its first context_lens[i] cached tokens.

    Returns [num_seqs, num_heads, head_dim] in q.dtype; a zero context_len gives zeros.
    """
    group = _check(q, k_cache, v_cache, block_tables, context_lens, num_splits, k_scales, v_scales)
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if num_seqs == 0:
        return out
    q = innermost_contiguous(q)
    block_tables = block_tables.contiguous()
    if num_splits is None:
        # The table's width bounds every context without reading context_lens on the host.
        num_splits = choose_num_splits(num_seqs, num_kv_heads, block_tables.shape[1] * block_size,
                                       _num_sms(q.device))
    is_split = num_splits > 1
    if is_split:
        part_out = torch.empty((num_seqs, num_heads, num_splits, head_dim),
                               dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32,
                               device=q.device)
    else:
        part_out, part_lse = out, out.view(num_seqs, num_heads * head_dim)  # unused
    block_d = triton.next_power_of_2(head_dim)
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_out, part_lse,
        float(scale) * math.log2(math.e), num_splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_SIZE=block_size,
        BLOCK_N=max(BLOCK_N, block_size), IS_SPLIT=is_split,
        DOT_UPCAST=dot_upcast(q.dtype), DOT_PRECISION=dot_precision(q.dtype),
        **scale_args(k_scales, v_scales, context_lens),
        num_warps=4,
    )
    if is_split:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            part_out, part_lse, out, num_splits,
            part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=triton.next_power_of_2(num_splits),
        )
    return out


def paged_decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, scale,
                               num_splits=None, k_scales=None, v_scales=None) -> torch.Tensor:
    """Plain-torch paged_decode_attention (num_splits is validated and otherwise ignored)."""
    group = _check(q, k_cache, v_cache, block_tables, context_lens, num_splits, k_scales, v_scales)
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if k_scales is not None:  # dequantized, rounded to q's dtype as the kernel rounds them
        k_cache = dequantize(bits(k_cache), k_scales, q.dtype)
        v_cache = dequantize(bits(v_cache), v_scales, q.dtype)
    # Gather every sequence's table into a contiguous [num_seqs, max_blocks * block_size, ...].
    k = k_cache[block_tables.long()].flatten(1, 2).float()  # [B, L, num_kv_heads, head_dim]
    v = v_cache[block_tables.long()].flatten(1, 2).float()
    qg = q.float().view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("bkgd,blkd->bkgl", qg, k) * scale  # [B, kv_heads, group, L]
    hidden = torch.arange(k.shape[1], device=q.device)[None, :] >= context_lens[:, None]  # [B, L]
    scores = scores.masked_fill(hidden[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # an empty context gives zeros
    out = torch.einsum("bkgl,blkd->bkgd", probs, v)
    return out.reshape(num_seqs, num_heads, head_dim).to(q.dtype)
