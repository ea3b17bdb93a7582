"""Sliding-window layers' blocks (engine/scheduling/window_blocks.py) and the pool split
(engine/memory/kv_pool_sizing.py window_split), without a model."""

import pytest

from engine.memory.kv_pool_sizing import window_split
from engine.sampling_params import SamplingParams
from engine.scheduling.sequence import Sequence
from engine.scheduling.window_blocks import NULL_BLOCK, WindowedBlockManager

BS, WINDOW = 4, 8  # a query reads its last 8 tokens: at most 3 blocks of 4


def make_seq(rid, tokens):
    return Sequence(rid, tokens, SamplingParams(max_tokens=64))


def run(bm, seq, num_new):
    """One step of ``seq``: allocate, compute, register, sample a token when it reaches the end."""
    assert bm.allocate(seq, num_new)
    seq.num_computed_tokens += num_new
    bm.cache_full_blocks(seq)
    if seq.num_computed_tokens == seq.num_tokens:
        seq.append_token(1000 + seq.num_tokens)


def held(seq):
    return [b for b in seq.window_table if b != NULL_BLOCK]


def test_window_blocks_return_to_the_pool_as_decoding_passes_the_window():
    bm = WindowedBlockManager(num_blocks=20, block_size=BS, num_window_blocks=6, window=WINDOW)
    seq = make_seq("a", list(range(5)))
    run(bm, seq, 5)
    most = 0
    for _ in range(40):  # decode to 45 tokens: 12 blocks, far past the window
        run(bm, seq, 1)
        most = max(most, len(held(seq)))
        assert len(seq.window_table) == len(seq.block_table)
    assert len(seq.block_table) == 12  # the full-attention group keeps every block
    assert most == 3 and len(held(seq)) <= 3  # the window group never more than a window's
    # 12 blocks of tokens in a pool of 5: the rest went back, and is free
    assert bm.num_free_window_blocks == bm.num_window_blocks - len(held(seq)) == 2
    # the blocks it holds are the last ones: the window of the next token (position 45)
    assert seq.window_table[:bm.first_window_block(45)] == [NULL_BLOCK] * bm.first_window_block(45)
    bm.free(seq)
    bm.check_all_free()


def test_more_sequences_fit_than_without_freeing():
    """Five 45-token sequences decoding side by side in 5 x 3 window blocks: without freeing the
    window layers would need 5 x 12."""
    bm = WindowedBlockManager(num_blocks=60, block_size=BS, num_window_blocks=16, window=WINDOW)
    seqs = [make_seq(str(i), [i] * 5) for i in range(5)]
    for seq in seqs:
        run(bm, seq, 5)
    for _ in range(40):
        for seq in seqs:
            run(bm, seq, 1)
    assert sum(len(s.block_table) for s in seqs) == 60
    assert sum(len(held(s)) for s in seqs) <= 15
    for seq in seqs:
        bm.free(seq)
    bm.check_all_free()


def test_a_step_that_cannot_get_window_blocks_changes_no_table():
    bm = WindowedBlockManager(num_blocks=20, block_size=BS, num_window_blocks=3, window=WINDOW)
    seq = make_seq("a", list(range(12)))  # a 12-token chunk writes 3 blocks; 2 are free
    assert not bm.allocate(seq, 12)
    assert seq.block_table == [] and seq.window_table == [] and bm.num_free_blocks == 20


def test_prefix_hit_lasts_while_its_last_window_is_resident():
    bm = WindowedBlockManager(num_blocks=40, block_size=BS, num_window_blocks=8, window=WINDOW)
    prefix = list(range(100, 124))  # 6 full blocks
    first = make_seq("a", prefix + [1])
    run(bm, first, 25)
    bm.free(first)
    second = make_seq("b", prefix + [2])
    hits = bm.get_computed_blocks(second)
    # the window group still caches blocks 4 and 5 (freed, not evicted): what position 24 reads
    assert len(hits) == 6 and bm.first_window_block(24) == 4
    assert bm.allocate(second, 1, hits)
    assert second.window_table[:4] == [NULL_BLOCK] * 4 and NULL_BLOCK not in second.window_table[4:]
    bm.free(second)
    # another tenant's long prompt takes every window block: the cached window is evicted
    other = make_seq("c", list(range(500, 528)))
    run(bm, other, 4)
    for _ in range(6):
        run(bm, other, 4)
    bm.free(other)
    third = make_seq("d", prefix + [3])
    hits = bm.get_computed_blocks(third)
    assert len(hits) < 6  # the full group's blocks are still cached, the window's are not
    assert bm.allocate(third, third.num_tokens - len(hits) * BS, hits)
    bm.free(third)
    bm.check_all_free()


def test_forked_samples_share_window_blocks():
    bm = WindowedBlockManager(num_blocks=20, block_size=BS, num_window_blocks=8, window=WINDOW)
    parent = make_seq("a", list(range(16)))
    run(bm, parent, 16)
    child = make_seq("b", list(range(16)))
    bm.share(parent, child, len(parent.block_table))
    assert child.window_table == parent.window_table
    bm.free(parent)
    bm.free(child)
    bm.check_all_free()


GEMMA_270M_LAYERS = [(i + 1) % 6 != 0 for i in range(18)]  # 15 window (512) / 3 full layers


def test_window_split_holds_more_long_sequences():
    """A context past the window: many times the sequences one pool of every layer holds, and
    a window for every seat."""
    split = window_split(18 * 4096, window_layers=GEMMA_270M_LAYERS, window=512, max_model_len=32768,
                         block_size=16, max_num_batched_tokens=512, max_num_seqs=32)
    assert split.num_full_layers == 3 and split.num_window_layers == 15
    assert 3 * split.num_full_blocks + 15 * split.num_window_blocks <= 18 * 4096
    assert split.num_seqs >= 4 * max(split.num_seqs_without_freeing(), 1)
    assert split.num_window_seqs >= 32


def fits(num_seqs: int, blocks: int, split) -> bool:
    """Whether ``num_seqs`` sequences of ``blocks`` blocks each fit the split's two groups."""
    window = min(blocks, split.window_blocks_per_seq)
    return (num_seqs * blocks <= split.num_full_blocks
            and num_seqs * window <= split.num_window_blocks - 1 - split.chunk_blocks)


@pytest.mark.parametrize("max_num_batched_tokens", [512, 2048])
@pytest.mark.parametrize("max_model_len", [1024, 8192, 32768])
@pytest.mark.parametrize("max_num_seqs", [1, 4, 32, 128, 256])
@pytest.mark.parametrize("num_blocks", [64, 512, 1024, 4096, 8570, 20000])
def test_window_split_never_holds_fewer_sequences_than_one_pool(num_blocks, max_num_seqs, max_model_len,
                                                                max_num_batched_tokens):
    """At every length, up to max_num_seqs sequences, the split holds at least as many as one
    pool of every layer of the same bytes. Sized for long contexts alone, 32 seats of 10-block
    chats over 1,024 blocks found 196 window blocks for their 320: 13 preemptions."""
    split = window_split(18 * num_blocks, window_layers=GEMMA_270M_LAYERS, window=512,
                         max_model_len=max_model_len, block_size=16,
                         max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)
    if split is None:
        return
    assert 3 * split.num_full_blocks + 15 * split.num_window_blocks <= 18 * num_blocks
    for blocks in range(1, split.blocks_per_seq + 1):
        one_pool = min(max_num_seqs, num_blocks // blocks)
        assert fits(one_pool, blocks, split), (blocks, one_pool, split)


def test_no_split_where_the_seats_windows_take_the_budget():
    """bench/peers.py's pool (1,024 blocks, llama.cpp's 16,384 tokens) for 32 seats: their windows
    are the whole budget, so one pool of every layer, and the 32 run side by side."""
    assert window_split(18 * 1024, window_layers=GEMMA_270M_LAYERS, window=512, max_model_len=32768,
                        block_size=16, max_num_batched_tokens=2048, max_num_seqs=32) is None


@pytest.mark.parametrize("budget, max_model_len", [(18 * 4096, 256), (72, 64)])
def test_no_split_where_it_would_hold_no_more(budget, max_model_len):
    """Contexts within the window gain nothing, and a pool of 4 blocks (validation's forward
    pass) cannot hold the window group's reserve: one pool of every layer then."""
    assert window_split(budget, window_layers=GEMMA_270M_LAYERS, window=512,
                        max_model_len=max_model_len, block_size=16,
                        max_num_batched_tokens=2048, max_num_seqs=4) is None
