"""A draft model (``speculative_model``) drafts behind the same interface as prompt lookup, and the
answer stays the target's own: greedy and seeded, token for token and logprob for logprob, with
several requests drafting at once, in a pool small enough to preempt; no block leaks in either
engine. A draft model that shares the target's weights has every draft accepted; one whose
vocabulary or tokenizer differs is refused, naming the setting.
"""

import json
import shutil

import pytest
import torch

from engine.errors import InvalidParameterError
from engine.kernels.cpu import decode_step
from tests.conftest import TINY_LLAMA_SIZES
from tests.engine.speculative.test_verification import GREEDY, SEEDED, answer, make_llm

pytestmark = pytest.mark.skipif(decode_step.library() is None,
                                reason="no C compiler or no AVX2/FMA/F16C here: no fused step, no invariance")

PROMPTS = [[11 + (7 * i) % 400 for i in range(45)], [30 + (5 * i) % 300 for i in range(20)],
           [100 + (3 * i) % 50 for i in range(33)]]


def _save(directory, model, tokenizer):
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def nudged_llama_dir(tmp_path_factory, tiny_llama_dir, smollm2_tokenizer):
    """The tiny Llama with noise on its weights: a draft model that agrees with it often, not always."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_llama_dir)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.3 * param.std())
    return _save(tmp_path_factory.mktemp("nudged_llama"), model, smollm2_tokenizer)


@pytest.mark.slow
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_draft_model_leaves_the_answer_the_targets(tiny_llama_dir, nudged_llama_dir, params):
    ref = make_llm(tiny_llama_dir, speculative_tokens=0).generate(PROMPTS, [params] * 3)
    llm = make_llm(tiny_llama_dir, speculative_tokens=5, speculative_model=str(nudged_llama_dir))
    outs = llm.generate(PROMPTS, [params] * 3)
    for out, expected in zip(outs, ref):
        assert [t[0] for t in answer(out)] == [t[0] for t in answer(expected)]
        assert [t.logprob for t in out.logprobs] == pytest.approx([t.logprob for t in expected.logprobs], abs=1e-4)
    spec = llm.engine.scheduler.speculator
    if params is GREEDY:
        assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens  # some drafts right, some wrong
    else:  # a random model's sampled tokens rarely meet the draft's argmax; verify.py's tests accept seeded drafts
        assert spec.num_draft_tokens > 0
    llm.engine.block_manager.check_all_free()
    spec.proposer.engine.block_manager.check_all_free()


@pytest.mark.slow
def test_a_draft_model_with_the_targets_weights_has_every_draft_accepted(tiny_llama_dir):
    plain = make_llm(tiny_llama_dir, speculative_tokens=0)
    ref = plain.generate([PROMPTS[0]], [GREEDY])[0]
    llm = make_llm(tiny_llama_dir, speculative_tokens=4, speculative_model=str(tiny_llama_dir))
    out = llm.generate([PROMPTS[0]], [GREEDY])[0]
    assert answer(out) == answer(ref)
    spec = llm.engine.scheduler.speculator
    assert spec.num_draft_tokens > 20 and spec.num_accepted_tokens == spec.num_draft_tokens
    # 40 tokens: the first from the prompt's step, then up to 5 a step (4 drafts and the target's)
    assert llm.engine.scheduler.num_steps < plain.engine.scheduler.num_steps / 2


@pytest.mark.slow
def test_drafting_holds_where_the_pool_preempts(tiny_llama_dir, nudged_llama_dir):
    """6 requests drafting at once in 14 blocks: preempted and recomputed, drafts only into free blocks."""
    prompts = PROMPTS + [p[::-1] for p in PROMPTS]
    settings = {"num_kv_blocks": 14, "enable_prefix_caching": False}
    ref = make_llm(tiny_llama_dir, speculative_tokens=0, **settings).generate(prompts, [GREEDY] * 6)
    llm = make_llm(tiny_llama_dir, speculative_tokens=5, speculative_max_decodes=8,
                   speculative_model=str(nudged_llama_dir), **settings)
    outs = llm.generate(prompts, [GREEDY] * 6)
    assert [[t[0] for t in answer(o)] for o in outs] == [[t[0] for t in answer(o)] for o in ref]
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.scheduler.speculator.num_accepted_tokens > 0
    llm.engine.block_manager.check_all_free()


@pytest.mark.slow
def test_a_draft_model_of_another_vocabulary_is_refused(tmp_path, tiny_llama_dir, smollm2_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    wider = _save(tmp_path / "wider", LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA_SIZES, "vocab_size": 49280})),
                  smollm2_tokenizer)
    with pytest.raises(InvalidParameterError, match=r"speculative_model.*49280 entries, this model's 49152"):
        make_llm(tiny_llama_dir, speculative_model=str(wider))

    swapped = tmp_path / "swapped"  # the same weights, two tokens' ids swapped in the tokenizer
    shutil.copytree(tiny_llama_dir, swapped)
    data = json.loads((swapped / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    first, second = (next(t for t, i in vocab.items() if i == n) for n in (300, 301))
    vocab[first], vocab[second] = 301, 300
    (swapped / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(InvalidParameterError, match=r"speculative_model.*tokenizer differs.*id 300"):
        make_llm(tiny_llama_dir, speculative_model=str(swapped))


@pytest.mark.slow
def test_the_sequences_drafting_in_a_step_draft_as_one_batch(tiny_llama_dir):
    """3 sequences, every draft of 4 accepted: one draft-engine prefill step and 3 decode steps
    serve a target step's 3 drafts (one sequence at a time, it would take 12)."""
    llm = make_llm(tiny_llama_dir, speculative_tokens=4, speculative_model=str(tiny_llama_dir))
    draft_engine = llm.engine.scheduler.speculator.proposer.engine
    outs = llm.generate(PROMPTS, [GREEDY] * 3)
    assert all(len(o.token_ids) == 40 for o in outs)
    target_steps, draft_steps = llm.engine.scheduler.num_steps, draft_engine.scheduler.num_steps
    assert draft_steps <= 4 * target_steps, (draft_steps, target_steps)
    assert llm.engine.scheduler.speculator.num_drafts >= 3 * (target_steps - 2)  # all three drafted nearly every step
