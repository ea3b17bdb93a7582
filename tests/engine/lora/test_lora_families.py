"""Adapters on the other families built from engine/models/llama.py's blocks, each against peft's
merged model (fp32): Qwen3 (q/k norms), Phi-3 (q/k/v and gate/up fused in the checkpoint, so the
adapter targets the fused projections) and Gemma 3 (sliding and global layers, GeGLU, tied head).
A base row and an adapter row share the batch, prefill chunked into 8-token steps."""

import pytest
import torch

from engine import LLM, LoRARequest, SamplingParams

from tests.engine.lora.adapters import make_adapter, merged_reference
from tests.engine.test_hf_parity import EXACT, assert_same, hf_greedy
from tests.engine.test_model_families import SEATS, SIZES, prompts_of, save_tiny

pytestmark = pytest.mark.slow
NUM_TOKENS = 32
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return Qwen3ForCausalLM, Qwen3Config(**SIZES), LLAMA_TARGETS


def phi3():
    from transformers import Phi3Config, Phi3ForCausalLM
    return Phi3ForCausalLM, Phi3Config(**SIZES), ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]


def gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    config = Gemma3TextConfig(**{**SIZES, "num_hidden_layers": 3, "tie_word_embeddings": True},
                              sliding_window=8, query_pre_attn_scalar=24,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    return Gemma3ForCausalLM, config, LLAMA_TARGETS


@pytest.mark.parametrize("family", [qwen3, phi3, gemma3], ids=lambda f: f.__name__)
def test_adapter_on_family_matches_peft_merged(family, tmp_path, smollm2_tokenizer):
    from transformers import AutoModelForCausalLM

    model_class, config, targets = family()
    base = save_tiny(tmp_path / "base", model_class, config, smollm2_tokenizer)
    adapter_dir = make_adapter(base, tmp_path / "adapter", seed=7, r=4, lora_alpha=8,
                               target_modules=targets)
    prompts = prompts_of((19, 26))
    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    reference = [hf_greedy(hf, prompts[0], NUM_TOKENS, [-1]),
                 hf_greedy(merged_reference(base, adapter_dir), prompts[1], NUM_TOKENS, [-1])]
    assert reference[1] != hf_greedy(hf, prompts[1], NUM_TOKENS, [-1])  # the adapter matters
    llm = LLM(str(base), num_kv_blocks=64, max_num_batched_tokens=8, **EXACT, **SEATS)
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
    adapters = [None, LoRARequest("a", adapter_dir)]
    assert_same(llm.generate(prompts, params, adapters=adapters), reference)
    llm.engine.block_manager.check_all_free()
