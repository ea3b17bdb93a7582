import pytest
import torch

from engine.errors import InvalidParameterError
from engine.kernels.cache import reshape_and_cache, reshape_and_cache_ref

NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM = 6, 16, 3, 64
# Slots in shuffled blocks, mid-block offsets and two padding tokens.
SLOTS = [5 * 16 + 0, 2 * 16 + 15, -1, 0 * 16 + 7, 5 * 16 + 1, -1, 3 * 16 + 9]


def make_case(device, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    num_tokens = len(SLOTS)
    # key and value are views of one fused [tokens, (q + k + v) heads * head_dim] projection.
    qkv = torch.randn(num_tokens, (2 + 2 * NUM_KV_HEADS) * HEAD_DIM, generator=gen).to(dtype)
    _, key, value = qkv.split([2 * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM], 1)
    key = key.view(num_tokens, NUM_KV_HEADS, HEAD_DIM)  # token stride (2 + 2 * kv_heads) * dim
    value = value.view(num_tokens, NUM_KV_HEADS, HEAD_DIM)
    shape = (NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    slots = torch.tensor(SLOTS, dtype=torch.int64)
    return [t.to(device) for t in (key, value, k_cache, v_cache, slots)]


def test_reference_writes_each_token_at_its_slot_and_nothing_else(device):
    key, value, k_cache, v_cache, slots = make_case(device, torch.float32)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    reshape_and_cache_ref(key, value, k_cache, v_cache, slots)
    written = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, dtype=torch.bool)
    for token, slot in enumerate(SLOTS):
        if slot >= 0:
            block, offset = divmod(slot, BLOCK_SIZE)
            assert torch.equal(k_cache[block, offset], key[token])
            assert torch.equal(v_cache[block, offset], value[token])
            written[block, offset] = True
    untouched = ~written.to(device)
    assert torch.equal(k_cache[untouched], k_before[untouched])
    assert torch.equal(v_cache[untouched], v_before[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_kernel_writes_the_same_cache_as_reference_and_skips_padding(device, dtype):
    key, value, k_cache, v_cache, slots = make_case(device, dtype)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    reshape_and_cache_ref(key, value, k_expected, v_expected, slots)
    reshape_and_cache(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_expected)  # a copy: bit-exact, untouched slots included
    assert torch.equal(v_cache, v_expected)


def test_cache_write_rejects_int32_slot_mapping(device):
    key, value, k_cache, v_cache, slots = make_case(device, torch.float32)
    with pytest.raises(InvalidParameterError) as err:
        reshape_and_cache(key, value, k_cache, v_cache, slots.int())
    assert err.value.param == "slot_mapping"
