"""The CPU decode step's shortcuts give what the general path gives: a lone sequence whose blocks
are one run in the pool attends through a view, and the rotary tables computed once per step
rotate Q and K as Hugging Face does."""

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from engine.layers.attention_metadata import AttentionMetadata, DecodeGroup
from engine.layers.attention import LONG_DECODE_CONTEXT, PagedAttention, Workspace
from engine.layers.kv_access import pool_access
from engine.layers.rotary import RotaryEmbedding

H, KVH, D, BLOCK = 6, 2, 16, 4


def _decode(attn, q, k_cache, v_cache, blocks, context_len, run_start):
    num_blocks = -(-context_len // BLOCK)
    mask = (torch.arange(num_blocks * BLOCK) < context_len)[None, None, None, :]
    group = DecodeGroup(0, 1, torch.tensor(blocks[:num_blocks]), mask, run_start, context_len)
    meta = AttentionMetadata(slot_mapping=torch.tensor([-1]), num_prefill_tokens=0, num_decode_tokens=1,
                             decode_groups=[group], workspace=Workspace(torch.device("cpu")))
    return attn._decode(q, pool_access((k_cache, v_cache), q.dtype), group, meta.workspace)


def test_one_run_view_attends_like_the_gathered_blocks():
    torch.manual_seed(0)
    attn = PagedAttention(H, KVH, D)
    k_cache, v_cache = torch.randn(2, 16, BLOCK, KVH, D).unbind(0)
    q = torch.randn(1, H, D)
    for context_len in (1, 4, 5, 13):
        blocks = list(range(3, 3 + -(-context_len // BLOCK)))
        gathered = _decode(attn, q, k_cache, v_cache, blocks, context_len, None)
        viewed = _decode(attn, q, k_cache, v_cache, blocks, context_len, blocks[0])
        # the same bits: whether a sequence's blocks happen to be consecutive (prefix-cache hits,
        # the allocation order) never changes its answer
        assert torch.equal(viewed, gathered)
        # the same K/V in scattered blocks (as after a prefix-cache hit), gathered: the same bits
        scattered = [15, 0, 9, 6][:len(blocks)]
        k2, v2 = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
        k2[scattered], v2[scattered] = k_cache[blocks], v_cache[blocks]
        assert torch.equal(_decode(attn, q, k2, v2, scattered, context_len, None), viewed)


def test_bf16_lone_sequence_attends_like_float32_gathered_blocks_short_and_long():
    """bf16, a lone sequence: gathered blocks and masked attention on short contexts, the
    all-heads GEMM (_decode_long_run) from LONG_DECODE_CONTEXT tokens, over a view of its run of
    blocks or its gathered blocks alike; within bf16 rounding of the float32 gathered path."""
    torch.manual_seed(0)
    attn = PagedAttention(H, KVH, D)
    k_cache, v_cache = torch.randn(2, 300, BLOCK, KVH, D).unbind(0)
    q = torch.randn(1, H, D)
    for context_len in (1, 13, LONG_DECODE_CONTEXT - 1, LONG_DECODE_CONTEXT, 1001):
        blocks = list(range(7, 7 + -(-context_len // BLOCK)))
        reference = _decode(attn, q, k_cache, v_cache, blocks, context_len, None)
        viewed, gathered = (_decode(attn, q.bfloat16(), k_cache.bfloat16(), v_cache.bfloat16(),
                                    blocks, context_len, run_start) for run_start in (blocks[0], None))
        assert viewed.dtype == torch.bfloat16
        torch.testing.assert_close(viewed.float(), reference, rtol=0.02, atol=0.02)
        # the same bits with or without a run: a prefix-cache hit never changes a greedy answer
        assert torch.equal(viewed, gathered)


def test_rotary_tables_rotate_q_and_k_bit_identically_to_transformers():
    torch.manual_seed(0)
    rope = RotaryEmbedding(D, 64, 10000.0, None)
    positions = torch.tensor([0, 5, 63])
    q, k = torch.randn(3, H, D), torch.randn(3, KVH, D)
    rotated = rope.rotate(torch.cat([q, k], dim=1), rope.prepare(positions, torch.float32))
    table = rope.cos_sin_cache[positions]  # [T, D]: cos, then sin of the D / 2 frequencies
    cos = torch.cat([table[:, :D // 2]] * 2, dim=-1)[None]  # [1, T, D]
    sin = torch.cat([table[:, D // 2:]] * 2, dim=-1)[None]  # the plain sin
    ref_q, ref_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    assert torch.equal(rotated[:, :H], ref_q[0].transpose(0, 1))
    assert torch.equal(rotated[:, H:], ref_k[0].transpose(0, 1))
