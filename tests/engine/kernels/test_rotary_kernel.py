import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from engine.errors import InvalidParameterError
from engine.kernels.rotary import rotary_embedding, rotary_embedding_ref

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, MAX_POSITION = 6, 2, 64, 300


def cos_sin_cache(theta=100000.0):
    inv_freq = 1.0 / theta ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    freqs = torch.outer(torch.arange(MAX_POSITION, dtype=torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)  # [MAX_POSITION, HEAD_DIM]


def make_qkv(device, dtype, num_tokens=7, seed=0):
    """A fused projection [tokens, (heads + 2 kv_heads) * head_dim] and its q, k, v views."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(num_tokens, (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, generator=gen)
    qkv = qkv.to(dtype).to(device)
    q, k, v = qkv.split([NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM], 1)
    positions = torch.tensor([0, 1, 17, 5, 299, 128, 64][:num_tokens], device=device)
    return qkv, q, k, v, positions


def test_reference_matches_hf_apply_rotary_pos_emb(device):
    _, q, k, _, positions = make_qkv(device, torch.float32)
    cache = cos_sin_cache().to(device)
    half = cache[positions]  # [tokens, HEAD_DIM / 2] cos then sin
    cos = torch.cat((half[:, :HEAD_DIM // 2],) * 2, dim=-1)
    sin = torch.cat((half[:, HEAD_DIM // 2:],) * 2, dim=-1)
    # HF layout with unsqueeze_dim=1: [tokens, heads, head_dim] against cos [tokens, 1, head_dim].
    q_hf, k_hf = apply_rotary_pos_emb(q.reshape(len(positions), NUM_HEADS, HEAD_DIM),
                                      k.reshape(len(positions), NUM_KV_HEADS, HEAD_DIM), cos, sin)
    q, k = q.clone(), k.clone()
    rotary_embedding_ref(positions, q, k, cache, HEAD_DIM)
    torch.testing.assert_close(q, q_hf.flatten(1), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k, k_hf.flatten(1), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rotary_kernel_rotates_q_and_k_views_in_place_like_reference(device, assert_close, dtype):
    qkv, q, k, v, positions = make_qkv(device, dtype)
    expected_qkv, eq, ek, _, _ = make_qkv(device, dtype)
    cache = cos_sin_cache().to(device)
    v_before = v.clone()
    rotary_embedding_ref(positions, eq, ek, cache, HEAD_DIM)
    rotary_embedding(positions, q, k, cache, HEAD_DIM)
    assert_close(q, eq)
    assert_close(k, ek)
    assert torch.equal(v, v_before)  # the value heads sharing the rows stay as they were
    assert not torch.equal(q, make_qkv(device, dtype)[1])  # something was rotated


def test_rotary_rejects_a_cache_of_another_head_dim(device):
    _, q, k, _, positions = make_qkv(device, torch.float32)
    with pytest.raises(InvalidParameterError) as err:
        rotary_embedding(positions, q, k, cos_sin_cache()[:, :32].to(device), HEAD_DIM)
    assert err.value.param == "cos_sin_cache"
