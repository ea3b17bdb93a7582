"""One tile of paged attention with an online softmax, shared by the decode and prefill kernels.

An 8-bit cache (QUANT) is dequantized as it loads: code x the float32 scale of its (token, KV
head), rounded to q's dtype, then the same products. The caller keeps the running max ``m`` (log2 units), sum ``l`` and accumulator ``acc`` of its
rows; each call loads BLOCK_N context positions of one sequence's K/V through its block table.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_tile(q, m, l, acc, k_cache_ptr, v_cache_ptr, table, kv_head, tile, kv_end, q_pos,
                 dims, dim_mask, qk_scale,
                 stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                 BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                 MASK_TAIL: tl.constexpr, DOT_UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 k_scale_ptr, v_scale_ptr, stride_sb, stride_st, QUANT: tl.constexpr):
    # One online-softmax step over context positions [tile, tile + BLOCK_N) of one sequence.
    # CAUSAL: row r sees positions <= q_pos[r] (and < kv_end); MASK_TAIL: positions >= kv_end
    # are masked (a last, partial tile); neither: every position of the tile is visible.
    pos = tile + tl.arange(0, BLOCK_N)
    pos_mask = pos < kv_end
    blocks = tl.load(table + pos // BLOCK_SIZE, mask=pos_mask, other=0).to(tl.int64)
    in_block = pos % BLOCK_SIZE
    kv_mask = pos_mask[:, None] & dim_mask[None, :]
    k = tl.load(k_cache_ptr + blocks[:, None] * stride_kb + in_block[:, None] * stride_kt
                + kv_head * stride_kh + dims[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + blocks[:, None] * stride_vb + in_block[:, None] * stride_vt
                + kv_head * stride_vh + dims[None, :], mask=kv_mask, other=0.0)
    if QUANT:  # scales [blocks, block_size, kv_heads], one per position of the tile
        scale_off = blocks * stride_sb + in_block * stride_st + kv_head
        k_scale = tl.load(k_scale_ptr + scale_off, mask=pos_mask, other=0.0)
        v_scale = tl.load(v_scale_ptr + scale_off, mask=pos_mask, other=0.0)
        k = (k.to(tl.float32) * k_scale[:, None]).to(q.dtype)
        v = (v.to(tl.float32) * v_scale[:, None]).to(q.dtype)
    elif DOT_UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [rows, BLOCK_N]
    if CAUSAL:
        s = tl.where((pos[None, :] <= q_pos[:, None]) & pos_mask[None, :], s, float("-inf"))
    elif MASK_TAIL:
        s = tl.where(pos_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    if QUANT:
        p = p.to(q.dtype)
    else:
        p = p.to(v_cache_ptr.dtype.element_ty)  # same rounding as the native half-precision dot
        if DOT_UPCAST:
            p = p.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
    return m_new, l, acc
