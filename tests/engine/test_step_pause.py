"""A long step paused between layers for another tenant's newcomer (LLMEngine.step, engine/runtime/
parts.py, decode_step.c's pagoda_decode_layers), on the tiny random Llama over the fused CPU step.

The newcomer's first token comes back from the step() call in which it arrived; the paused step
ends at the next call; every greedy answer is the one it is without pausing; a request aborted
while its step is paused stops when the step ends, and no block is left held."""

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams, Tenant
from engine.kernels.cpu import decode_step
from engine.models import fused_decode
from engine.scheduling.input_batch import build_input_batch
from tests.engine.test_fused_decode import BLOCK, MANY, _decode, _entry, _prefill, _runner, _sequences

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(decode_step.library() is None, reason="no C compiler or no AVX2/FMA/F16C here")]

FLOOD = 12  # rows in the flood's steps: above fused_decode.PAUSABLE_ROWS
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
FLOODER, NEWCOMER = Tenant("user:1"), Tenant("user:2")


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), quantization="int4", num_kv_blocks=128,
                                    max_model_len=256, max_num_seqs=FLOOD + 4))
    assert engine.runner.fused_decode is not None and engine.runner.batch_invariant
    assert FLOOD >= fused_decode.PAUSABLE_ROWS
    return engine


def flood(engine: LLMEngine) -> dict[str, list[int]]:
    """The flood, stepped until its prompts are computed and the batch decodes: its tokens so far."""
    for i in range(FLOOD):
        engine.add_request(f"flood-{i}", [5 + i, 6, 7, 8 + i], GREEDY, tenant=FLOODER)
    tokens: dict[str, list[int]] = {}
    for _ in range(2):
        for o in engine.step():
            tokens.setdefault(o.request_id, []).extend(o.token_ids_delta)
    return tokens


def drain(engine: LLMEngine, tokens: dict[str, list[int]], calls: list[set[str]]) -> None:
    while engine.has_unfinished_requests():
        out = engine.step()
        calls.append({o.request_id for o in out if o.token_ids_delta})
        for o in out:
            tokens.setdefault(o.request_id, []).extend(o.token_ids_delta)


def reference(engine: LLMEngine) -> dict[str, list[int]]:
    """The same requests, the newcomer added between steps, nothing paused."""
    engine.arrivals = None
    tokens = flood(engine)
    engine.add_request("newcomer", [40, 41, 42], GREEDY, tenant=NEWCOMER)
    drain(engine, tokens, [])
    return tokens


def test_a_newcomer_runs_part_way_through_a_step_and_nothing_changes(engine):
    expected = reference(engine)
    tokens = flood(engine)
    asked = []

    def arrivals():  # the worker's look at its queue, between two parts of the flood's step
        asked.append(True)
        if len(asked) == 1:
            engine.add_request("newcomer", [40, 41, 42], GREEDY, tenant=NEWCOMER)

    engine.arrivals = arrivals
    try:
        calls: list[set[str]] = []
        drain(engine, tokens, calls)
    finally:
        engine.arrivals = None
    assert asked, "the flood's step never asked"
    # the call it arrived in returned its first token, and no flood token: that step was paused
    assert calls[0] == {"newcomer"}, calls[:3]
    assert {f"flood-{i}" for i in range(FLOOD)} <= calls[1], calls[:3]
    assert tokens == expected
    engine.block_manager.check_all_free()


def test_a_request_aborted_while_its_step_is_paused_stops_when_the_step_ends(engine):
    flood(engine)
    engine.arrivals = lambda: (engine.has_request("newcomer")
                               or engine.add_request("newcomer", [40, 41], GREEDY, tenant=NEWCOMER))
    try:
        first = engine.step()  # the newcomer's step; the flood's waits part-way
        assert {o.request_id for o in first} == {"newcomer"}
        held = engine.block_manager.num_free_blocks
        engine.abort_request("flood-3")  # its K/V are being written: it stops at the step's end
        assert engine.block_manager.num_free_blocks == held
        second = engine.step()
        assert all(o.request_id != "flood-3" or not o.finished for o in second)
        third = engine.step()
        aborted = [o for o in third if o.request_id == "flood-3"]
        assert aborted and aborted[0].finished and aborted[0].finish_reason == "abort"
        drain(engine, {}, [])
    finally:
        engine.arrivals = None
    engine.block_manager.check_all_free()


def test_the_newcomer_evicts_none_of_the_paused_steps_sequences(tiny_llama_dir):
    """Every seat is taken by the paused step's sequences: the step goes on, the newcomer waits for
    its end (then takes a seat from the flood, as it would have), and the answers are the same."""
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), quantization="int4", num_kv_blocks=128,
                                    max_model_len=256, max_num_seqs=FLOOD))
    expected = reference(engine)
    tokens = flood(engine)
    engine.arrivals = lambda: (engine.has_request("newcomer")
                               or engine.add_request("newcomer", [40, 41, 42], GREEDY, tenant=NEWCOMER))
    calls: list[set[str]] = []
    drain(engine, tokens, calls)
    # it paused, found no seat for the newcomer outside the step and went on at once; the next
    # step is the newcomer's, on a seat taken from the flood
    assert calls[0] == {f"flood-{i}" for i in range(FLOOD)}, calls[:2]
    assert calls[1] == {"newcomer"}, calls[:2]
    assert tokens == expected
    engine.block_manager.check_all_free()


def test_fused_parts_give_the_whole_steps_bits_with_other_steps_between_them(tiny_llama_dir):
    """The fused step in parts, whole steps of other sizes run between them: the whole step's bits."""
    for dtype in ("float32", "bfloat16"):
        runner = _runner(tiny_llama_dir, dtype)
        seqs = _sequences(lengths=MANY)
        _prefill(runner, seqs)
        whole = _decode(runner, seqs)
        entries = [_entry(t, b, len(t) - 1, 1) for t, b in seqs]
        batch = build_input_batch(entries, BLOCK, runner.device, False, fused_decode=True)
        parts = runner.fused_decode.parts(batch.input_ids, batch.positions, batch.meta.slot_mapping,
                                          batch.meta, pause=lambda: True)
        paused = 0
        with torch.inference_mode():
            while True:
                try:
                    next(parts)
                except StopIteration as done:
                    result = done.value
                    break
                paused += 1
                _decode(runner, seqs[:3])  # a whole step between the parts: its own work area
                _decode(runner, seqs)
        assert paused >= 1
        assert torch.equal(result, whole), dtype


def test_a_failing_arrivals_hook_fails_no_request(engine):
    """The caller's hook raising between parts: the step goes on whole, its answers unchanged."""
    expected = reference(engine)
    tokens = flood(engine)

    def arrivals():
        raise RuntimeError("the transport's bug")

    engine.arrivals = arrivals
    try:
        engine.add_request("newcomer", [40, 41, 42], GREEDY, tenant=NEWCOMER)
        drain(engine, tokens, [])
    finally:
        engine.arrivals = None
    assert tokens == expected
    assert engine.is_healthy
    engine.block_manager.check_all_free()
