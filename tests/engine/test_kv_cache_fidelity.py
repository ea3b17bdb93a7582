"""The bundled SmolLM2 on its default fast path with kv_cache_dtype="int8" follows transformers'
float32 reading of the same GGUF nearly as closely as with the default cache: top-1 at most 3
points below the "auto" cache's on the same prompts, each greedy token within transformers' top 5
at least 99.5% of the time, and its argmax at least 93%.

The issue's 95% top-1 goal is the default path's (97.4% on these prompts, int8-rounded
activations in the CPU kernels); int8 KV rounds every cached K and V on top of that and measured
94.8% (182 of 192 tokens; 95.8% with torch's bf16-activation kernels before), one token from 95%
on a sample whose noise is about 1.5 points, so the absolute bound sits below it and the relative
bound carries the comparison."""

import pytest
import torch

from engine import LLM, SamplingParams
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
def test_int8_kv_cache_agrees_with_transformers_fp32_like_the_default_cache(smollm2_path, hf_smollm2):
    def reference(ids):
        with torch.no_grad():
            return hf_smollm2(torch.tensor([ids])).logits[0]

    scores = {}
    for kv in ("auto", "int8"):
        llm = LLM(str(smollm2_path), max_model_len=1024, max_num_seqs=8, kv_cache_dtype=kv)
        assert llm.engine.runner.kv_pool.dtype == (torch.int8 if kv == "int8" else llm.engine.runner.dtype)
        prompts = [apply_chat_template(llm.tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True))
        total = Fidelity(0, 0, 0)
        for prompt, out in zip(prompts, outputs):
            total = total + teacher_forced_fidelity(reference, prompt, out.token_ids)
        scores[kv] = total
        print(f"kv_cache_dtype {kv}: fidelity over {total.num_tokens} tokens: top-1 {total.top1:.1%}, "
              f"top-5 {total.top5:.1%}")
    int8 = scores["int8"]
    assert int8.num_tokens == len(PROMPTS) * NUM_TOKENS
    assert int8.top1 >= 0.93 and int8.top5 >= 0.995
    assert int8.top1 >= scores["auto"].top1 - 0.03
