"""8-bit KV cache: int8 or fp8 (e4m3) codes, one float32 scale per (token, KV head).

Why per (token, KV head), written with the token: a token's codes and scales depend on its own
K/V row only, so they are written once and never revisited (a per-block scale would have to
requantize the block's earlier tokens when a later one is larger), a block reads the same
whether it was filled by one prefill, chunk by chunk or by decode steps, and a prefix-cached
block is the same bits for every request that shares it. Across tokens K and V vary by an order
of magnitude (the first tokens' "attention sink" rows especially), which a per-head or
per-tensor scale would spend codes on; across one head's 64-128 dims they vary less. The scale
costs 4 bytes per head_dim codes (6% at head_dim 64).

Each scale is rounded up to a bfloat16 value (8 significant bits), so code x scale (at most 16
significant bits) is exact in float32 and a bf16 multiply rounds the product once: dequantizing
in bf16 gives the bits float32 arithmetic would, at the speed of a same-dtype multiply (the
mixed int8 x float32 -> bf16 product allocated a float32 temporary per call: 3x slower, one
thread).

The pools: codes ``[num_blocks, block_size, kv_heads, head_dim]`` (the float layout) and scales
``[num_blocks, block_size, kv_heads]`` float32 beside them; a layer's cache is then the tuple
(k_codes, v_codes, k_scales, v_scales) instead of (k, v).
"""

from __future__ import annotations

import torch

CODE_DTYPES = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}  # largest code magnitude
MIN_SCALE = 1e-12  # an all-zero row keeps a positive scale (codes 0, dequantized 0)
SCALE_DTYPE = torch.float32


def code_dtype(kv_cache_dtype: str) -> torch.dtype | None:
    """The codes' dtype of a kv_cache_dtype setting; None for auto (the activation dtype)."""
    return CODE_DTYPES.get(kv_cache_dtype)


def scale_shape(num_blocks: int, block_size: int, num_kv_heads: int) -> tuple[int, ...]:
    return (num_blocks, block_size, num_kv_heads)


def is_quantized(kv_cache: tuple) -> bool:
    """Whether a layer's cache tuple holds codes and scales (four tensors) rather than K and V."""
    return len(kv_cache) == 4


def bits(t: torch.Tensor) -> torch.Tensor:
    """t viewed as uint8 when fp8: CPU gathers and scatters do not take float8 tensors."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def round_up_to_bf16(scales: torch.Tensor) -> torch.Tensor:
    """Positive float32 values rounded up (in place) to the next bfloat16 value."""
    bits32 = scales.view(torch.int32)
    return bits32.add_(0xFFFF).bitwise_and_(-0x10000).view(torch.float32)


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., head_dim] -> codes [..., head_dim] in ``dtype``, scales [...] float32.

    scale = max |x| / QMAX rounded up to bf16, codes = x / scale (int8: rounded half to even).
    No clamp is needed: scale >= max |x| / QMAX, so |x / scale| rounds to at most QMAX.
    """
    amax = torch.linalg.vector_norm(x, ord=float("inf"), dim=-1, dtype=torch.float32)
    scales = round_up_to_bf16(amax.div_(QMAX[dtype]).clamp_min_(MIN_SCALE))
    y = torch.div(x, scales.unsqueeze(-1))  # float32 (x float32, bf16 or fp16)
    if dtype == torch.int8:
        return y.round_().to(torch.int8), scales
    return y.to(dtype), scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """codes [..., D] (int8, fp8, or fp8's uint8 bits), scales [...] -> codes * scale in dtype,
    the exact product rounded once to ``dtype``."""
    if codes.dtype == torch.uint8:
        codes = codes.view(torch.float8_e4m3fn)
    if out is None:
        out = torch.empty(codes.shape, dtype=dtype, device=codes.device)
    if dtype in (torch.bfloat16, torch.float32):  # codes and scales are exact in either
        return out.copy_(codes).mul_(scales.to(dtype).unsqueeze(-1))
    return torch.mul(codes.float(), scales.unsqueeze(-1), out=out)


def stacked(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """a and b as one [2, *a.shape] view when b lies in a's storage at a fixed distance after it
    with a's strides (the two halves of a workspace pair), else None. One elementwise op then
    serves K and V: at one sequence the step is mostly per-op overhead."""
    if (a.shape != b.shape or a.stride() != b.stride() or a.dtype != b.dtype
            or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()):
        return None
    step = b.storage_offset() - a.storage_offset()
    if step <= 0:
        return None
    return a.as_strided((2, *a.shape), (step, *a.stride()), a.storage_offset())


def write(kv_cache: tuple, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> tuple:
    """Quantize this step's k, v [T, KVH, D] into their slots; returns (k codes, k scales,
    v codes, v scales) of the step: ``dequantize`` them for what a later read of those slots
    gives, so the step can attend to exactly the cached values."""
    k_codes, v_codes, k_scales, v_scales = kv_cache
    num_blocks, block_size, kvh, d = k_codes.shape
    n = num_blocks * block_size
    codes, scales = quantize(torch.stack((k, v)), k_codes.dtype)  # [2, T, KVH, D], [2, T, KVH]
    # (index_copy_ along dim 1 of a [2, ...] view of the pools measured slower than two)
    for i, (code_pool, scale_pool) in enumerate(((k_codes, k_scales), (v_codes, v_scales))):
        bits(code_pool).view(n, kvh, d).index_copy_(0, slot_mapping, bits(codes[i]))
        scale_pool.view(n, kvh).index_copy_(0, slot_mapping, scales[i])
    return codes[0], scales[0], codes[1], scales[1]


def read_slots(kv_cache: tuple, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [len(slots), KVH, D] in ``dtype`` of the given flat slots."""
    k_codes, v_codes, k_scales, v_scales = kv_cache
    num_blocks, block_size, kvh, d = k_codes.shape
    n = num_blocks * block_size
    return tuple(dequantize(bits(c).view(n, kvh, d)[slots], s.view(n, kvh)[slots], dtype)
                 for c, s in ((k_codes, k_scales), (v_codes, v_scales)))


def gather_blocks(kv_cache: tuple, block_ids: torch.Tensor, dtype: torch.dtype,
                  workspace) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the given blocks, dequantized into the workspace: [n, block_size, KVH, D]."""
    k_codes, v_codes, k_scales, v_scales = kv_cache
    _, block_size, kvh, d = k_codes.shape
    shape = (block_ids.shape[0], block_size, kvh, d)
    k_bits, v_bits = workspace.pair(shape, bits(k_codes).dtype, "kv codes")
    k_s, v_s = workspace.pair(shape[:3], SCALE_DTYPE, "kv scales")
    k_buf, v_buf = workspace.pair(shape, dtype)
    for pool, scale_pool, code_buf, scale_buf in (
            (k_codes, k_scales, k_bits, k_s), (v_codes, v_scales, v_bits, v_s)):
        # (index_select along dim 1 of a [2, ...] view of the pools measured 1.4-7x slower)
        torch.index_select(bits(pool), 0, block_ids, out=code_buf)
        torch.index_select(scale_pool, 0, block_ids, out=scale_buf)
    views = [stacked(*pair) for pair in ((k_bits, v_bits), (k_s, v_s), (k_buf, v_buf))]
    if all(view is not None for view in views):  # the workspace pairs: one dequantize for both
        dequantize(*views[:2], dtype, out=views[2])
    else:
        dequantize(k_bits, k_s, dtype, out=k_buf)
        dequantize(v_bits, v_s, dtype, out=v_buf)
    return k_buf, v_buf
