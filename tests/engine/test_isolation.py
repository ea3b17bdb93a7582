"""No request can hurt another: refused before admission, admitted atomically, failed alone.

Faults are injected (a sampler, metadata builder, forward pass or detokenizer that raises for one
request) so that isolation is proven without relying on a gap in validation.
"""

import pytest

from engine import LLM, InvalidParameterError, SamplingParams
from engine.outputs import REQUEST_FAILED, FinishReason
from engine.sampling_params import SAMPLING_LIMITS

NEIGHBOURS = {"a": ([5, 6, 7], 12), "b": ([8] * 30, 9), "c": ([9, 10] * 20, 15)}


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), num_kv_blocks=64, max_model_len=256).engine


@pytest.fixture(scope="module")
def alone(engine):
    """The neighbours' greedy tokens when no bad request ever existed."""
    outs = run(engine)
    return {rid: tokens(outs, rid) for rid in NEIGHBOURS}


def drain(engine) -> dict[str, list]:
    outs: dict[str, list] = {}
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            return outs
        for o in engine.step():
            outs.setdefault(o.request_id, []).append(o)
    raise AssertionError("the engine never ran out of work (a ghost request?)")


def run(engine, bad_prompt=None, bad_params=None):
    """Queue a, the bad request (if any), b, c; run them all to completion."""
    for i, (rid, (prompt, n)) in enumerate(NEIGHBOURS.items()):
        engine.add_request(rid, prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        if i == 0 and bad_prompt is not None:
            engine.add_request("bad", bad_prompt, bad_params)
    return drain(engine)


def tokens(outs, rid) -> list[int]:
    return [t for o in outs[rid] for t in o.token_ids_delta]


def bad_rows_raise_in_sampler(engine, monkeypatch):
    """The sampler raises for any batch holding the bad request's rows once it has 3 tokens."""
    runner, sampler = engine.runner, engine.runner.sampler

    def faulty(logits, meta):
        bad = engine._requests.get("bad")
        gen = runner.generators.get("bad")
        if bad and bad.seq.num_output_tokens >= 3 and any(g is gen for g in meta.generators):
            raise RuntimeError("injected sampler fault")
        return sampler(logits, meta)

    monkeypatch.setattr(runner, "sampler", faulty)


def bad_rows_raise_building_metadata(engine, monkeypatch):
    build = engine.runner._sampling_metadata

    def faulty(entries, *args):
        if any(e.seq.request_id == "bad" for e in entries):
            raise OverflowError("injected metadata fault")
        return build(entries, *args)

    monkeypatch.setattr(engine.runner, "_sampling_metadata", faulty)


def bad_tokens_raise_in_forward(engine, monkeypatch):
    model = engine.runner.model
    forward = model.forward

    def faulty(input_ids, *args, **kwargs):
        if (input_ids == 777).any():
            raise RuntimeError("injected forward fault")
        return forward(input_ids, *args, **kwargs)

    monkeypatch.setattr(model, "forward", faulty)


def bad_detokenizer_raises(engine, monkeypatch):
    def faulty(token_ids):
        raise UnicodeDecodeError("utf-8", b"", 0, 1, "injected detokenizer fault")

    original = engine.add_request

    def add_request(request_id, *args, **kwargs):
        result = original(request_id, *args, **kwargs)
        if request_id == "bad":
            monkeypatch.setattr(engine._requests["bad"].detokenizer, "add_tokens", faulty)
        return result

    monkeypatch.setattr(engine, "add_request", add_request)


@pytest.mark.slow
@pytest.mark.parametrize("inject", [bad_rows_raise_in_sampler, bad_rows_raise_building_metadata,
                                    bad_tokens_raise_in_forward, bad_detokenizer_raises])
def test_failing_request_is_failed_alone_while_neighbours_continue(engine, alone, inject, monkeypatch):
    free_before = engine.block_manager.num_free_blocks
    inject(engine, monkeypatch)
    bad_params = SamplingParams(temperature=0, seed=7, max_tokens=40, ignore_eos=True)
    outs = run(engine, [777, 778, 779], bad_params)

    bad = outs["bad"]
    assert [o.finished for o in bad].count(True) == 1 and bad[-1].finished
    assert bad[-1].finish_reason == FinishReason.ERROR and bad[-1].error == REQUEST_FAILED
    assert bad[-1].num_output_tokens < 40
    for rid, expected in alone.items():
        assert tokens(outs, rid) == expected, rid
        assert outs[rid][-1].finish_reason == "length" and outs[rid][-1].error is None
    assert engine.is_healthy
    assert not engine.has_unfinished_requests() and "bad" not in engine.runner.generators
    assert engine.block_manager.num_free_blocks == free_before
    engine.block_manager.check_all_free()


def test_engine_that_cannot_run_any_request_says_it_is_unhealthy(engine, monkeypatch):
    free_before = engine.block_manager.num_free_blocks

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(engine.runner.model, "forward", broken)
    outs = run(engine)
    assert all(o[-1].finish_reason == FinishReason.ERROR for o in outs.values())
    assert not engine.is_healthy and "RuntimeError" in engine.health_error
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == free_before
    monkeypatch.undo()
    assert engine.check_health() and engine.is_healthy and engine.health_error is None
    engine.block_manager.check_all_free()


def test_unbounded_top_k_is_refused_before_admission(engine, alone):
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(temperature=1.0, top_k=2**64)
    assert e.value.param == "top_k"
    # Set after construction: the engine checks again at admission.
    params = SamplingParams(temperature=1.0)
    params.top_k = 2**64
    with pytest.raises(InvalidParameterError) as e:
        engine.add_request("huge-top-k", [1, 2, 3], params)
    assert e.value.param == "top_k" and not engine.has_unfinished_requests()
    # The largest allowed top_k builds the batch's int64 tensor and samples.
    biggest = SamplingParams(temperature=1.0, top_k=SAMPLING_LIMITS["top_k"].high, max_tokens=3,
                             ignore_eos=True)
    outs = run(engine, [1, 2, 3], biggest)
    assert len(tokens(outs, "bad")) == 3
    assert {rid: tokens(outs, rid) for rid in NEIGHBOURS} == alone


@pytest.mark.parametrize("seed", [2**64, -2**63 - 1])
def test_seed_outside_64_bits_leaves_no_ghost(engine, seed):
    free_before = engine.block_manager.num_free_blocks
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(seed=seed)
    assert e.value.param == "seed"
    params = SamplingParams(seed=1)
    params.seed = seed
    with pytest.raises(InvalidParameterError):
        engine.add_request("ghost", [1, 2, 3], params)
    assert not engine.has_unfinished_requests() and not engine.has_request("ghost")
    assert engine.step() == [] and engine.block_manager.num_free_blocks == free_before


def test_seeds_at_both_ends_of_the_range_are_served(engine):
    for seed in (SAMPLING_LIMITS["seed"].low, SAMPLING_LIMITS["seed"].high):
        engine.add_request(f"seed-{seed}", [4, 5], SamplingParams(seed=seed, max_tokens=2,
                                                                  ignore_eos=True))
    outs = drain(engine)
    assert all(len(tokens(outs, rid)) == 2 for rid in outs)


def test_add_request_that_fails_midway_leaves_nothing_behind(engine, monkeypatch):
    free_before = engine.block_manager.num_free_blocks

    def full(seq):
        raise MemoryError("injected")

    monkeypatch.setattr(engine.scheduler, "add", full)
    with pytest.raises(MemoryError):
        engine.add_request("half", [1, 2, 3], SamplingParams(seed=3))
    monkeypatch.undo()
    assert not engine.has_unfinished_requests() and "half" not in engine.runner.generators
    assert engine.block_manager.num_free_blocks == free_before
    engine.add_request("half", [1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    assert len(tokens(drain(engine), "half")) == 2
