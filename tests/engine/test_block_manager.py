"""Block accounting and prefix caching, without a model."""

import pytest

from engine.scheduling.block_manager import BlockManager
from engine.sampling_params import SamplingParams
from engine.scheduling.sequence import Sequence


def make_seq(rid, tokens):
    return Sequence(rid, tokens, SamplingParams(max_tokens=8))


def test_allocate_takes_exactly_the_blocks_needed_and_free_returns_them():
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = make_seq("a", list(range(9)))
    assert bm.allocate(seq, 9)
    assert len(seq.block_table) == 3
    assert bm.num_free_blocks == 7
    bm.free(seq)
    bm.check_all_free()


def test_allocate_refuses_without_partial_allocation_when_pool_is_short():
    bm = BlockManager(num_blocks=2, block_size=4)
    seq = make_seq("a", list(range(12)))
    assert not bm.allocate(seq, 12)
    assert seq.block_table == []
    assert bm.num_free_blocks == 2


def test_prefix_cache_reuses_full_blocks_of_a_shared_prefix():
    bm = BlockManager(num_blocks=10, block_size=4)
    first = make_seq("a", list(range(10)))
    assert bm.allocate(first, 10)
    first.num_computed_tokens = 10
    bm.cache_full_blocks(first)  # two full blocks registered
    second = make_seq("b", list(range(8)) + [100, 101, 102])
    hits = bm.get_computed_blocks(second)
    assert hits == first.block_table[:2]
    assert bm.allocate(second, 3, hits)
    assert second.block_table[:2] == first.block_table[:2]
    assert bm.blocks[hits[0]].ref_count == 2
    bm.free(first)
    bm.free(second)
    bm.check_all_free()


def test_prefix_cache_never_serves_the_last_prompt_token():
    bm = BlockManager(num_blocks=10, block_size=4)
    first = make_seq("a", list(range(8)))
    bm.allocate(first, 8)
    first.num_computed_tokens = 8
    bm.cache_full_blocks(first)
    same = make_seq("b", list(range(8)))
    # Both blocks are cached, but the second holds the last token, whose logits we need.
    assert len(bm.get_computed_blocks(same)) == 1


def test_chained_hash_distinguishes_same_block_after_different_prefix():
    bm = BlockManager(num_blocks=10, block_size=2)
    a = make_seq("a", [1, 2, 3, 4, 5])
    bm.allocate(a, 5)
    a.num_computed_tokens = 5
    bm.cache_full_blocks(a)
    b = make_seq("b", [9, 9, 3, 4, 5])  # block [3, 4] equal, its parent differs
    assert bm.get_computed_blocks(b) == []


def test_freed_cached_blocks_survive_until_evicted_least_recently_used():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_seq("a", [1, 2, 3, 4, 5])
    bm.allocate(a, 5)
    a.num_computed_tokens = 5
    bm.cache_full_blocks(a)
    bm.free(a)
    bm.check_all_free()
    again = make_seq("b", [1, 2, 3, 4, 7])
    assert len(bm.get_computed_blocks(again)) == 2  # still cached after free
    # Fill the pool with unrelated tokens: the cached blocks must be evicted to make room.
    other = make_seq("c", [50, 51, 52, 53, 54, 55, 56, 57])
    assert bm.allocate(other, 8)
    assert bm.get_computed_blocks(again) == []
    bm.free(other)
    bm.check_all_free()


def test_unhashed_free_blocks_are_reused_before_cached_ones():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_seq("a", [1, 2, 3])
    bm.allocate(a, 3)
    a.num_computed_tokens = 3
    bm.cache_full_blocks(a)  # block 0 cached, block 1 partial
    bm.free(a)
    b = make_seq("b", [8, 9])
    bm.allocate(b, 2)
    assert len(bm.get_computed_blocks(make_seq("c", [1, 2, 3]))) == 1  # cached block kept


def test_double_free_is_detected():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_seq("a", [1, 2, 3])
    bm.allocate(a, 3)
    table = list(a.block_table)
    bm.free(a)
    a.block_table = table
    with pytest.raises(AssertionError):
        bm.free(a)
