"""Batch invariance (engine.config ``batch_invariant``, on by default): a request's tokens are the
same bits alone, beside 1..31 other requests of other lengths, with its prompt found in the
prefix cache or computed whole, its prompt chunked at several budgets, on one thread or two, and
preempted then recomputed; greedy and seeded sampling alike. Where the fused CPU step runs
(int4 projections on the engine's own kernel), every row of a step, prompt tokens included,
takes its per-row arithmetic (engine/kernels/cpu/decode_step.c's header says why that is
row-invariant). Tiny random int4 Llama and Gemma 3 here; the bundled SmolLM2 in the slow test at
the end."""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.kernels.cpu import decode_step

pytestmark = pytest.mark.skipif(decode_step.library() is None,
                                reason="no C compiler or no AVX2/FMA/F16C here: no fused step")

PROMPT = [11 + (7 * i) % 400 for i in range(45)]  # 45 tokens: two whole blocks of 16 and a part
OTHERS = [[30 + (i * 13 + j * 5) % 500 for j in range(3 + (i * 11) % 60)] for i in range(31)]
# Each token's log-probability too: a random tiny model's greedy tokens have wide margins, so the
# same tokens alone would not show a path that rounds differently; the same float32 logprobs do.
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=2)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=32, ignore_eos=True, logprobs=2)


# KV pools small enough that the last of 8 requests is preempted
PREEMPTING_BLOCKS = {"tiny_llama_dir": 12, "tiny_gemma3_d64_dir": 8}


def make_llm(path, dtype, **settings):
    # 32 seats, the most requests a call sends: Gemma 3's window layers keep a window for each
    # and the rest of the pool goes to long contexts (kv_pool_sizing.window_split)
    settings = {"num_kv_blocks": 160, "max_model_len": 256, "max_num_seqs": 1 + len(OTHERS), **settings}
    return LLM(str(path), quantization="int4", dtype=dtype, **settings)


def tokens(llm, params, others=()):
    return answer(llm.generate([PROMPT, *others], [params] * (1 + len(others)))[0])


def answer(out) -> list:
    """Its tokens, each with its log-probability and its top alternatives', as computed."""
    return [(t.token_id, t.logprob, tuple(t.top)) for t in out.logprobs]


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "params"), [("bfloat16", GREEDY), ("float32", GREEDY), ("bfloat16", SEEDED)],
                         ids=["bf16-greedy", "fp32-greedy", "bf16-seeded"])
@pytest.mark.parametrize("checkpoint", ["tiny_llama_dir", "tiny_gemma3_d64_dir"])
def test_a_request_is_the_same_alone_cached_beside_others_chunked_threaded_and_preempted(
        checkpoint, dtype, params, request):
    """Gemma 3 too: its 45-token prompt passes the 24-token window of its sliding layers, whose
    K/V live in a pool of their own (blocks that left the window freed)."""
    tiny_llama_dir = request.getfixturevalue(checkpoint)
    llm = make_llm(tiny_llama_dir, dtype)
    assert llm.engine.runner.batch_invariant
    alone = tokens(llm, params)
    assert len(alone) == 32 and all(len(top) == 2 for _, _, top in alone)

    assert tokens(llm, params) == alone  # its first 32 prompt tokens from the prefix cache now
    assert llm.engine.stats().prefix_cache_hit_tokens >= 32
    for k in (1, 7, 31):  # beside others of other lengths (its prompt cached)
        assert tokens(llm, params, OTHERS[:k]) == alone, f"beside {k}"
    # its prompt computed whole again, in a step of 32 prompts, on one thread
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert tokens(make_llm(tiny_llama_dir, dtype), params, OTHERS) == alone, "one thread, uncached"
    finally:
        torch.set_num_threads(threads)
    for budget in (5, 33):  # the prompt cut into chunks of at most this many tokens
        chunked = make_llm(tiny_llama_dir, dtype, max_num_batched_tokens=budget,
                           enable_prefix_caching=False)
        assert tokens(chunked, params, OTHERS[:3]) == alone, f"chunks of {budget}"
    # 12 blocks of 16 tokens (Gemma: 8, one pool at that size) for 8 requests of ~80 tokens each,
    # this one the last to arrive (the first preempted): its prompt and output so far recomputed
    # as a prefill, maybe more than once
    small = make_llm(tiny_llama_dir, dtype, num_kv_blocks=PREEMPTING_BLOCKS[checkpoint],
                     enable_prefix_caching=False)
    scheduler, victims = small.engine.scheduler, []
    preempt = scheduler._preempt
    scheduler._preempt = lambda seq: (victims.append(seq.request_id), preempt(seq))
    out = small.generate(OTHERS[20:27] + [PROMPT], [params] * 8)[-1]
    assert out.request_id in victims, victims  # it was preempted
    assert answer(out) == alone, "preempted"
    small.engine.block_manager.check_all_free()


@pytest.mark.slow
def test_the_mode_holds_only_where_the_fused_step_runs_and_can_be_turned_off(tiny_llama_dir):
    assert not make_llm(tiny_llama_dir, "float32", batch_invariant=False).engine.runner.batch_invariant
    assert not LLM(str(tiny_llama_dir), quantization="none", num_kv_blocks=64,
                   max_model_len=256).engine.runner.batch_invariant  # float projections: torch path
    assert not make_llm(tiny_llama_dir, "bfloat16", kv_cache_dtype="int8").engine.runner.batch_invariant
    # off, prompts take the torch path again, and answer within its rounding of the same model
    on = tokens(make_llm(tiny_llama_dir, "float32"), GREEDY)
    off = tokens(make_llm(tiny_llama_dir, "float32", batch_invariant=False), GREEDY)
    assert on[:8] == off[:8]


@pytest.mark.slow
def test_the_bundled_models_greedy_chat_answer_is_the_same_with_its_prompt_cached(smollm2_path):
    """The report that opened this (issue #30): "Say hello." at temperature 0 answered one way
    on a fresh engine and another once its prompt's first blocks came from the prefix cache."""
    llm = LLM(str(smollm2_path), num_kv_blocks=256)
    messages = [{"role": "user", "content": "Say hello."}]
    params = SamplingParams(temperature=0, max_tokens=48)
    first = llm.chat(messages, params)[0].text
    again = llm.chat(messages, params)[0].text
    beside = llm.chat([messages] + [[{"role": "user", "content": f"Tell me about {w}."}]
                                    for w in ("cats", "the sea", "Rome")], params)[0].text
    assert llm.engine.stats().prefix_cache_hit_tokens > 0
    assert again == first and beside == first
