"""Write this step's keys and values into the paged KV cache."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.common import check_kv_cache, innermost_contiguous, require


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kct, stride_kch,
    stride_vcb, stride_vct, stride_vch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per token: its [num_kv_heads, head_dim] key and value rows.
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:  # padding token
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)

    k = tl.load(key_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :],
                mask=mask)
    v = tl.load(value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :],
                mask=mask)
    k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kct
    v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vct
    tl.store(k_dst + heads[:, None] * stride_kch + dims[None, :],
             k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst + heads[:, None] * stride_vch + dims[None, :],
             v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _check(key, value, k_cache, v_cache, slot_mapping) -> None:
    _, num_kv_heads, head_dim = check_kv_cache(k_cache, v_cache)
    require(key.dim() == 3 and key.shape[1:] == (num_kv_heads, head_dim), "key",
            f"must be [num_tokens, {num_kv_heads}, {head_dim}], got {tuple(key.shape)}")
    require(value.shape == key.shape, "value",
            f"must have the shape of key {tuple(key.shape)}, got {tuple(value.shape)}")
    require(slot_mapping.shape == (key.shape[0],), "slot_mapping",
            f"must be [{key.shape[0]}], got {tuple(slot_mapping.shape)}")
    require(slot_mapping.dtype == torch.int64, "slot_mapping",
            f"must be int64, got {slot_mapping.dtype}")


def reshape_and_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64, block_id * block_size + offset; -1 skips
) -> None:
    """Store each token's key/value at its slot in place; tokens with slot -1 are not written."""
    _check(key, value, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    key = innermost_contiguous(key)
    value = innermost_contiguous(value)
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )


def reshape_and_cache_ref(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Plain-torch reshape_and_cache: same arguments, same in-place effect."""
    _check(key, value, k_cache, v_cache, slot_mapping)
    block_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    k_cache[slots // block_size, slots % block_size] = key[valid].to(k_cache.dtype)
    v_cache[slots // block_size, slots % block_size] = value[valid].to(v_cache.dtype)
