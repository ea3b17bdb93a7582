"""The KV pool's tensors: one allocation per layer group (every layer; or, for a model whose
sliding-window layers keep blocks of their own, engine/memory/kv_pool_sizing.WindowSplit, the
full-attention layers' and the window layers'), and each layer's cache tuple as views of it."""

from __future__ import annotations

import torch

from engine.kernels import kv_quant
from engine.layers.attention import kv_cache_shape
from engine.memory.gpu_memory import lazy_zeros


def allocate_kv_pool(group_of_layer: list[int], num_blocks: list[int], *, block_size: int,
                     num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                     code_dtype: torch.dtype | None, device: torch.device):
    """group_of_layer: each layer's group (0: the first, full-attention group); num_blocks: each
    group's blocks. Per group one codes (or K/V) pool, [2, layers, *kv_cache_shape], and for an
    8-bit cache (``code_dtype``) one for its scales, [2, layers, *kv_quant.scale_shape].

    Returns (group 0's pool, its scales or None, each layer's cache tuple: (K, V), or
    (K codes, V codes, K scales, V scales))."""
    caches: dict[int, tuple] = {}
    first = None
    for group, blocks in enumerate(num_blocks):
        layers = [i for i, g in enumerate(group_of_layer) if g == group]
        shape = kv_cache_shape(blocks, block_size, num_kv_heads, head_dim)
        pool = lazy_zeros((2, len(layers), *shape), code_dtype or dtype, device)
        scales = None
        if code_dtype is not None:
            scales = lazy_zeros((2, len(layers), *kv_quant.scale_shape(blocks, block_size, num_kv_heads)),
                                kv_quant.SCALE_DTYPE, device)
        for i, layer in enumerate(layers):
            caches[layer] = ((pool[0, i], pool[1, i]) if scales is None
                             else (pool[0, i], pool[1, i], scales[0, i], scales[1, i]))
        first = first or (pool, scales)
    return first[0], first[1], [caches[i] for i in range(len(group_of_layer))]
