"""The KV pool's size (engine/memory/kv_pool_sizing.py), the one formula the runner allocates by and the
memory estimate predicts by: the settings' rules, without a model or torch."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.memory.kv_pool_sizing import kv_bytes_per_token, max_blocks_per_seq, num_kv_blocks


def _blocks(device_type="cpu", device_budget=lambda: None, **settings) -> int:
    config = EngineConfig(model="unchecked", block_size=16, max_num_seqs=4, **settings)
    return num_kv_blocks(config, device_type=device_type, max_model_len=100, bytes_per_block=1000,
                         device_budget=device_budget)


def test_a_token_takes_k_and_v_in_every_layer_of_each_kv_head():
    # 2 x 30 layers x 3 heads x 64 dims: 2 bytes each (bf16), or a code + a float32 scale per row
    assert kv_bytes_per_token("auto", num_layers=30, num_kv_heads=3, head_dim=64, elem=2) == 23040
    assert kv_bytes_per_token("bfloat16", num_layers=30, num_kv_heads=3, head_dim=64, elem=4) == 23040
    assert kv_bytes_per_token("int8", num_layers=30, num_kv_heads=3, head_dim=64, elem=2) == 180 * 68


def test_num_kv_blocks_overrides_every_budget():
    assert _blocks(num_kv_blocks=3, kv_cache_memory=1) == 3
    assert _blocks("cuda", device_budget=lambda: pytest.fail("profiled"), num_kv_blocks=3) == 3


def test_the_pool_never_exceeds_every_running_sequence_at_full_length():
    assert max_blocks_per_seq(100, 16) == 7
    assert _blocks(kv_cache_memory=10**9) == 4 * 7
    assert _blocks("cuda", device_budget=lambda: None) == 4 * 7  # no limit known: the ceiling


def test_the_budget_holds_whole_blocks_and_refuses_one_that_holds_none():
    assert _blocks(kv_cache_memory=5999) == 5
    assert _blocks("cuda", device_budget=lambda: 12_500) == 12
    with pytest.raises(MemoryError, match=r"the KV budget \(999 bytes\) does not hold one block"):
        _blocks(kv_cache_memory=999)
