"""The decode step's trimmed ops round as Hugging Face rounds in bfloat16 (RMSNorm with the
residual added in place, rotary tables looked up once per step, SiLU * up into SiLU's output),
the attention mask converted once per step attends as the bool mask does, and one decode step
of the real engine stays within a per-layer op budget (bench/decode_profile.py counts them)."""

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from engine import LLM, SamplingParams
from engine.layers.attention_metadata import DecodeGroup
from engine.layers.activation import SiluAndMul
from engine.layers.layernorm import RMSNorm
from engine.layers.rotary import RotaryEmbedding

BF16 = torch.bfloat16
BUDGET = 185  # aten ops in one decoder layer of a decode step


def test_bf16_norm_rotary_and_activation_give_transformers_bits():
    torch.manual_seed(0)
    x, residual = (torch.randn(5, 64) * 3).to(BF16), torch.randn(5, 64).to(BF16)
    ours, theirs = RMSNorm(64, 1e-5).to(BF16), LlamaRMSNorm(64, 1e-5).to(BF16)
    ours.weight.data = theirs.weight.data = (torch.rand(64) + 0.5).to(BF16)
    expected_sum = x + residual  # HF adds the residual in the model's dtype
    out, summed = ours(x, residual.clone())
    assert torch.equal(summed, expected_sum) and torch.equal(out, theirs(expected_sum))
    assert torch.equal(ours(x), theirs(x))

    rope, positions = RotaryEmbedding(16, 64, 10000.0, None), torch.tensor([0, 7, 63])
    q, k = torch.randn(3, 6, 16).to(BF16), torch.randn(3, 2, 16).to(BF16)
    qkv = torch.cat([q, k, k], dim=1)  # rotated as a strided view of the heads, as the model does
    rotated = rope.rotate(qkv[:, :8], rope.prepare(positions, BF16))
    table = rope.cos_sin_cache[positions]  # [T, 16]: cos, then sin of the 8 frequencies
    cos = torch.cat([table[:, :8]] * 2, dim=-1)[None].to(BF16)
    sin = torch.cat([table[:, 8:]] * 2, dim=-1)[None].to(BF16)
    ref_q, ref_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    assert torch.equal(rotated[:, :6], ref_q[0].transpose(0, 1))
    assert torch.equal(rotated[:, 6:], ref_k[0].transpose(0, 1))

    gate_up = torch.randn(4, 2 * 48).to(BF16)
    assert torch.equal(SiluAndMul()(gate_up), F.silu(gate_up[:, :48]) * gate_up[:, 48:])


def test_mask_converted_once_per_step_attends_like_the_bool_mask():
    torch.manual_seed(0)
    mask = (torch.arange(32) < torch.tensor([[5], [32], [17]]))[:, None, None, :]  # [3, 1, 1, 32]
    group = DecodeGroup(0, 3, torch.zeros(24, dtype=torch.long), mask)
    for dtype in (torch.float32, BF16):
        q, k, v = torch.randn(3, 2, 3, 16).to(dtype), *torch.randn(2, 3, 2, 32, 16).to(dtype)
        assert group.additive_mask(dtype) is group.additive_mask(dtype)  # once per step
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, attn_mask=group.additive_mask(dtype)),
                           F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


@pytest.mark.slow
def test_a_decode_step_runs_few_ops_per_layer(tiny_llama_dir, monkeypatch):
    """A budget of aten ops (the profiler's count, nested ones included) in one decoder layer
    of a batch-1 bf16 decode step of the real engine (the tiny model's float projections, torch
    2.13): 197 before this pass trimmed the layer, 177 after."""
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", num_kv_blocks=16)
    layer = llm.engine.runner.model.model.layers[0]
    forward = layer.forward

    def traced(*args):
        with torch.profiler.record_function("decoder layer"):
            return forward(*args)

    monkeypatch.setattr(layer, "forward", traced)
    engine = llm.engine
    engine.add_request("a", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    engine.step()
    engine.step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        engine.step()

    def in_layer(event):
        while event is not None and event.name != "decoder layer":
            event = event.cpu_parent
        return event is not None

    ops = [e.name for e in prof.events() if e.name.startswith("aten::") and in_layer(e)]
    assert 0 < len(ops) <= BUDGET, f"{len(ops)} aten ops in one decoder layer"
