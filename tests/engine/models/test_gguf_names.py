"""GGUF tensor names against Hugging Face ones (engine/models/gguf_names.py), the one table the
loader and the memory estimate read."""

from __future__ import annotations

import pytest

from engine.errors import ModelLoadError
from engine.models.gguf_names import hf_name


def test_layer_and_global_tensors_map_to_their_hugging_face_names():
    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_down.bias") == "model.layers.0.mlp.down_proj.bias"
    assert hf_name("blk.11.attn_norm.weight") == "model.layers.11.input_layernorm.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output.weight") == "lm_head.weight"


def test_a_tensor_without_a_counterpart_has_no_name_and_the_loader_refuses_it():
    assert hf_name("rope_freqs.weight") is None and hf_name("blk.0.attn_q_norm.weight") is None
    from engine.models.gguf_loader import hf_tensor_name

    with pytest.raises(ModelLoadError, match="has no counterpart in our models"):
        hf_tensor_name("rope_freqs.weight")
