"""A speculative step's answer is the model's own (engine/speculative/verify.py): with drafts right,
half right and wrong, a request's tokens and float32 logprobs are those of decoding one token a
step, greedy and seeded, alone and beside others, chunked, preempted; stops inside an accepted run
end it there; no block leaks and the prefix cache holds the right tokens.

The drafts here come from an oracle (the answer without speculation) with tokens corrupted at
random, so every kind of verification happens on a tiny random model, whose own text never
repeats enough for prompt lookup; the bundled model's real prompt lookup is the slow test at the end.
"""

import random

import pytest

from engine import LLM, SamplingParams
from engine.kernels.cpu import decode_step
from engine.speculative.drafting import Speculator

pytestmark = pytest.mark.skipif(decode_step.library() is None,
                                reason="no C compiler or no AVX2/FMA/F16C here: no fused step, no invariance")

PROMPT = [11 + (7 * i) % 400 for i in range(45)]
OTHERS = [[30 + (i * 13 + j * 5) % 500 for j in range(3 + (i * 11) % 60)] for i in range(7)]
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=2)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=99, max_tokens=40, ignore_eos=True, logprobs=2)


def make_llm(path, **settings):
    settings = {"num_kv_blocks": 160, "max_model_len": 256, "quantization": "int4", "dtype": "bfloat16",
                **settings}
    return LLM(str(path), **settings)


def answer(out) -> list:
    return [(t.token_id, t.logprob, tuple(t.top)) for t in out.logprobs]


def with_oracle_drafts(llm, answers: dict[tuple, list[int]], seed: int = 0, wrong: float = 0.5):
    """Draft each request's next tokens from its known answer (by prompt), one token corrupted in
    ``wrong`` of the drafts (so some are accepted whole, some in part, some rejected at once)."""
    spec, rng = llm.engine.scheduler.speculator, random.Random(seed)

    def draft(seq, *, step, budget):
        ref = answers.get(tuple(seq.prompt_token_ids))
        if ref is None:
            return []
        k = min(spec.num_tokens, budget - 1, seq.max_num_tokens - seq.num_tokens - 1)
        tokens = ref[seq.num_output_tokens:seq.num_output_tokens + max(k, 0)]
        if tokens and rng.random() < wrong:
            tokens[rng.randrange(len(tokens))] = 5
        return tokens

    spec.draft = draft
    return spec


@pytest.mark.parametrize("params", [GREEDY, pytest.param(SEEDED, marks=pytest.mark.slow)], ids=["greedy", "seeded"])
def test_verified_drafts_give_the_answer_of_one_token_a_step(tiny_llama_dir, params):
    plain = make_llm(tiny_llama_dir, speculative_tokens=0).generate([PROMPT], [params])[0]
    llm = make_llm(tiny_llama_dir, speculative_tokens=6)
    spec = with_oracle_drafts(llm, {tuple(PROMPT): list(plain.token_ids)})
    out = llm.generate([PROMPT], [params])[0]
    assert answer(out) == answer(plain)
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens  # accepted and rejected both happened
    assert spec.num_drafts < 40  # fewer steps than tokens
    llm.engine.block_manager.check_all_free()


def test_drafts_verify_on_the_torch_path_too_where_the_engine_does_not_draft(tiny_llama_dir):
    """Without the fused step (dense float32 weights: the path of CUDA and the families the C step
    does not compute) the runner is not batch-invariant, and the engine does not draft: a draft's
    rows, a chunk over the cache, round otherwise than one row. The verification itself works
    there: the same tokens, and logprobs to float32 rounding."""
    settings = {"quantization": None, "dtype": "float32"}
    prompts, params = [PROMPT, OTHERS[0]], [GREEDY, GREEDY]
    plain = make_llm(tiny_llama_dir, speculative_tokens=0, **settings).generate(prompts, params)
    llm = make_llm(tiny_llama_dir, speculative_tokens=6, **settings)
    assert llm.engine.runner.fused_decode is None and not llm.engine.runner.batch_invariant
    assert llm.engine.scheduler.speculator is None
    llm.engine.scheduler.speculator = Speculator(num_tokens=6, max_decodes=4)
    spec = with_oracle_drafts(llm, {tuple(o.prompt_token_ids): list(o.token_ids) for o in plain})
    outs = llm.generate(prompts, params)
    for out, ref in zip(outs, plain):
        assert out.token_ids == ref.token_ids
        assert [t.logprob for t in out.logprobs] == pytest.approx([t.logprob for t in ref.logprobs], abs=1e-4)
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens
    llm.engine.block_manager.check_all_free()


@pytest.mark.slow
def test_the_answer_holds_beside_others_chunked_preempted_and_from_the_cache(tiny_llama_dir):
    plain = make_llm(tiny_llama_dir, speculative_tokens=0)
    params = {"greedy": GREEDY, "seeded": SEEDED}
    ref = {name: plain.generate([PROMPT] + OTHERS, [p] * 8) for name, p in params.items()}
    answers = {name: {tuple(o.prompt_token_ids): list(o.token_ids) for o in outs} for name, outs in ref.items()}
    cases = {
        "beside others": {},
        "chunked": {"max_num_batched_tokens": 7, "enable_prefix_caching": False},
        # 12 blocks for 8 requests: preempted and recomputed, drafts only into free blocks
        "preempted": {"num_kv_blocks": 14, "enable_prefix_caching": False},
    }
    for name, settings in cases.items():
        for key, p in params.items():
            llm = make_llm(tiny_llama_dir, speculative_tokens=6, speculative_max_decodes=8, **settings)
            spec = with_oracle_drafts(llm, answers[key])
            outs = llm.generate([PROMPT] + OTHERS, [p] * 8)
            assert [answer(o) for o in outs] == [answer(o) for o in ref[key]], (name, key)
            assert spec.num_accepted_tokens > 0, name
            if name == "preempted":
                assert llm.engine.scheduler.num_preemptions > 0
            llm.engine.block_manager.check_all_free()
    # the prefix cache after speculative steps: the prompt plus 30 tokens of its answer, asked
    # again, comes from blocks the drafting run registered, and answers as the plain engine does
    llm = make_llm(tiny_llama_dir, speculative_tokens=6)
    with_oracle_drafts(llm, answers["greedy"])
    llm.generate([PROMPT], [GREEDY])
    longer = PROMPT + answers["greedy"][tuple(PROMPT)][:30]
    hits = llm.engine.stats().prefix_cache_hit_tokens
    again = llm.generate([longer], [GREEDY])[0]
    assert llm.engine.stats().prefix_cache_hit_tokens - hits == 64  # 4 full blocks of 16
    assert answer(again) == answer(plain.generate([longer], [GREEDY])[0])


@pytest.mark.slow
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_drafts_over_sliding_window_block_tables(tiny_gemma3_d64_dir, params):
    """Gemma 3's window layers on blocks of their own (24-token windows; kv_pool_sizing.WindowSplit
    with 8 seats): verified drafts give the answer of one token a step, chunked, and 190 tokens
    past the window with 56 blocks, where sequences are preempted while blocks leave the window
    under drafts that are rejected."""
    long = SamplingParams(temperature=params.temperature, top_p=params.top_p, seed=params.seed,
                          max_tokens=190, ignore_eos=True, logprobs=2)
    cases = {"chunked": ({"max_num_batched_tokens": 7}, params),
             "preempted": ({"num_kv_blocks": 56}, long)}
    for name, (settings, p) in cases.items():
        settings = {"max_num_seqs": 8, "enable_prefix_caching": False, **settings}
        plain = make_llm(tiny_gemma3_d64_dir, speculative_tokens=0, **settings)
        ref = plain.generate([PROMPT] + OTHERS, [p] * 8)
        llm = make_llm(tiny_gemma3_d64_dir, speculative_tokens=6, speculative_max_decodes=8, **settings)
        assert llm.engine.runner.window_split is not None and llm.engine.scheduler.speculator is not None
        spec = with_oracle_drafts(llm, {tuple(o.prompt_token_ids): list(o.token_ids) for o in ref})
        outs = llm.generate([PROMPT] + OTHERS, [p] * 8)
        assert [answer(o) for o in outs] == [answer(o) for o in ref], name
        assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens, name
        if name == "preempted":
            assert llm.engine.scheduler.num_preemptions > 0
        llm.engine.block_manager.check_all_free()


@pytest.mark.slow
def test_a_stop_inside_an_accepted_run_ends_the_request_there(tiny_llama_dir):
    reference = make_llm(tiny_llama_dir, speculative_tokens=0).generate([PROMPT], [GREEDY])[0]
    tokens = list(reference.token_ids)
    stop = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop_token_ids=[tokens[6]])
    plain = make_llm(tiny_llama_dir, speculative_tokens=0).generate([PROMPT], [stop])[0]
    llm = make_llm(tiny_llama_dir, speculative_tokens=8)
    spec = with_oracle_drafts(llm, {tuple(PROMPT): tokens}, wrong=0.0)  # every draft right: runs of 8
    out = llm.generate([PROMPT], [stop])[0]
    assert out.token_ids == plain.token_ids and out.text == plain.text
    assert out.finish_reason == "stop" and out.token_ids[-1] == tokens[6]
    assert spec.num_accepted_tokens > len(out.token_ids) - 1  # the run went past the stop
    short = SamplingParams(temperature=0, max_tokens=13, ignore_eos=True)
    assert len(llm.generate([PROMPT], [short])[0].token_ids) == 13
    llm.engine.block_manager.check_all_free()


@pytest.mark.slow
def test_prompt_lookup_on_the_bundled_model_copies_a_passage_in_fewer_steps(smollm2_path):
    """The real proposer: correcting a passage's spelling repeats the passage, so most of the
    answer comes from accepted drafts, and the answer is the one without speculation."""
    passage = ("The lighthouse on Gull Rock was bilt in 1871 by a crew of twelve men who sailed out "
               "from the harbour every morning when the wether allowed. The keeper wrote in his log that "
               "the lamp had to be cleened twice a day, because the salt spray left a film on the glass.")
    messages = [{"role": "user", "content": f"Correct the spelling in this passage:\n\n{passage}"}]
    params = SamplingParams(temperature=0, max_tokens=80)
    plain = LLM(str(smollm2_path), num_kv_blocks=256, speculative_tokens=0).chat(messages, params)[0]
    llm = LLM(str(smollm2_path), num_kv_blocks=256)
    out = llm.chat(messages, params)[0]
    assert out.token_ids == plain.token_ids
    stats = llm.engine.stats()
    assert stats.num_spec_accepted_tokens >= len(out.token_ids) // 2, stats
    llm.engine.block_manager.check_all_free()
