"""Greedy outputs token for token identical to Hugging Face transformers' own model (fp32, CPU)."""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.text.tokenizer import apply_chat_template

NUM_TOKENS = 32
# The exact path: float32 activations and float weights, whatever the defaults become.
EXACT = dict(dtype="float32", quantization=None)
CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue, then give one everyday example of the same "
    "effect that a child would understand.",
    "List three prime numbers.",
    "You are reviewing a pull request that renames a function used in forty files. Describe, step "
    "by step, how you would check that nothing broke, which tests you would run first and why, and "
    "what you would write in the review comment.",
]


def hf_greedy(model, prompt_ids: list[int], num_tokens: int, eos_ids: list[int]) -> list[int]:
    """transformers' generate(do_sample=False), cut after the first EOS as our engine stops there."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids),
                             dtype=torch.long), do_sample=False, max_new_tokens=num_tokens,
                             eos_token_id=eos_ids, pad_token_id=eos_ids[0])
    tokens = out[0, len(prompt_ids):].tolist()
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[:i + 1]
    return tokens


@pytest.fixture(scope="module")
def smollm2_prompts(smollm2_tokenizer):
    return [apply_chat_template(smollm2_tokenizer, [{"role": "user", "content": c}]) for c in CHATS]


@pytest.fixture(scope="module")
def smollm2_reference(hf_smollm2, smollm2_prompts):
    eos = [2]
    return [hf_greedy(hf_smollm2, p, NUM_TOKENS, eos) for p in smollm2_prompts]


@pytest.fixture(scope="module")
def smollm2_llm(smollm2_path):
    return LLM(str(smollm2_path), num_kv_blocks=512, **EXACT)


GREEDY = SamplingParams(temperature=0, max_tokens=NUM_TOKENS)


def assert_same(outputs, reference):
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        assert out.token_ids == ref, f"prompt {i}: engine {out.token_ids} != transformers {ref}"


@pytest.mark.slow
def test_smollm2_batch_of_mixed_lengths_matches_transformers(smollm2_llm, smollm2_prompts,
                                                              smollm2_reference):
    assert len({len(p) for p in smollm2_prompts}) == len(smollm2_prompts)
    outputs = smollm2_llm.generate(smollm2_prompts, GREEDY)
    assert_same(outputs, smollm2_reference)
    assert sum(len(o.token_ids) for o in outputs) > 100  # most run the full 32 tokens
    smollm2_llm.engine.block_manager.check_all_free()


@pytest.mark.slow
def test_smollm2_chunked_prefill_matches_transformers(smollm2_path, smollm2_prompts,
                                                      smollm2_reference):
    llm = LLM(str(smollm2_path), max_num_batched_tokens=16, num_kv_blocks=256, **EXACT)
    outputs = llm.generate(smollm2_prompts, GREEDY)
    assert_same(outputs, smollm2_reference)
    llm.engine.block_manager.check_all_free()


@pytest.mark.slow
def test_smollm2_preemption_matches_transformers(smollm2_path, smollm2_prompts, smollm2_reference):
    # 14 blocks of 16 tokens: the longest request alone needs ~8, all five together ~30.
    llm = LLM(str(smollm2_path), num_kv_blocks=14, enable_prefix_caching=False, **EXACT)
    outputs = llm.generate(smollm2_prompts, GREEDY)
    assert llm.engine.stats().num_preemptions > 0
    assert_same(outputs, smollm2_reference)
    llm.engine.block_manager.check_all_free()


@pytest.mark.slow
def test_prefix_cache_reuses_system_prompt_blocks_without_changing_output(
        smollm2_llm, smollm2_tokenizer, hf_smollm2):
    system = ("You are Pagoda's assistant. Answer briefly and precisely, cite no sources, "
              "and prefer plain words over jargon. Never make up facts; say when you do not know.")
    prompts = [apply_chat_template(smollm2_tokenizer, [{"role": "system", "content": system},
                                                        {"role": "user", "content": q}])
               for q in ("Name a large ocean.", "What colour is grass?")]
    first = smollm2_llm.generate(prompts[0], GREEDY)[0]
    second = smollm2_llm.generate(prompts[1], GREEDY)[0]
    shared = 0
    while prompts[0][shared] == prompts[1][shared]:
        shared += 1
    assert shared >= 32
    assert second.num_cached_tokens == shared // 16 * 16
    assert second.num_cached_tokens >= 32
    assert second.token_ids == hf_greedy(hf_smollm2, prompts[1], NUM_TOKENS, [2])
    assert first.token_ids == hf_greedy(hf_smollm2, prompts[0], NUM_TOKENS, [2])
    smollm2_llm.engine.block_manager.check_all_free()


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_qwen2_dir", "tiny_llama3_rope_dir"])
def test_tiny_random_models_match_transformers(fixture, request):
    from transformers import AutoModelForCausalLM

    path = request.getfixturevalue(fixture)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [[1 + (i * 37 + j * 11) % 4000 for j in range(n)] for i, n in enumerate((3, 17, 40, 9, 70))]
    reference = [hf_greedy(hf, p, NUM_TOKENS, [-1]) for p in prompts]
    llm = LLM(str(path), num_kv_blocks=64, **EXACT)
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
    assert_same(llm.generate(prompts, params), reference)
    chunked = LLM(str(path), num_kv_blocks=64, max_num_batched_tokens=8, **EXACT)
    assert_same(chunked.generate(prompts, params), reference)
    llm.engine.block_manager.check_all_free()
