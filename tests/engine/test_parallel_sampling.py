"""n > 1: samples share the prompt's KV blocks, are distinct when seeded, and each equals running
that sample alone with its derived seed."""

import pytest

from engine import LLM, InvalidParameterError, SamplingParams
from engine.sampling.parallel_sampling import derive_seed

PROMPT = list(range(100, 150))  # 50 tokens: 3 full blocks of 16 shared, a 2-token tail recomputed
SEEDED = SamplingParams(temperature=1.0, max_tokens=10, seed=4321, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), num_kv_blocks=64, max_model_len=256, block_size=16)


@pytest.fixture(scope="module")
def tiny_no_cache(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), num_kv_blocks=64, max_model_len=256, block_size=16,
               enable_prefix_caching=False)


def _alone(llm: LLM, seed: int) -> list[int]:
    llm.engine.block_manager.reset_prefix_cache()
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=seed, ignore_eos=True)
    return llm.generate([PROMPT], params)[0].token_ids


@pytest.mark.slow
def test_three_seeded_samples_are_distinct_and_each_equals_its_sample_run_alone(tiny):
    tiny.engine.block_manager.reset_prefix_cache()
    samples = tiny.generate([PROMPT], SEEDED, n=3)

    assert [s.index for s in samples] == [0, 1, 2]
    assert len({tuple(s.token_ids) for s in samples}) == 3
    for i, sample in enumerate(samples):
        assert sample.token_ids == _alone(tiny, derive_seed(SEEDED.seed, i))
        assert sample.finish_reason == "length" and len(sample.token_ids) == 10
    assert samples[0].token_ids == _alone(tiny, SEEDED.seed)  # sample 0 is the n=1 answer


def test_the_same_seed_gives_the_same_samples_again(tiny):
    first = [s.token_ids for s in tiny.generate([PROMPT], SEEDED, n=3)]
    again = [s.token_ids for s in tiny.generate([PROMPT], SEEDED, n=3)]
    assert first == again


@pytest.mark.slow
@pytest.mark.parametrize("llm_name", ["tiny", "tiny_no_cache"])
def test_the_prompt_is_computed_once_and_every_block_is_freed_after(llm_name, request):
    llm = request.getfixturevalue(llm_name)
    engine = llm.engine
    engine.block_manager.reset_prefix_cache()
    engine.reset_counters()
    llm.generate([PROMPT], SEEDED, n=4)

    tail = len(PROMPT) - (len(PROMPT) - 1) // 16 * 16  # what each forked sample computes itself
    assert engine.num_prompt_tokens == len(PROMPT) + 3 * tail  # 56, not 4 * 50 = 200
    # One prefix-cache query for the request (its samples do not query it again).
    assert engine.block_manager.num_prefix_queried_tokens == len(PROMPT)
    assert engine.num_generation_tokens == 4 * 10
    engine.block_manager.check_all_free()


def test_forked_samples_reference_the_prompts_blocks_while_they_run(tiny):
    engine = tiny.engine
    engine.add_request("shared", PROMPT, SEEDED, n=3)
    engine.step()  # sample 0 computes the prompt; the others are forked from it
    engine.step()  # the forked samples compute their tails
    seqs = [engine._requests[i].seq for i in ("shared", "shared#1", "shared#2")]
    shared = seqs[0].block_table[:3]
    assert all(s.block_table[:3] == shared for s in seqs)
    assert len({s.block_table[3] for s in seqs}) == 3  # each its own tail block
    assert all(engine.block_manager.blocks[b].ref_count == 3 for b in shared)
    engine.abort_request("shared")
    while engine.has_unfinished_requests():
        engine.step()
    engine.block_manager.check_all_free()


def test_aborting_the_request_aborts_all_its_samples_even_before_they_fork(tiny):
    engine = tiny.engine
    engine.add_request("gone", PROMPT, SEEDED, n=3)
    assert engine.has_request("gone") and not engine.has_request("gone#1")
    engine.abort_request("gone")
    outs = engine.step()
    assert sorted(o.index for o in outs) == [0, 1, 2]
    assert all(o.finish_reason == "abort" for o in outs)
    assert [o.finished for o in outs] == [False, False, True]
    assert not engine.has_request("gone") and not engine.has_unfinished_requests()
    engine.block_manager.check_all_free()


def test_aborting_mid_generation_stops_every_sample(tiny):
    engine = tiny.engine
    engine.add_request("mid", PROMPT, SamplingParams(temperature=1.0, max_tokens=50, ignore_eos=True), n=3)
    for _ in range(4):
        engine.step()
    engine.abort_request("mid")
    outs = [o for o in engine.step() if o.request_id == "mid"]
    assert sorted(o.index for o in outs if o.finish_reason == "abort") == [0, 1, 2]
    assert outs[-1].finished and not engine.has_unfinished_requests()
    engine.block_manager.check_all_free()


def test_streamed_outputs_name_their_sample_and_only_the_last_is_finished(tiny):
    engine = tiny.engine
    engine.add_request("idx", PROMPT, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), n=2)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    tokens = {i: [t for o in outs if o.index == i for t in o.token_ids_delta] for i in (0, 1)}
    assert tokens[0] == tokens[1] and len(tokens[0]) == 5  # greedy: identical samples
    assert [o.finished for o in outs].count(True) == 1 and outs[-1].finished
    assert sorted(o.index for o in outs if o.finish_reason) == [0, 1]


def test_n_out_of_range_is_refused_naming_n(tiny):
    for bad in (0, 65, True, "2"):
        with pytest.raises(InvalidParameterError) as exc:
            tiny.engine.add_request(f"bad-{bad!r}", PROMPT, SEEDED, n=bad)
        assert exc.value.param == "n"
    assert not tiny.engine.has_unfinished_requests()


def test_a_sample_that_fails_fails_its_request_alone_and_frees_every_block(tiny):
    engine = tiny.engine
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    [want] = tiny.generate([[7, 8, 9]], greedy)
    engine.add_request("grp", PROMPT, SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True), n=3)
    engine.add_request("solo", [7, 8, 9], greedy)
    outs = engine.step() + engine.step()  # forked; every sample has its first token

    def broken(token_ids):
        raise RuntimeError("injected detokenizer fault")
    engine._requests["grp#1"].detokenizer.add_tokens = broken
    while engine.has_unfinished_requests():
        outs += engine.step()

    grp = [o for o in outs if o.request_id == "grp"]
    assert [o.finish_reason for o in grp if o.finish_reason] == ["error"]
    assert grp[-1].finished and grp[-1].index == 1 and grp[-1].error
    assert [t for o in outs if o.request_id == "solo" for t in o.token_ids_delta] == want.token_ids
    engine.block_manager.check_all_free()
