"""An adapter over the bundled SmolLM2 GGUF on the engine's default fast path (its Q4 blocks as
int4, bf16 activations where the CPU has them): the LoRA delta added in float on top of the
quantized products follows peft's merged model on transformers' float32 reading of the same GGUF
nearly as closely as the base follows transformers (tests/engine/test_fast_path_fidelity.py's bar,
less the spread of one greedy answer: see the assertion)."""

import pytest
import torch

from engine import LLM, LoRARequest, SamplingParams
from engine.quantization.fidelity import Fidelity, teacher_forced_fidelity
from engine.text.tokenizer import apply_chat_template

from tests.engine.conftest import CHAT_FIDELITY_PROMPTS, CHAT_FIDELITY_TOKENS
from tests.engine.lora.adapters import make_adapter

pytestmark = pytest.mark.slow


def test_adapter_over_the_quantized_gguf_follows_peft_merged_fp32(smollm2_path, tmp_path):
    from transformers import AutoModelForCausalLM

    from peft import PeftModel

    def load():  # transformers' float32 reading of the GGUF
        return AutoModelForCausalLM.from_pretrained(smollm2_path.parent, gguf_file=smollm2_path.name,
                                                    dtype=torch.float32)

    adapter_dir = make_adapter(None, tmp_path / "adapter", seed=5, model=load(), b_std=0.02, r=8,
                               lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                              "gate_proj", "up_proj", "down_proj"])
    merged = PeftModel.from_pretrained(load(), adapter_dir).merge_and_unload().eval()

    llm = LLM(str(smollm2_path), max_model_len=1024)
    prompts = [apply_chat_template(llm.tokenizer, [{"role": "user", "content": p}])
               for p in CHAT_FIDELITY_PROMPTS]
    params = SamplingParams(temperature=0, max_tokens=CHAT_FIDELITY_TOKENS, ignore_eos=True)
    adapter = LoRARequest("smol-lora", adapter_dir)
    # the adapter's requests and base requests in one batch
    outputs = llm.generate(prompts + prompts[:2], params, adapters=[adapter] * len(prompts) + [None, None])
    ours, base = outputs[:len(prompts)], outputs[len(prompts):]
    assert [o.token_ids for o in ours[:2]] != [o.token_ids for o in base]  # the adapter matters

    def reference(ids):
        with torch.no_grad():
            return merged(torch.tensor([ids])).logits[0]

    total = Fidelity(0, 0, 0)
    for prompt, out in zip(prompts, ours):
        total = total + teacher_forced_fidelity(reference, prompt, out.token_ids)
    print(f"adapter fidelity over {total.num_tokens} tokens: top-1 {total.top1:.1%}, top-5 {total.top5:.1%}")
    assert total.num_tokens == len(prompts) * CHAT_FIDELITY_TOKENS
    # 97.9% top-1 alone (1 or 2 threads, fused attention in float32 or bf16 products alike); 94.3%
    # once in a full run under xdist (2026-12-06): the adapter's rows take the torch path, whose
    # bits are not invariant, and one greedy answer that turns elsewhere moves ~3 points of 192
    # tokens. The base path's bar (95%) stays in tests/engine/test_fast_path_fidelity.py.
    assert total.top1 >= 0.93
    assert total.top5 >= 0.995
