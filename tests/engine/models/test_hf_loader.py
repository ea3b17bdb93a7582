"""Hugging Face safetensors checkpoints read back exactly as transformers reads them."""

import json
import shutil

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, MistralConfig, MistralForCausalLM

from engine.errors import ModelLoadError
from engine.models.loader import iter_weights, load_model_config


def hf_state_dict(directory, tied):
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    state = model.state_dict()
    if tied:
        state.pop("lm_head.weight")
    return state


def assert_weights_match(directory, config, reference):
    source = iter_weights(directory, config)
    seen = {}
    for name, tensor in source:
        seen[name] = tensor
    assert len(source) == len(seen)
    assert sorted(seen) == sorted(reference)
    for name, tensor in seen.items():
        assert torch.equal(tensor, reference[name]), name


def copy_checkpoint(source, tmp_path):
    directory = tmp_path / "copy"
    shutil.copytree(source, directory)
    return directory


def edit_config(directory, change):
    config = json.loads((directory / "config.json").read_text())
    change(config)
    (directory / "config.json").write_text(json.dumps(config))


def test_tiny_llama_config_matches_transformers_config(tiny_llama_dir):
    ours = load_model_config(tiny_llama_dir)
    hf = AutoConfig.from_pretrained(tiny_llama_dir)
    assert ours.architecture == "llama"
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                  "max_position_embeddings", "tie_word_embeddings", "bos_token_id"):
        assert getattr(ours, field) == getattr(hf, field), field
    assert ours.rope_theta == hf.rope_parameters["rope_theta"]
    assert ours.rope_scaling is None
    assert ours.attention_bias is False
    assert ours.eos_token_ids == [2]
    assert ours.torch_dtype == "float32"


def test_tiny_llama_weights_equal_transformers_state_dict(tiny_llama_dir):
    config = load_model_config(tiny_llama_dir)
    assert_weights_match(tiny_llama_dir, config, hf_state_dict(tiny_llama_dir, tied=False))


def test_qwen2_has_qkv_bias_and_weights_equal_state_dict(tiny_qwen2_dir):
    config = load_model_config(tiny_qwen2_dir)
    assert config.architecture == "qwen2"
    assert config.attention_bias is True
    reference = hf_state_dict(tiny_qwen2_dir, tied=False)
    assert "model.layers.0.self_attn.q_proj.bias" in reference
    assert "model.layers.0.self_attn.o_proj.bias" not in reference
    assert_weights_match(tiny_qwen2_dir, config, reference)


def test_llama3_rope_scaling_is_normalised_to_hf_form(tiny_llama3_rope_dir):
    config = load_model_config(tiny_llama3_rope_dir)
    assert config.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    assert config.rope_theta == 10000.0


def test_legacy_rope_scaling_type_key_becomes_rope_type(tiny_llama_dir, tmp_path):
    directory = copy_checkpoint(tiny_llama_dir, tmp_path)
    edit_config(directory, lambda c: (c.pop("rope_parameters"), c.update(
        rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 2.0})))
    config = load_model_config(directory)
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_tied_checkpoint_without_lm_head_yields_no_lm_head(tiny_llama_dir, tmp_path):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_llama_dir)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    directory = tmp_path / "tied"
    model.save_pretrained(directory)
    config = load_model_config(directory)
    assert config.tie_word_embeddings is True
    assert_weights_match(directory, config, hf_state_dict(directory, tied=True))


def test_sharded_checkpoint_reads_every_shard_with_and_without_index(tiny_llama_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    directory = tmp_path / "sharded"
    model.save_pretrained(directory, max_shard_size="2MB")
    assert len(list(directory.glob("*.safetensors"))) > 1
    assert (directory / "model.safetensors.index.json").is_file()
    config = load_model_config(directory)
    reference = hf_state_dict(directory, tied=False)
    assert_weights_match(directory, config, reference)

    (directory / "model.safetensors.index.json").unlink()
    assert_weights_match(directory, load_model_config(directory), reference)


def test_eos_ids_merge_config_generation_config_and_tokenizer(tiny_llama_dir, tmp_path):
    directory = copy_checkpoint(tiny_llama_dir, tmp_path)
    generation = json.loads((directory / "generation_config.json").read_text())
    generation["eos_token_id"] = [2, 7]
    (directory / "generation_config.json").write_text(json.dumps(generation))
    edit_config(directory, lambda c: c.update(eos_token_id=0))
    # tokenizer_config.json names <|im_end|> (id 2) as eos
    assert load_model_config(directory).eos_token_ids == [0, 2, 7]


def test_mistral_sliding_window_limits_the_context(tmp_path):
    config = MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=32, max_position_embeddings=4096, sliding_window=256)
    MistralForCausalLM(config).save_pretrained(tmp_path)
    ours = load_model_config(tmp_path)
    assert ours.architecture == "mistral"
    assert ours.head_dim == 32  # explicit head_dim, not hidden_size / heads = 16
    assert ours.max_position_embeddings == 256


def test_mlp_bias_is_refused(tiny_llama_dir, tmp_path):
    directory = copy_checkpoint(tiny_llama_dir, tmp_path)
    edit_config(directory, lambda c: c.update(mlp_bias=True))
    with pytest.raises(ModelLoadError, match="mlp_bias"):
        load_model_config(directory)


def test_llama_attention_bias_with_o_proj_bias_is_refused(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, attention_bias=True)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="o_proj bias"):
        load_model_config(tmp_path)
