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
    from engine.text.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_path)


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_path):
    """transformers' own float32 load of the bundled GGUF (slow: ~15 s), in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        smollm2_path.parent, gguf_file=smollm2_path.name, dtype=torch.float32)
    return model.eval()


# Chat prompts the fidelity tests generate from (greedy, CHAT_FIDELITY_TOKENS each).
CHAT_FIDELITY_PROMPTS = [
    "Name three rivers in Europe and the countries they flow through.",
    "Write a short poem about a lighthouse keeper.",
    "How do I reverse a list in Python? Show two ways.",
    "Why do leaves change colour in autumn?",
]
CHAT_FIDELITY_TOKENS = 48


@pytest.fixture(scope="session")
def chat_fidelity(hf_smollm2):
    """fidelity(llm) -> Fidelity: the engine generates greedily from CHAT_FIDELITY_PROMPTS, then
    transformers fp32 on the same GGUF reads the same tokens (teacher-forced top-1 / top-5)."""
    from engine import SamplingParams
    from engine.quantization.fidelity import Fidelity, teacher_forced_fidelity
    from engine.text.tokenizer import apply_chat_template

    def reference(ids):
        with torch.no_grad():
            return hf_smollm2(torch.tensor([ids])).logits[0]

    def fidelity(llm):
        prompts = [apply_chat_template(llm.tokenizer, [{"role": "user", "content": p}])
                   for p in CHAT_FIDELITY_PROMPTS]
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=CHAT_FIDELITY_TOKENS,
                                                       ignore_eos=True))
        total = Fidelity(0, 0, 0)
        for prompt, out in zip(prompts, outputs):
            total = total + teacher_forced_fidelity(reference, prompt, out.token_ids)
        assert total.num_tokens == len(CHAT_FIDELITY_PROMPTS) * CHAT_FIDELITY_TOKENS
        return total

    return fidelity


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
def tiny_llama_d64_dir(tmp_path_factory, smollm2_tokenizer):
    """The tiny Llama with heads of 64 dimensions (SmolLM2's), 2 query heads on each of 2 KV heads:
    the head size the CPU attention's bf16 products take (a multiple of 32; the suite's tiny
    Llama has 16)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = dict(TINY_LLAMA_SIZES, hidden_size=256, intermediate_size=256)
    return _save_tiny(tmp_path_factory.mktemp("tiny_llama_d64"), LlamaForCausalLM,
                      LlamaConfig(**sizes), smollm2_tokenizer)


@pytest.fixture(scope="session")
def tiny_llama3_rope_dir(tmp_path_factory, smollm2_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    rope_scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    config = LlamaConfig(**TINY_LLAMA_SIZES, rope_scaling=rope_scaling)
    return _save_tiny(tmp_path_factory.mktemp("tiny_llama3_rope"), LlamaForCausalLM,
                      config, smollm2_tokenizer)



@pytest.fixture(scope="session")
def tiny_gemma3_d64_dir(tmp_path_factory, smollm2_tokenizer):
    """Gemma 3 as the 270M model is laid out, at the suite's tiny sizes: one KV head for four
    query heads of 64 dimensions (a multiple of 32: a bf16 cache's attention takes the bf16
    products where the CPU has them), sliding layers of a 24-token window (not a multiple of the
    tests' 16-token blocks: windows start inside a block) around a global one, two RoPE bases,
    tied embeddings, a query_pre_attn_scalar of its own. Weights of std 0.3, so attention's
    scores span several units and the window changes the tokens."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    sizes = dict(TINY_LLAMA_SIZES, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=64, num_hidden_layers=3, tie_word_embeddings=True,
                 initializer_range=0.3)
    config = Gemma3TextConfig(**sizes, sliding_window=24,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                              rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
                              query_pre_attn_scalar=48)
    return _save_tiny(tmp_path_factory.mktemp("tiny_gemma3_d64"), Gemma3ForCausalLM, config,
                      smollm2_tokenizer)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory, smollm2_tokenizer):
    """Qwen3: an RMSNorm over each query and key head before RoPE. Weights of std 0.3 (wide
    margins between a greedy token and the next: bf16 paths that round differently agree)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return _save_tiny(tmp_path_factory.mktemp("tiny_qwen3"), Qwen3ForCausalLM,
                      Qwen3Config(**TINY_LLAMA_SIZES, initializer_range=0.3), smollm2_tokenizer)
