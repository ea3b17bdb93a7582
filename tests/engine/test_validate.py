"""engine.cli.validate: the shapes it expects are exactly Hugging Face's, and it reports as JSON lines."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from engine.models.loader import load_model_config
from engine.cli.validate import expected_shapes, main

SMALL = dict(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


@pytest.mark.parametrize("hf_config", [
    LlamaConfig(**SMALL, tie_word_embeddings=False),
    LlamaConfig(**SMALL, tie_word_embeddings=True, head_dim=16),
    Qwen2Config(**SMALL, tie_word_embeddings=True),
], ids=["llama", "llama-tied-wide-heads", "qwen2-bias"])
def test_expected_shapes_equal_the_transformers_state_dict(hf_config, tmp_path):
    torch.manual_seed(0)
    model = (LlamaForCausalLM if isinstance(hf_config, LlamaConfig) else Qwen2ForCausalLM)(hf_config)
    model.save_pretrained(tmp_path)
    reference = {name: tuple(t.shape) for name, t in model.state_dict().items()
                 if not (hf_config.tie_word_embeddings and name == "lm_head.weight")}

    assert expected_shapes(load_model_config(tmp_path)) == reference


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
