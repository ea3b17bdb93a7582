"""Each family's config.json read into a ModelConfig, and what we do not run refused by name:
an architecture outside the registry (listing what is), and a family's options we lack."""

import json

import pytest
import torch
from safetensors.torch import save_file

from engine.errors import ModelLoadError
from engine.models.loader import load_model_config
from engine.models.registry import FAMILIES, GGUF_ARCHITECTURES, HF_ARCHITECTURES, model_class

BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)


def checkpoint(tmp_path, architecture, model_type, **fields):
    """A directory with config.json and one (placeholder) safetensors shard: enough to read."""
    config = {**BASE, "architectures": [architecture], "model_type": model_type, **fields}
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, tmp_path / "model.safetensors")
    return tmp_path


@pytest.mark.parametrize("architecture", [
    "Gemma2ForCausalLM", "Gemma3ForConditionalGeneration", "MixtralForCausalLM",
    "Phi3SmallForCausalLM", "PhiForCausalLM", "GPTNeoXForCausalLM"])
def test_unsupported_architecture_is_refused_naming_it_and_listing_the_supported(
        tmp_path, architecture):
    with pytest.raises(ModelLoadError) as error:
        load_model_config(checkpoint(tmp_path, architecture, "other"))
    message = str(error.value)
    assert f"unsupported architecture {architecture!r}" in message
    for supported in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                      "Qwen3ForCausalLM", "Phi3ForCausalLM", "Gemma3ForCausalLM"):
        assert supported in message


def test_every_registered_name_has_a_model_class():
    families = set(HF_ARCHITECTURES.values()) | set(GGUF_ARCHITECTURES.values())
    assert families == set(FAMILIES)
    assert {model_class(f).__name__ for f in FAMILIES} == {
        "LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Phi3ForCausalLM",
        "Gemma3ForCausalLM", "BertModel"}


def test_gemma3_v4_config_keys_give_windows_rope_bases_and_scales(tmp_path):
    config = load_model_config(checkpoint(
        tmp_path, "Gemma3ForCausalLM", "gemma3_text", num_hidden_layers=7, sliding_window=512,
        sliding_window_pattern=3, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, query_pre_attn_scalar=256,
        final_logit_softcapping=None, hidden_activation="gelu_pytorch_tanh"))
    assert config.architecture == "gemma3" and config.qk_norm
    assert config.layer_sliding_windows == [512, 512, None, 512, 512, None, 512]
    assert (config.rope_theta, config.local_rope_theta) == (1_000_000.0, 10_000.0)
    assert config.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert config.query_pre_attn_scalar == 256


def test_qwen3_sliding_window_applies_only_when_switched_on(tmp_path):
    off = load_model_config(checkpoint(tmp_path, "Qwen3ForCausalLM", "qwen3", sliding_window=64,
                                       use_sliding_window=False))
    assert off.qk_norm and off.layer_sliding_windows == []
    on = load_model_config(checkpoint(
        tmp_path, "Qwen3ForCausalLM", "qwen3", sliding_window=64, use_sliding_window=True,
        layer_types=["full_attention", "full_attention", "sliding_attention", "sliding_attention"]))
    assert on.layer_sliding_windows == [None, None, 64, 64]


@pytest.mark.parametrize("architecture, model_type, fields, refusal", [
    ("Gemma3ForCausalLM", "gemma3_text", {"attn_logit_softcapping": 50.0}, "soft-capping"),
    ("Gemma3ForCausalLM", "gemma3_text", {"hidden_activation": "gelu"}, "'gelu'"),
    ("Phi3ForCausalLM", "phi3", {"partial_rotary_factor": 0.5,
                                 "rope_parameters": {"partial_rotary_factor": 0.5}},
     "partial rotary"),
    ("LlamaForCausalLM", "llama", {"rope_scaling": {"rope_type": "mrope", "factor": 2.0}},
     "'mrope'"),
])
def test_a_family_option_we_do_not_run_is_refused_by_name(tmp_path, architecture, model_type,
                                                         fields, refusal):
    with pytest.raises(ModelLoadError, match=refusal):
        load_model_config(checkpoint(tmp_path, architecture, model_type, **fields))
