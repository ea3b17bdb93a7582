"""The default fast path on the bundled SmolLM2 (GGUF Q4_1 projections straight into int4, bf16
activations where the CPU has them, int8 LM head for small steps) follows transformers' float32
reading of the same GGUF: each greedy token is its argmax at least 95% of the time and within
its top 5 at least 99.5%."""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.cpu_info import has_fast_bf16
from engine.layers.linear import Int4Linear
from engine.quantization.fidelity import Fidelity, teacher_forced_fidelity
from engine.tokenizer import apply_chat_template

PROMPTS = [
    "Name three rivers in Europe and the countries they flow through.",
    "Write a short poem about a lighthouse keeper.",
    "How do I reverse a list in Python? Show two ways.",
    "Why do leaves change colour in autumn?",
]
NUM_TOKENS = 48


@pytest.mark.slow
def test_default_int4_bf16_path_agrees_with_transformers_fp32(smollm2_path, hf_smollm2):
    llm = LLM(str(smollm2_path), max_model_len=1024)  # the defaults: dtype and quantization auto
    runner = llm.engine.runner
    assert isinstance(runner.model.model.layers[0].self_attn.qkv_proj, Int4Linear)
    assert runner.dtype == (torch.bfloat16 if has_fast_bf16() else torch.float32)
    assert runner.kv_pool.dtype == runner.dtype
    prompts = [apply_chat_template(llm.tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True))

    def reference(ids):
        with torch.no_grad():
            return hf_smollm2(torch.tensor([ids])).logits[0]

    total = Fidelity(0, 0, 0)
    for prompt, out in zip(prompts, outputs):
        total = total + teacher_forced_fidelity(reference, prompt, out.token_ids)
    print(f"fidelity over {total.num_tokens} tokens: top-1 {total.top1:.1%}, top-5 {total.top5:.1%}")
    assert total.num_tokens == len(PROMPTS) * NUM_TOKENS
    assert total.top1 >= 0.95
    assert total.top5 >= 0.995
