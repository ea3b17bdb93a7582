"""Paged prefill attention: a step's query tokens of several sequences over the paged cache.

Query i of sequence n sits at absolute position context_lens[n] - query_len_n + i and attends
to cache positions <= that position. The step's own keys are already in the cache, so the same
kernel serves a plain prefill, a prefill after prefix-cache hits, a later chunk of a chunked
prefill and a decode token (query_len 1).

A program covers BLOCK_Q query tokens times the `group` query heads of one KV head, flattened
into BLOCK_M = BLOCK_Q * group rows, so each K/V tile is loaded once per group.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from engine.kernels.attention_tile import attend_tile
from engine.kernels.kv_quant import bits, dequantize
from engine.kernels.common import (
    FLOAT_DTYPES, check_heads, scale_args, check_kv_cache, dot_precision, dot_upcast, innermost_contiguous, require,
)

BLOCK_M = 64  # (query token, head) rows per program
BLOCK_N = 64  # context tokens per tile


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, cu_query_lens_ptr, context_lens_ptr,
    out_ptr, qk_scale,
    stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bt, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    k_scale_ptr, v_scale_ptr, stride_sb, stride_st, QUANT: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    first_query = tl.program_id(1) * BLOCK_Q
    kv_head = tl.program_id(2)
    q_start = tl.load(cu_query_lens_ptr + seq)
    query_len = tl.load(cu_query_lens_ptr + seq + 1) - q_start
    if first_query >= query_len:  # the grid is sized for the longest query of the batch
        return
    context_len = tl.load(context_lens_ptr + seq)
    prefix_len = context_len - query_len  # cached tokens before this step's first query

    rows = tl.arange(0, BLOCK_M)
    q_idx = first_query + rows // GROUP  # [BLOCK_M] query token within the sequence
    heads = kv_head * GROUP + rows % GROUP
    row_mask = (rows < BLOCK_Q * GROUP) & (q_idx < query_len)
    q_pos = prefix_len + q_idx  # absolute position of each row's token
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < HEAD_DIM
    q_rows = (q_start + q_idx).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                mask=row_mask[:, None] & dim_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    if DOT_UPCAST:
        q = q.to(tl.float32)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, log2 units
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq * stride_bt
    # Positions < prefix_len + first_query are visible to every row: no causal mask there.
    kv_end = tl.minimum(context_len, prefix_len + first_query + BLOCK_Q)
    full_end = (prefix_len + first_query) // BLOCK_N * BLOCK_N
    for tile in range(0, full_end, BLOCK_N):
        m, l, acc = attend_tile(q, m, l, acc, k_cache_ptr, v_cache_ptr, table, kv_head, tile,
                                 kv_end, q_pos, dims, dim_mask, qk_scale,
                                 stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                                 BLOCK_SIZE, BLOCK_N, False, False, DOT_UPCAST, DOT_PRECISION,
                                 k_scale_ptr, v_scale_ptr, stride_sb, stride_st, QUANT)
    for tile in range(full_end, kv_end, BLOCK_N):
        m, l, acc = attend_tile(q, m, l, acc, k_cache_ptr, v_cache_ptr, table, kv_head, tile,
                                 kv_end, q_pos, dims, dim_mask, qk_scale,
                                 stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                                 BLOCK_SIZE, BLOCK_N, True, False, DOT_UPCAST, DOT_PRECISION,
                                 k_scale_ptr, v_scale_ptr, stride_sb, stride_st, QUANT)

    o = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :],
             o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & dim_mask[None, :])


def _check(q, k_cache, v_cache, block_tables, cu_query_lens, context_lens, max_query_len,
           k_scales=None, v_scales=None) -> int:
    _, num_kv_heads, head_dim = check_kv_cache(k_cache, v_cache, k_scales, v_scales)
    require(q.dim() == 3, "q", f"must be [num_tokens, num_heads, head_dim], got {tuple(q.shape)}")
    require(q.dtype == k_cache.dtype or k_scales is not None, "q",
            f"dtype {q.dtype} != cache dtype {k_cache.dtype}")
    require(q.dtype in FLOAT_DTYPES, "q", f"must be a float dtype, got {q.dtype}")
    group = check_heads(q, num_kv_heads, head_dim)
    require(context_lens.dim() == 1 and context_lens.dtype == torch.int32, "context_lens",
            f"must be [num_seqs] int32, got {tuple(context_lens.shape)} {context_lens.dtype}")
    num_seqs = context_lens.shape[0]
    require(cu_query_lens.shape == (num_seqs + 1,) and cu_query_lens.dtype == torch.int32,
            "cu_query_lens", f"must be [{num_seqs + 1}] int32, got "
            f"{tuple(cu_query_lens.shape)} {cu_query_lens.dtype}")
    require(block_tables.dim() == 2 and block_tables.shape[0] == num_seqs
            and block_tables.dtype == torch.int32, "block_tables",
            f"must be [{num_seqs}, max_blocks] int32, got {tuple(block_tables.shape)} "
            f"{block_tables.dtype}")
    require(isinstance(max_query_len, int) and max_query_len >= 0, "max_query_len",
            f"must be a non-negative int, got {max_query_len!r}")
    return group


def paged_prefill_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim], sequences concatenated
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    cu_query_lens: torch.Tensor,  # [num_seqs + 1] int32, query token offsets into q
    context_lens: torch.Tensor,  # [num_seqs] int32, cached tokens including this step's
    scale: float,
    max_query_len: int,  # >= every query_len (sizes the grid; no device sync)
    k_scales: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32
    v_scales: torch.Tensor | None = None,  # of an int8 / fp8 cache (codes), else None
) -> torch.Tensor:
    """Causal attention with offset over the paged cache; returns [num_tokens, num_heads,
    head_dim] in q.dtype."""
    group = _check(q, k_cache, v_cache, block_tables, cu_query_lens, context_lens, max_query_len,
                   k_scales, v_scales)
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    num_seqs = context_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0 or max_query_len == 0:
        return out
    q = innermost_contiguous(q)
    block_tables = block_tables.contiguous()
    block_m = max(BLOCK_M, triton.next_power_of_2(group))
    block_q = block_m // group
    grid = (num_seqs, triton.cdiv(max_query_len, block_q), num_kv_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, cu_query_lens, context_lens, out,
        float(scale) * math.log2(math.e),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_SIZE=block_size,
        BLOCK_N=max(BLOCK_N, block_size),
        DOT_UPCAST=dot_upcast(q.dtype), DOT_PRECISION=dot_precision(q.dtype),
        **scale_args(k_scales, v_scales, context_lens),
        num_warps=4,
    )
    return out


def paged_prefill_attention_ref(q, k_cache, v_cache, block_tables, cu_query_lens, context_lens,
                                scale, max_query_len, k_scales=None, v_scales=None) -> torch.Tensor:
    """Plain-torch paged_prefill_attention, one sequence at a time."""
    group = _check(q, k_cache, v_cache, block_tables, cu_query_lens, context_lens, max_query_len,
                   k_scales, v_scales)
    if k_scales is not None:  # dequantized, rounded to q's dtype as the kernel rounds them
        k_cache = dequantize(bits(k_cache), k_scales, q.dtype)
        v_cache = dequantize(bits(v_cache), v_scales, q.dtype)
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    out = torch.zeros_like(q)
    bounds = cu_query_lens.tolist()
    for n, context_len in enumerate(context_lens.tolist()):
        start, end = bounds[n], bounds[n + 1]
        query_len = end - start
        if query_len == 0:
            continue
        pos = torch.arange(context_len, device=q.device)
        blocks = block_tables[n, pos // block_size].long()
        k = k_cache[blocks, pos % block_size].float()  # [context_len, num_kv_heads, head_dim]
        v = v_cache[blocks, pos % block_size].float()
        qn = q[start:end].float().view(query_len, num_kv_heads, group, head_dim)
        scores = torch.einsum("qkgd,lkd->kgql", qn, k) * scale
        q_pos = context_len - query_len + torch.arange(query_len, device=q.device)
        scores = scores.masked_fill(pos[None, :] > q_pos[:, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        o = torch.einsum("kgql,lkd->qkgd", probs, v)
        out[start:end] = o.reshape(query_len, num_heads, head_dim).to(q.dtype)
    return out
