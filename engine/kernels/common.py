"""Argument checks and launch helpers shared by the kernel launchers (no Triton import here)."""

from __future__ import annotations

import os

import torch

from engine.errors import InvalidParameterError

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CODE_DTYPES = (torch.int8, torch.float8_e4m3fn)  # an 8-bit cache's, with scales beside it


def require(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidParameterError(param, message)


def is_interpreting() -> bool:
    """True when Triton kernels run under the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def dot_upcast(dtype: torch.dtype) -> bool:
    """Whether tl.dot operands must be widened to float32 before the product.

    Triton 3.9's interpreter multiplies the raw bit patterns of bfloat16 operands in tl.dot,
    so under the interpreter bfloat16 tiles are converted first; compiled kernels keep the
    native bfloat16 tensor-core path (the flag is a constexpr and compiles away).
    """
    return dtype == torch.bfloat16 and is_interpreting()


def dot_precision(dtype: torch.dtype) -> str:
    # float32 caches get exact products; TF32 would cost ~1e-3 relative error on GPU.
    return "ieee" if dtype == torch.float32 else "tf32"


def check_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, k_scales: torch.Tensor | None = None,
                   v_scales: torch.Tensor | None = None) -> tuple[int, int, int]:
    """Validate a layer's paged cache pair and return (block_size, num_kv_heads, head_dim).

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], innermost dim contiguous;
    float, or int8 / float8_e4m3fn codes with k_scales, v_scales [num_blocks, block_size,
    num_kv_heads] float32 (check_kv_scales).
    """
    if k_cache.dtype in CODE_DTYPES or k_scales is not None or v_scales is not None:
        check_kv_scales(k_cache, k_scales, v_scales)
    require(k_cache.dim() == 4, "k_cache",
            f"must be [num_blocks, block_size, num_kv_heads, head_dim], got {tuple(k_cache.shape)}")
    require(v_cache.shape == k_cache.shape, "v_cache",
            f"must have the shape of k_cache {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    require(v_cache.dtype == k_cache.dtype, "v_cache",
            f"must have the dtype of k_cache ({k_cache.dtype}), got {v_cache.dtype}")
    require(k_cache.dtype in FLOAT_DTYPES + CODE_DTYPES, "k_cache", f"unsupported dtype {k_cache.dtype}")
    require(k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "k_cache",
            "head_dim must be the contiguous innermost dimension")
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    require(block_size >= 8 and block_size & (block_size - 1) == 0, "k_cache",
            f"block_size must be a power of two >= 8, got {block_size}")
    return block_size, num_kv_heads, head_dim


def check_kv_scales(k_cache: torch.Tensor, k_scales: torch.Tensor | None,
                    v_scales: torch.Tensor | None) -> None:
    """An 8-bit cache comes with both scale pools, contiguous float32 [blocks, block_size, heads]."""
    require(k_cache.dtype in CODE_DTYPES, "k_scales",
            f"are for an int8 / float8_e4m3fn cache, not a {k_cache.dtype} one")
    for name, scales in (("k_scales", k_scales), ("v_scales", v_scales)):
        require(scales is not None, name, f"must be given with a {k_cache.dtype} cache")
        require(scales.shape == k_cache.shape[:3] and scales.dtype == torch.float32
                and scales.is_contiguous(), name,
                f"must be contiguous float32 {tuple(k_cache.shape[:3])}, got "
                f"{tuple(scales.shape)} {scales.dtype}")


def scale_args(k_scales: torch.Tensor | None, v_scales: torch.Tensor | None,
               placeholder: torch.Tensor) -> dict:
    """The attention kernels' scale arguments; without scales any tensor stands in for the
    (then unread) pointers."""
    if k_scales is None:
        return dict(k_scale_ptr=placeholder, v_scale_ptr=placeholder, stride_sb=0, stride_st=0,
                    QUANT=False)
    return dict(k_scale_ptr=k_scales, v_scale_ptr=v_scales, stride_sb=k_scales.stride(0),
                stride_st=k_scales.stride(1), QUANT=True)


def check_heads(q: torch.Tensor, num_kv_heads: int, head_dim: int) -> int:
    """Validate q's last two dims against the cache; return group = num_heads // num_kv_heads."""
    require(q.shape[-1] == head_dim, "q", f"head_dim {q.shape[-1]} != cache head_dim {head_dim}")
    num_heads = q.shape[-2]
    require(num_heads % num_kv_heads == 0, "q",
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    return num_heads // num_kv_heads


def innermost_contiguous(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last dim has stride 1 (views of a fused qkv qualify), else a copy."""
    return x if x.stride(-1) == 1 else x.contiguous()
