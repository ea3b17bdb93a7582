import pytest
import torch
import torch.nn.functional as F

from engine.errors import InvalidParameterError
from engine.kernels.attention_decode import paged_decode_attention
from engine.kernels.attention_prefill import paged_prefill_attention, paged_prefill_attention_ref

NUM_KV_HEADS = 2
# (query_lens, context_lens): context_lens count cached tokens including this step's queries.
SCENARIOS = {
    "plain_prefill": ([5, 17, 40], [5, 17, 40]),
    "prefix_cache_hit": ([16, 3], [48, 35]),  # two and two blocks from the prefix cache
    "chunked_prefill": ([17, 20], [40, 43]),  # later chunks starting mid-block
    "mixed_with_decode": ([1, 1, 12], [1, 17, 30]),
}


def make_case(paged_kv, device, query_lens, context_lens, group, dtype=torch.float32,
              head_dim=64, block_size=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    keys = [torch.randn(n, NUM_KV_HEADS, head_dim, generator=gen).to(dtype) for n in context_lens]
    values = [torch.randn(n, NUM_KV_HEADS, head_dim, generator=gen).to(dtype) for n in context_lens]
    k_cache, v_cache, block_tables = paged_kv(keys, values, block_size, device)
    q = torch.randn(sum(query_lens), NUM_KV_HEADS * group, head_dim, generator=gen).to(dtype)
    cu = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    args = (q.to(device), k_cache, v_cache, block_tables, cu.to(device), lens.to(device))
    return args, keys, values


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_prefill_reference_matches_masked_sdpa_on_contiguous_kv(paged_kv, device, scenario):
    query_lens, context_lens = SCENARIOS[scenario]
    group, scale = 3, 0.125
    args, keys, values = make_case(paged_kv, device, query_lens, context_lens, group)
    q, cu = args[0], args[4].tolist()
    out = paged_prefill_attention_ref(*args, scale, max(query_lens))
    for n, (k, v) in enumerate(zip(keys, values)):
        query_len, context_len = query_lens[n], context_lens[n]
        q_pos = torch.arange(context_len - query_len, context_len)
        mask = torch.arange(context_len)[None, :] <= q_pos[:, None]  # [query_len, context_len]
        qn = q[cu[n]:cu[n + 1]].transpose(0, 1)[None]  # [1, heads, query_len, head_dim]
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)[None].to(device)
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)[None].to(device)
        expected = F.scaled_dot_product_attention(qn, k, v, attn_mask=mask.to(device), scale=scale)
        torch.testing.assert_close(out[cu[n]:cu[n + 1]], expected[0].transpose(0, 1),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_prefill_kernel_matches_reference(paged_kv, device, assert_close, scenario, group):
    query_lens, context_lens = SCENARIOS[scenario]
    args, _, _ = make_case(paged_kv, device, query_lens, context_lens, group)
    assert_close(paged_prefill_attention(*args, 0.125, max(query_lens)),
                 paged_prefill_attention_ref(*args, 0.125, max(query_lens)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_kernel_matches_reference_in_half_precision(paged_kv, device, assert_close,
                                                            dtype):
    query_lens, context_lens = SCENARIOS["chunked_prefill"]
    args, _, _ = make_case(paged_kv, device, query_lens, context_lens, 3, dtype)
    assert_close(paged_prefill_attention(*args, 0.125, max(query_lens)),
                 paged_prefill_attention_ref(*args, 0.125, max(query_lens)))


def test_prefill_of_single_tokens_equals_decode(paged_kv, device):
    context_lens = [1, 15, 16, 17, 40]
    args, _, _ = make_case(paged_kv, device, [1] * len(context_lens), context_lens, group=3)
    q, k_cache, v_cache, block_tables, _, lens = args
    # A generous max_query_len only adds programs that exit at once.
    prefill = paged_prefill_attention(*args, 0.125, max_query_len=8)
    decode = paged_decode_attention(q, k_cache, v_cache, block_tables, lens, 0.125, num_splits=1)
    torch.testing.assert_close(prefill, decode, atol=1e-5, rtol=1e-5)


def test_prefill_with_head_dim_128_and_block_size_8(paged_kv, device):
    args, _, _ = make_case(paged_kv, device, [9, 4], [9, 21], group=3, head_dim=128, block_size=8)
    torch.testing.assert_close(paged_prefill_attention(*args, 0.09, 9),
                               paged_prefill_attention_ref(*args, 0.09, 9), atol=2e-5, rtol=2e-5)


def test_prefill_rejects_inconsistent_sequence_metadata(paged_kv, device):
    args, _, _ = make_case(paged_kv, device, [4, 2], [4, 6], group=1)
    q, k_cache, v_cache, block_tables, cu, lens = args
    with pytest.raises(InvalidParameterError) as err:
        paged_prefill_attention(q, k_cache, v_cache, block_tables, cu[:-1], lens, 0.1, 4)
    assert err.value.param == "cu_query_lens"
    with pytest.raises(InvalidParameterError) as err:
        paged_prefill_attention(q.half(), k_cache, v_cache, block_tables, cu, lens, 0.1, 4)
    assert err.value.param == "q"
