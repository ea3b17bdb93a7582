"""Tenants through LLMEngine.add_request on the tiny random Llama: a flooding tenant does not keep
another's request waiting, a request's tenant is checked, and a greedy answer is the same
whichever tenant asks and whoever else is in the batch."""

import pytest

from engine import EngineConfig, InvalidParameterError, LLMEngine, SamplingParams, Tenant

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
SHORT = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_kv_blocks=128, max_model_len=256,
                                    max_num_seqs=4))
    engine.add_request("warm-up", [1, 2, 3], SHORT)  # first-step costs are the fixture's, not a test's
    run(engine)
    return engine


def run(engine: LLMEngine) -> tuple[list[str], dict[str, list[int]]]:
    """Step to the end: request ids in the order they finished, and each one's tokens."""
    finished, tokens = [], {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids_delta)
            if out.finished:
                finished.append(out.request_id)
    return finished, tokens


def test_another_tenants_request_finishes_among_the_first_despite_a_flood(engine):
    flood, other = Tenant("user:1"), Tenant("user:2")
    for i in range(12):
        engine.add_request(f"flood-{i}", [5 + i, 6, 7, 8], SHORT, tenant=flood)
    engine.step()  # the flood holds every seat
    engine.add_request("other", [9, 10, 11, 12], SHORT, tenant=other)
    finished, _ = run(engine)

    # It took the seat of the flood's newest: it ends with the batch that was running, not after
    # the 8 flood requests queued before it.
    assert finished.index("other") < 5, finished
    engine.block_manager.check_all_free()
    assert not any(t.is_active for t in engine.scheduler.fair.tenants.values())


def test_a_greedy_answer_does_not_depend_on_the_tenant_or_the_neighbours(engine):
    engine.add_request("alone", [20, 21, 22], GREEDY)
    _, alone = run(engine)
    for i in range(4):
        engine.add_request(f"n-{i}", [30 + i, 31, 32], SHORT, tenant=Tenant("user:1"))
    engine.add_request("weighted", [20, 21, 22], GREEDY, tenant=Tenant("user:2", 4.0))
    _, crowded = run(engine)
    assert crowded["weighted"] == alone["alone"]


def test_a_request_tenant_must_be_a_tenant(engine):
    with pytest.raises(InvalidParameterError) as e:
        engine.add_request("bad", [1, 2], GREEDY, tenant="user:1")
    assert e.value.param == "tenant"
    assert not engine.has_request("bad")
