"""engine.cli.validate: every family's tensors checked against its model, reported as JSON lines."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM,
                          Qwen2Config, Qwen3MoeConfig)

from engine.models.loader import load_model_config
from engine.cli.validate import check_weights, main

SMALL = dict(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


@pytest.mark.parametrize("hf_config", [
    LlamaConfig(**SMALL, tie_word_embeddings=False),
    LlamaConfig(**SMALL, tie_word_embeddings=True, head_dim=16),
    Qwen2Config(**SMALL, tie_word_embeddings=True),
    Gemma3TextConfig(**SMALL, head_dim=8, sliding_window=8),
    Qwen3MoeConfig(**SMALL, head_dim=8, num_experts=4, num_experts_per_tok=2,
                   moe_intermediate_size=16, mlp_only_layers=[1]),
], ids=["llama", "llama-tied-wide-heads", "qwen2-bias", "gemma3", "qwen3-moe"])
def test_every_tensor_has_its_place_and_the_count_is_transformers(hf_config, tmp_path):
    """The shape check builds the family's model on the meta device: each family's tensors
    fit, and the parameters counted are transformers' own."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config)
    model.save_pretrained(tmp_path)
    reference = sum(p.numel() for p in model.parameters())
    assert check_weights(tmp_path, load_model_config(tmp_path), lambda *_: None) == reference


def test_a_tensor_of_the_wrong_shape_is_named(tmp_path):
    model = AutoModelForCausalLM.from_config(Qwen3MoeConfig(**SMALL, head_dim=8, num_experts=4,
                                                            num_experts_per_tok=2,
                                                            moe_intermediate_size=16))
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights["model.layers.1.mlp.experts.3.up_proj.weight"] = torch.zeros(12, 32)
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"experts\.3\.up_proj.*\(12, 32\) != model shape \(16, 32\)"):
        check_weights(tmp_path, load_model_config(tmp_path), lambda *_: None)


@pytest.mark.slow
def test_validate_prints_progress_then_an_ok_report(tiny_llama_dir, capsys):
    assert main([str(tiny_llama_dir)]) == 0

    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    progress = [r["progress"] for r in records[:-1]]
    assert progress == sorted(progress) and progress[-1] == 1.0
    final = records[-1]
    reference = LlamaForCausalLM.from_pretrained(tiny_llama_dir)
    assert final["ok"] is True
    assert final["parameters"] == sum(p.numel() for p in reference.parameters())
    assert final["context_length"] == reference.config.max_position_embeddings


def test_validate_refuses_a_tensor_missing_from_the_checkpoint(tiny_llama_dir, tmp_path, capsys):
    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    weights = load_file(tmp_path / "m" / "model.safetensors")
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, tmp_path / "m" / "model.safetensors", metadata={"format": "pt"})

    assert main([str(tmp_path / "m")]) == 1

    final = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert final["ok"] is False and "model.layers.1.mlp.down_proj.weight" in final["error"]
