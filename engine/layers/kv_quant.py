"""8-bit KV cache: int8 or fp8 (e4m3) codes, one float32 scale per (token, KV head).

Why per (token, KV head), written with the token: a token's codes and scales depend on its own
K/V row only, so they are written once and never revisited (a per-block scale would have to
requantize the block's earlier tokens when a later one is larger), a block reads the same
whether it was filled by one prefill, chunk by chunk or by decode steps, and a prefix-cached
block is the same bits for every request that shares it. Across tokens K and V vary by an order
of magnitude (the first tokens' "attention sink" rows especially), which a per-head or
per-tensor scale would spend codes on; across one head's 64-128 dims they vary less. The scale
costs 4 bytes per head_dim codes (6% at head_dim 64).

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


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., head_dim] -> codes [..., head_dim] in ``dtype``, scales [...] float32.

    scale = max |x| / QMAX, codes = x / scale (int8: rounded half to even, so |code| <= 127).
    """
    xf = x.float()
    scales = xf.abs().amax(dim=-1).div_(QMAX[dtype]).clamp_min_(MIN_SCALE)
    y = xf.div_(scales.unsqueeze(-1)) if xf is not x else xf / scales.unsqueeze(-1)
    if dtype == torch.int8:
        return y.round_().clamp_(-127, 127).to(torch.int8), scales
    return y.clamp_(-448.0, 448.0).to(dtype), scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """codes [..., D] (int8, fp8, or fp8's uint8 bits), scales [...] -> codes * scale in dtype.

    The product is taken in float32 and rounded once to ``dtype``."""
    if codes.dtype == torch.uint8:
        codes = codes.view(torch.float8_e4m3fn)
    if codes.dtype == torch.float8_e4m3fn:
        codes = codes.to(torch.float32)  # exact; CPU multiplies no float8
    if out is None:
        return torch.mul(codes, scales.unsqueeze(-1)).to(dtype)
    return torch.mul(codes, scales.unsqueeze(-1), out=out)


def write(kv_cache: tuple, k: torch.Tensor, v: torch.Tensor,
          slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize this step's k, v [T, KVH, D] into their slots; returns them dequantized (what
    a later read of those slots gives, so the step attends to exactly the cached values)."""
    k_codes, v_codes, k_scales, v_scales = kv_cache
    num_blocks, block_size, kvh, d = k_codes.shape
    out = []
    for x, codes_pool, scale_pool in ((k, k_codes, k_scales), (v, v_codes, v_scales)):
        codes, scales = quantize(x, codes_pool.dtype)
        bits(codes_pool).view(num_blocks * block_size, kvh, d).index_copy_(0, slot_mapping, bits(codes))
        scale_pool.view(num_blocks * block_size, kvh).index_copy_(0, slot_mapping, scales)
        out.append(dequantize(codes, scales, x.dtype))
    return out[0], out[1]


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
    for pool, scale_pool, code_buf, scale_buf, buf in (
            (k_codes, k_scales, k_bits, k_s, k_buf), (v_codes, v_scales, v_bits, v_s, v_buf)):
        torch.index_select(bits(pool), 0, block_ids, out=code_buf)
        torch.index_select(scale_pool, 0, block_ids, out=scale_buf)
        dequantize(code_buf, scale_buf, dtype, out=buf)
    return k_buf, v_buf
