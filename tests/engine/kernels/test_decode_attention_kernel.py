import pytest
import torch
import torch.nn.functional as F

from engine.errors import InvalidParameterError
from engine.kernels.attention_decode import (
    choose_num_splits, paged_decode_attention, paged_decode_attention_ref,
)

RAGGED = [1, 15, 16, 17, 40]
NUM_KV_HEADS = 2


def make_case(paged_kv, device, context_lens, group, dtype=torch.float32, head_dim=64,
              block_size=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    keys = [torch.randn(n, NUM_KV_HEADS, head_dim, generator=gen).to(dtype) for n in context_lens]
    values = [torch.randn(n, NUM_KV_HEADS, head_dim, generator=gen).to(dtype) for n in context_lens]
    k_cache, v_cache, block_tables = paged_kv(keys, values, block_size, device)
    q = torch.randn(len(context_lens), NUM_KV_HEADS * group, head_dim, generator=gen).to(dtype)
    lens = torch.tensor(context_lens, dtype=torch.int32, device=device)
    return (q.to(device), k_cache, v_cache, block_tables, lens), keys, values


@pytest.mark.parametrize("group", [1, 3])
def test_decode_reference_matches_sdpa_on_contiguous_kv(paged_kv, device, group):
    args, keys, values = make_case(paged_kv, device, RAGGED, group)
    q, scale = args[0], 0.125
    out = paged_decode_attention_ref(*args, scale)
    for b, (k, v) in enumerate(zip(keys, values)):
        # [1, num_heads, context_len, head_dim]; query head h reads KV head h // group.
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)[None].to(device)
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)[None].to(device)
        expected = F.scaled_dot_product_attention(q[b][None, :, None], k, v, scale=scale)
        torch.testing.assert_close(out[b], expected[0, :, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 3])
def test_decode_kernel_matches_reference_on_ragged_contexts(paged_kv, device, assert_close,
                                                            group, dtype):
    args, _, _ = make_case(paged_kv, device, RAGGED, group, dtype)
    assert_close(paged_decode_attention(*args, 0.125, num_splits=1),
                 paged_decode_attention_ref(*args, 0.125))


@pytest.mark.slow
def test_decode_split_partitions_match_a_single_partition(paged_kv, device):
    args, _, _ = make_case(paged_kv, device, [1, 70, 200, 129], group=3)
    single = paged_decode_attention(*args, 0.1, num_splits=1)
    torch.testing.assert_close(single, paged_decode_attention_ref(*args, 0.1), atol=2e-5, rtol=2e-5)
    for num_splits in (3, 4):
        split = paged_decode_attention(*args, 0.1, num_splits=num_splits)
        torch.testing.assert_close(split, single, atol=1e-5, rtol=1e-5)


def test_decode_automatic_split_of_a_long_context_matches_reference(paged_kv, device):
    args, _, _ = make_case(paged_kv, device, [520], group=1)
    block_tables = args[3]
    assert choose_num_splits(1, NUM_KV_HEADS, block_tables.shape[1] * 16, num_sms=4) > 1
    torch.testing.assert_close(paged_decode_attention(*args, 0.125),
                               paged_decode_attention_ref(*args, 0.125), atol=2e-5, rtol=2e-5)


def test_num_splits_fill_the_gpu_for_few_long_sequences_only():
    few_long = choose_num_splits(1, 8, 8192, num_sms=132)
    assert few_long > 1 and 8 * few_long >= 132 and few_long & (few_long - 1) == 0
    assert choose_num_splits(64, 8, 8192, num_sms=132) == 1  # the batch already fills it
    assert choose_num_splits(1, 8, 128, num_sms=132) == 1  # too short to be worth a reduce


@pytest.mark.parametrize("num_splits", [1, 2])
def test_decode_of_an_empty_context_gives_zeros(paged_kv, device, num_splits):
    args, _, _ = make_case(paged_kv, device, [0, 5], group=3)
    out = paged_decode_attention(*args, 0.125, num_splits=num_splits)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    torch.testing.assert_close(out, paged_decode_attention_ref(*args, 0.125), atol=2e-5, rtol=2e-5)


def test_decode_with_head_dim_128_and_block_size_8(paged_kv, device):
    args, _, _ = make_case(paged_kv, device, [9, 33], group=3, head_dim=128, block_size=8)
    torch.testing.assert_close(paged_decode_attention(*args, 0.09, num_splits=2),
                               paged_decode_attention_ref(*args, 0.09), atol=2e-5, rtol=2e-5)


def test_decode_rejects_arguments_that_do_not_fit_the_cache(paged_kv, device):
    (q, k_cache, v_cache, tables, lens), _, _ = make_case(paged_kv, device, [3], group=1)
    with pytest.raises(InvalidParameterError) as err:
        paged_decode_attention(q[:, :1], k_cache, v_cache, tables, lens, 0.1)
    assert err.value.param == "q"
    with pytest.raises(InvalidParameterError) as err:
        paged_decode_attention(q, k_cache, v_cache, tables.long(), lens, 0.1)
    assert err.value.param == "block_tables"
    with pytest.raises(InvalidParameterError) as err:
        paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.1, num_splits=0)
    assert err.value.param == "num_splits"
