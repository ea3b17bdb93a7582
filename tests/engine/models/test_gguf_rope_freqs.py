"""A GGUF Llama 3.1 carries its RoPE scaling as a rope_freqs tensor of per-frequency factors:
loaded and applied, it gives transformers' llama3-scaled model's greedy tokens."""

import math

import pytest
import torch

from engine import LLM, SamplingParams
from engine.models.loader import load_model_config

from tests.engine.models.test_gguf_loader import SMALL, write_gguf
from tests.engine.test_hf_parity import assert_same, hf_greedy

SIZES = {**SMALL, "head_dim": 16, "max_position_embeddings": 128, "initializer_range": 0.3}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 48}
VOCAB = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(SMALL["vocab_size"] - 3)]


def llama_cpp_rope_freqs(theta: float, dim: int, s: dict) -> list[float]:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors for rope_type llama3."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(s["factor"])
        else:
            smooth = ((s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"])
                      / (s["high_freq_factor"] - s["low_freq_factor"]))
            factors.append(1 / ((1 - smooth) / s["factor"] + smooth))
    return factors


def _tokenizer_and_rope_freqs(factors):
    def extra(writer):
        # a byte vocabulary, no chat template: the engine loads a tokenizer (and a GGUF without
        # a template once failed there: engine/text/tokenizer.py's _gguf_chat_template)
        writer.add_tokenizer_model("llama")
        writer.add_token_list(VOCAB)
        writer.add_token_scores([0.0] * len(VOCAB))
        writer.add_token_types([2, 3, 3] + [6] * (len(VOCAB) - 3))
        writer.add_tensor("rope_freqs.weight", torch.tensor(factors, dtype=torch.float32).numpy())
    return extra


@pytest.mark.slow
def test_gguf_rope_freqs_match_transformers_llama3_scaling(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**SIZES, rope_scaling=dict(LLAMA3))).eval()
    factors = llama_cpp_rope_freqs(hf.config.rope_parameters["rope_theta"], 16, LLAMA3)
    assert 1.0 in factors and 8.0 in factors and len(set(factors)) > 2  # all three bands
    path = tmp_path / "llama31.gguf"
    write_gguf(path, "llama", hf, permute_qk=True, extra=_tokenizer_and_rope_freqs(factors))

    config = load_model_config(path)
    assert config.rope_scaling is None
    assert config.rope_freq_factors == pytest.approx(factors)
    prompts = [[3 + (i * 37 + j * 11) % 120 for j in range(n)] for i, n in enumerate((3, 17, 40, 9))]
    reference = [hf_greedy(hf, p, 40, [-1]) for p in prompts]
    unscaled = LlamaForCausalLM(LlamaConfig(**SIZES)).eval()
    unscaled.load_state_dict(hf.state_dict())
    assert [hf_greedy(unscaled, p, 40, [-1]) for p in prompts] != reference  # the factors matter

    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    llm = LLM(str(path), dtype="float32", quantization=None, num_kv_blocks=32,
              max_num_batched_tokens=16)
    assert_same(llm.generate(prompts, params), reference)
    small = LLM(str(path), dtype="float32", quantization=None, num_kv_blocks=8,
                max_num_batched_tokens=16, enable_prefix_caching=False)
    assert_same(small.generate(prompts, params), reference)
    assert small.engine.stats().num_preemptions > 0


def test_gguf_rope_freqs_of_the_wrong_length_are_refused(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.errors import ModelLoadError

    torch.manual_seed(0)
    path = tmp_path / "bad.gguf"
    write_gguf(path, "llama", LlamaForCausalLM(LlamaConfig(**{**SIZES, "num_hidden_layers": 1})),
               permute_qk=True, extra=_tokenizer_and_rope_freqs([1.0] * 5))
    with pytest.raises(ModelLoadError, match="rope_freqs.*5 factors for 8"):
        load_model_config(path)
