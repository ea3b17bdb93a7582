"""Write this step's keys and values into the paged KV cache (float, or 8-bit codes + scales).

An 8-bit cache (engine/kernels/kv_quant.py) stores int8 or fp8 e4m3 codes and one float32
scale per (token, KV head), scale = max |row| / QMAX rounded up to a bfloat16 value; int8 codes round half away from zero here
(torch.round, the reference's, rounds half to even: a tie may land one code apart).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.common import check_kv_cache, check_kv_scales, innermost_contiguous, require
from engine.kernels import kv_quant


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, k_scale_ptr, v_scale_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kct, stride_kch,
    stride_vcb, stride_vct, stride_vch,
    stride_sb, stride_st,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr, IS_INT8: tl.constexpr, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr,
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
    if QUANT:  # codes and a scale per head; both scale pools share one layout
        k, k_scale = _quantize_rows(k, QMAX, MIN_SCALE, IS_INT8)
        v, v_scale = _quantize_rows(v, QMAX, MIN_SCALE, IS_INT8)
        scale_off = block * stride_sb + offset * stride_st + heads
        tl.store(k_scale_ptr + scale_off, k_scale, mask=heads < NUM_KV_HEADS)
        tl.store(v_scale_ptr + scale_off, v_scale, mask=heads < NUM_KV_HEADS)
    tl.store(k_dst + heads[:, None] * stride_kch + dims[None, :],
             k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst + heads[:, None] * stride_vch + dims[None, :],
             v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quantize_rows(x, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr, IS_INT8: tl.constexpr):
    # x: [BLOCK_H, BLOCK_D] (padding 0) -> codes (float32 values, cast by the store) and scales.
    x = x.to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=1) / QMAX, MIN_SCALE)  # [BLOCK_H]
    # rounded up to a bfloat16 value, as kv_quant.quantize does
    scale = ((scale.to(tl.int32, bitcast=True) + 0xFFFF) & -0x10000).to(tl.float32, bitcast=True)
    y = x / scale[:, None]
    if IS_INT8:  # round half away from zero; the int8 store truncates
        y = tl.minimum(tl.maximum(tl.where(y >= 0, y + 0.5, y - 0.5), -127.0), 127.0)
    else:
        y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
    return y, scale


def _check(key, value, k_cache, v_cache, slot_mapping, k_scales=None, v_scales=None) -> None:
    _, num_kv_heads, head_dim = check_kv_cache(k_cache, v_cache, k_scales, v_scales)
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
    k_scales: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32
    v_scales: torch.Tensor | None = None,  # of an int8 / fp8 cache, else None
) -> None:
    """Store each token's key/value at its slot in place; tokens with slot -1 are not written.
    An int8 / float8_e4m3fn cache gets codes, and each (token, head) its scale in the scales."""
    _check(key, value, k_cache, v_cache, slot_mapping, k_scales, v_scales)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    key = innermost_contiguous(key)
    value = innermost_contiguous(value)
    quant = k_scales is not None
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        k_scales if quant else slot_mapping, v_scales if quant else slot_mapping,  # unused if not
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        k_scales.stride(0) if quant else 0, k_scales.stride(1) if quant else 0,
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        QUANT=quant, IS_INT8=k_cache.dtype == torch.int8,
        QMAX=kv_quant.QMAX.get(k_cache.dtype, 1.0), MIN_SCALE=kv_quant.MIN_SCALE,
    )


def reshape_and_cache_ref(key, value, k_cache, v_cache, slot_mapping, k_scales=None,
                          v_scales=None) -> None:
    """Plain-torch reshape_and_cache: same arguments, same in-place effect."""
    _check(key, value, k_cache, v_cache, slot_mapping, k_scales, v_scales)
    block_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    if k_scales is not None:
        for x, codes, scales in ((key, k_cache, k_scales), (value, v_cache, v_scales)):
            c, s = kv_quant.quantize(x[valid], codes.dtype)
            kv_quant.bits(codes)[slots // block_size, slots % block_size] = kv_quant.bits(c)
            scales[slots // block_size, slots % block_size] = s
        return
    k_cache[slots // block_size, slots % block_size] = key[valid].to(k_cache.dtype)
    v_cache[slots // block_size, slots % block_size] = value[valid].to(v_cache.dtype)
