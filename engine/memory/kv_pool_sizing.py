"""How large the KV pool is: the bytes one token takes in it, and the blocks a budget holds.

One formula for the runner, which allocates the pool, and for engine/memory/estimate.py, which predicts
it before anything loads; imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.kernels.cpu import cpu_info
from engine.config import CPU_KV_CACHE_MEMORY_FRACTION, EngineConfig

KV_SCALE_BYTES = 4  # the float32 scale of one token's 8-bit K (or V) row of one KV head


def kv_bytes_per_token_head(kv_cache_dtype: str, head_dim: int, elem: int) -> int:
    """Bytes of one token's K (or V) row of one KV head in the pool: head_dim elements of the
    activation dtype (``elem`` bytes; kv_cache_dtype bfloat16: 2 bytes), or 8-bit codes and a
    float32 scale (kv_cache_dtype int8 / fp8_e4m3, engine/kernels/kv_quant.py)."""
    if kv_cache_dtype == "auto":
        return head_dim * elem
    if kv_cache_dtype == "bfloat16":
        return head_dim * 2
    return head_dim + KV_SCALE_BYTES


def kv_bytes_per_token(kv_cache_dtype: str, *, num_layers: int, num_kv_heads: int, head_dim: int,
                       elem: int) -> int:
    """One token's K and V in every layer, over ``num_kv_heads`` (one tensor-parallel rank's)."""
    return 2 * num_layers * num_kv_heads * kv_bytes_per_token_head(kv_cache_dtype, head_dim, elem)


def max_blocks_per_seq(max_model_len: int, block_size: int) -> int:
    return -(-max_model_len // block_size)


def num_kv_blocks(config: EngineConfig, *, device_type: str, max_model_len: int,
                  bytes_per_block: int, device_budget: Callable[[], int | None]) -> int:
    """num_kv_blocks when set; else the blocks of ``bytes_per_block`` that the budget holds:
    kv_cache_memory, or on a GPU ``device_budget()`` (None: no limit known), or on a CPU a share
    of the machine's memory; never more than every running sequence at full length could use.
    MemoryError when the budget does not hold one block."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    ceiling = config.max_num_seqs * max_blocks_per_seq(max_model_len, config.block_size)
    if config.kv_cache_memory is not None:
        budget = config.kv_cache_memory
    elif device_type != "cpu":
        budget = device_budget()
        if budget is None:
            return ceiling
    else:  # what the configuration needs (the ceiling), within a share of memory
        budget = int(CPU_KV_CACHE_MEMORY_FRACTION * cpu_info.total_memory_bytes()) or 1 << 30
    num = min(budget // bytes_per_block, ceiling)
    if num < 1:
        raise MemoryError(f"the KV budget ({budget} bytes) does not hold one block "
                          f"({bytes_per_block} bytes)")
    return int(num)
