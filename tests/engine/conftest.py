"""Session fixtures shared by the engine tests: the bundled SmolLM2 and tiny random checkpoints.

The tiny checkpoints have the suite's tiny Llama sizes (tests/conftest.py) and use the SmolLM2
tokenizer (vocab 49152) so that text round-trips through them; they are saved the way Hugging
Face saves any model: config.json, generation_config.json, model.safetensors, tokenizer.json and
tokenizer_config.json (with the chat template).
"""

import pytest
import torch

from tests.conftest import TINY_LLAMA_SIZES


@pytest.fixture(scope="session")
def smollm2_path():
    from engine.models.registry import resolve_model_path

    return resolve_model_path("smollm2")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path):
    from engine.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_path)


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_path):
    """transformers' own float32 load of the bundled GGUF (slow: ~15 s), in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        smollm2_path.parent, gguf_file=smollm2_path.name, dtype=torch.float32)
    return model.eval()


def _save_tiny(directory, model_class, config, tokenizer):
    torch.manual_seed(0)
    model = model_class(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory, smollm2_tokenizer):
    """Qwen2: biased q/k/v projections, no o_proj bias."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _save_tiny(tmp_path_factory.mktemp("tiny_qwen2"), Qwen2ForCausalLM,
                      Qwen2Config(**TINY_LLAMA_SIZES), smollm2_tokenizer)


@pytest.fixture(scope="session")
def tiny_llama3_rope_dir(tmp_path_factory, smollm2_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    rope_scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    config = LlamaConfig(**TINY_LLAMA_SIZES, rope_scaling=rope_scaling)
    return _save_tiny(tmp_path_factory.mktemp("tiny_llama3_rope"), LlamaForCausalLM,
                      config, smollm2_tokenizer)

