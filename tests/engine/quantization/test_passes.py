"""quantize_model over built models: what it replaces, what it refuses, how close logits stay."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.models.hf_loader import load_hf_config
from engine.models.llama import LlamaForCausalLM
from engine.quantization import Int4WeightOnlyLinear, Int8WeightOnlyLinear, quantize_model
from engine.quantization.fidelity import compare_greedy

PROMPTS = [[1, 400, 2000, 31000, 77], [1, 9, 8, 7, 6, 5, 4, 3]]


@pytest.fixture()
def hf_tiny(tiny_llama_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def _logits_fn(model):
    return lambda ids: model(torch.tensor([ids])).logits[0]


@pytest.mark.slow
def test_pass_replaces_the_engine_projections_and_leaves_embeddings_norms_and_lm_head(tiny_llama_dir):
    model = LlamaForCausalLM(load_hf_config(tiny_llama_dir))
    for param in model.parameters():
        param.data.normal_(0, 0.02)
    replaced = quantize_model(model, "int4", group_size=32)
    assert sorted(replaced) == sorted(f"model.layers.{i}.{p}" for i in range(2) for p in (
        "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"))
    assert isinstance(model.model.layers[1].self_attn.qkv_proj, Int4WeightOnlyLinear)
    assert type(model.lm_head).__name__ == "LMHead"  # its own products: LMHead.prepare
    assert isinstance(model.model.embed_tokens, torch.nn.Embedding)


def test_pass_refuses_a_shape_naming_the_layer_and_leaves_the_model_intact(hf_tiny):
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj.*in_features \(64\)"):
        quantize_model(hf_tiny, "int4", group_size=128)
    assert not any(isinstance(m, Int4WeightOnlyLinear) for m in hf_tiny.modules())


@pytest.mark.parametrize("mode, max_rel_error", [("int8", 0.02), ("int4", 0.15)])
def test_quantized_tiny_llama_logits_stay_close_to_fp32(hf_tiny, tiny_llama_dir, mode, max_rel_error):
    reference = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    quantize_model(hf_tiny, mode, group_size=32, include_lm_head=True)
    assert isinstance(hf_tiny.lm_head, Int8WeightOnlyLinear if mode == "int8" else Int4WeightOnlyLinear)
    ids = torch.tensor([PROMPTS[0] + PROMPTS[1]])
    with torch.no_grad():
        expected, got = reference(ids).logits, hf_tiny(ids).logits
    # relative RMS error of the logits; random weights give int4 (16 levels a group) ~10%
    assert ((got - expected).norm() / expected.norm()).item() < max_rel_error


def test_fidelity_of_a_model_against_itself_is_perfect(hf_tiny):
    fidelity = compare_greedy(_logits_fn(hf_tiny), _logits_fn(hf_tiny), PROMPTS, max_new_tokens=4)
    assert (fidelity.num_tokens, fidelity.top1, fidelity.top5) == (8, 1.0, 1.0)


def test_int8_tiny_llama_follows_fp32_greedy_tokens(hf_tiny, tiny_llama_dir):
    reference = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    quantize_model(hf_tiny, "int8")
    fidelity = compare_greedy(_logits_fn(hf_tiny), _logits_fn(reference), PROMPTS, max_new_tokens=6)
    assert fidelity.top5 == 1.0 and fidelity.top1 >= 0.75
