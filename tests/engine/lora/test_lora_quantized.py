"""LoRA over a quantized base on the CPU: the delta is added in float on top of the int4 product;
the fused decode step (engine/models/fused_decode.py) declines every adapter row, and base rows
keep it, so a base request's tokens are the same whether or not adapters share its steps."""

import pytest

from engine import LLM, LoRARequest, SamplingParams
from engine.kernels.cpu import decode_step

from tests.engine.lora.test_lora_parity import NUM_TOKENS, tiny_lora  # noqa: F401 (fixture)
from tests.engine.test_model_families import prompts_of

pytestmark = [pytest.mark.slow, pytest.mark.skipif(decode_step.library() is None,
                                                   reason="no C compiler or no AVX2/FMA/F16C here")]
PARAMS = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)


def test_int4_base_keeps_the_fused_step_for_its_rows_only(tiny_lora):  # noqa: F811
    base, adapters = tiny_lora
    llm = LLM(base, quantization="int4", dtype="float32", num_kv_blocks=64)
    runner = llm.engine.runner
    assert runner.fused_decode is not None
    fused_rows = []
    parts = runner.fused_decode.parts  # every fused step, whole (run) or in parts, goes through it

    def counting_parts(input_ids, *args, **kwargs):  # the real step, counted
        fused_rows.append(input_ids.shape[0])
        return (yield from parts(input_ids, *args, **kwargs))

    runner.fused_decode.parts = counting_parts
    prompts = prompts_of((9, 23, 17))
    terse, chatty = (LoRARequest(n, adapters[n]) for n in ("terse", "chatty"))

    alone = [llm.generate([p], PARAMS, adapters=a)[0].token_ids
             for p, a in zip(prompts, (None, terse, chatty))]
    base_rows = len(prompts[0]) + NUM_TOKENS - 1  # batch-invariant: its prompt too, then its decodes
    assert sum(fused_rows) == base_rows  # none of the adapters' rows
    assert alone[1] != llm.generate([prompts[1]], PARAMS)[0].token_ids  # the adapter matters

    fused_rows.clear()
    mixed = [o.token_ids for o in llm.generate(prompts, PARAMS, adapters=[None, terse, chatty])]
    assert mixed == alone
    assert sum(fused_rows) == base_rows  # only the base request's rows were fused, in the mixed steps too
