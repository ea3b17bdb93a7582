"""Rotary position embedding, NeoX / Hugging Face rotate_half style, applied in place.

Dimension i of a head is rotated with dimension i + head_dim/2 by the angle of frequency i:
    x1' = x1 * cos - x2 * sin,   x2' = x2 * cos + x1 * sin
cos_sin_cache: [max_position, head_dim], the first head_dim/2 columns cos, the last sin.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.common import FLOAT_DTYPES, require


@triton.jit
def _rotate_heads(x_ptr, row_stride, token, cos, sin,
                  NUM_HEADS: tl.constexpr, HALF: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # x row: NUM_HEADS heads of 2 * HALF contiguous values; cos, sin: [1, BLOCK_HALF] float32.
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < NUM_HEADS) & (dims < HALF)
    first = x_ptr + token * row_stride + heads * (2 * HALF) + dims
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(first, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(first + HALF, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr, q_ptr, k_ptr, cos_sin_ptr,
    stride_q, stride_k, stride_cs,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_KVH: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    # One program per token: all its query and key heads share one cos/sin row.
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token)
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    cs_row = cos_sin_ptr + pos * stride_cs
    cos = tl.load(cs_row + dims, mask=dims < HALF, other=0.0).to(tl.float32)
    sin = tl.load(cs_row + HALF + dims, mask=dims < HALF, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, stride_q, token, cos, sin, NUM_HEADS, HALF, BLOCK_H, BLOCK_HALF)
    _rotate_heads(k_ptr, stride_k, token, cos, sin, NUM_KV_HEADS, HALF, BLOCK_KVH, BLOCK_HALF)


def _check(positions, q, k, cos_sin_cache, head_dim) -> None:
    require(head_dim > 0 and head_dim % 2 == 0, "head_dim", f"must be even, got {head_dim}")
    require(positions.dim() == 1 and positions.dtype == torch.int64, "positions",
            f"must be [num_tokens] int64, got {tuple(positions.shape)} {positions.dtype}")
    num_tokens = positions.shape[0]
    for name, x in (("q", q), ("k", k)):
        require(x.dim() == 2 and x.shape[0] == num_tokens and x.shape[1] % head_dim == 0, name,
                f"must be [{num_tokens}, heads * {head_dim}], got {tuple(x.shape)}")
        require(x.dtype in FLOAT_DTYPES, name, f"unsupported dtype {x.dtype}")
        require(x.stride(1) == 1, name, "rows must be contiguous (a view of fused qkv is fine)")
    require(cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == head_dim, "cos_sin_cache",
            f"must be [max_position, {head_dim}], got {tuple(cos_sin_cache.shape)}")


def rotary_embedding(
    positions: torch.Tensor,  # [num_tokens] int64
    q: torch.Tensor,  # [num_tokens, num_heads * head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim]
    head_dim: int,
) -> None:
    """Rotate q and k in place by each token's position."""
    _check(positions, q, k, cos_sin_cache, head_dim)
    num_tokens = positions.shape[0]
    if num_tokens == 0:
        return
    cos_sin_cache = cos_sin_cache.contiguous()
    num_heads, num_kv_heads = q.shape[1] // head_dim, k.shape[1] // head_dim
    _rotary_kernel[(num_tokens,)](
        positions, q, k, cos_sin_cache,
        q.stride(0), k.stride(0), cos_sin_cache.stride(0),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HALF=head_dim // 2,
        BLOCK_H=triton.next_power_of_2(num_heads), BLOCK_KVH=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
    )


def rotary_embedding_ref(positions, q, k, cos_sin_cache, head_dim) -> None:
    """Plain-torch rotary_embedding: same arguments, same in-place effect (float32 math)."""
    _check(positions, q, k, cos_sin_cache, head_dim)
    half = head_dim // 2
    cos_sin = cos_sin_cache[positions].float()
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]  # [num_tokens, 1, half]
    for x in (q, k):
        heads = x.view(x.shape[0], -1, head_dim)
        x1, x2 = heads[..., :half].float(), heads[..., half:].float()
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        heads.copy_(rotated.to(x.dtype))
