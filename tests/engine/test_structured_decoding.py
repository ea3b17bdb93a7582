"""Grammar-constrained decoding in the engine: outputs always match their constraint, whatever
shares the batch, and the unconstrained neighbours are not changed by it."""

import json
from concurrent.futures import Future

import jsonschema
import numpy as np
import pytest
import torch

from engine import LLM, InvalidParameterError, SamplingParams
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.sequence import Sequence
from engine.structured.bitmask import apply_bitmask
from engine.structured.grammar import RequestGrammar

# Every string, array and number bounded, no additional properties: a random model must end them.
SCHEMAS = {
    "nested": {"type": "object", "additionalProperties": False, "required": ["name", "address"],
               "properties": {"name": {"type": "string", "maxLength": 6},
                              "address": {"type": "object", "additionalProperties": False,
                                          "required": ["city"],
                                          "properties": {"city": {"type": "string", "maxLength": 5},
                                                         "zip": {"type": "integer", "minimum": 0,
                                                                 "maximum": 99}}}}},
    "array_enum": {"type": "object", "additionalProperties": False, "required": ["tags", "status"],
                   "properties": {"tags": {"type": "array", "maxItems": 3,
                                           "items": {"enum": ["red", "green", "blue"]}},
                                  "status": {"enum": ["open", "closed"]},
                                  "ok": {"type": "boolean"}}},
    "top_array": {"type": "array", "minItems": 1, "maxItems": 4,
                  "items": {"type": "integer", "minimum": -5, "maximum": 500}},
}


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), num_kv_blocks=128, max_model_len=256)


def _json(schema, **kw):
    return SamplingParams(structured_outputs={"json": schema}, **{"max_tokens": 200, **kw})


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_sampled_output_always_parses_and_validates_against_the_schema(tiny, name):
    schema = SCHEMAS[name]
    params = [_json(schema, temperature=1.0, seed=s) for s in range(6)]
    outs = tiny.generate([[5, 6, 7 + i] for i in range(6)], params)
    for out in outs:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)
    assert len({o.text for o in outs}) > 1  # they sampled, not one forced path


def test_regex_choice_and_json_object_constraints_hold(tiny):
    params = [SamplingParams(structured_outputs={"regex": r"[a-c]{2,4}-[0-9]{3}"}, temperature=1.0,
                             seed=1, max_tokens=50),
              SamplingParams(structured_outputs={"choice": ["yes", "no", "maybe so"]}, temperature=1.0,
                             seed=2, max_tokens=50),
              SamplingParams(structured_outputs={"json_object": True}, temperature=0, max_tokens=120)]
    regex, choice, obj = tiny.generate([[9, 10], [9, 11], [9, 12]], params)
    import re
    assert re.fullmatch(r"[a-c]{2,4}-[0-9]{3}", regex.text), regex.text
    assert choice.text in ("yes", "no", "maybe so")
    if obj.finish_reason == "stop":  # an object with free keys may run to max_tokens
        assert isinstance(json.loads(obj.text), dict)
    assert obj.text.startswith("{")


@pytest.mark.slow
def test_unconstrained_neighbours_are_unchanged_by_constrained_rows_in_their_batch(tiny):
    plain = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
             SamplingParams(temperature=1.0, seed=77, max_tokens=20, ignore_eos=True, top_p=0.9)]
    prompts = [[21, 22, 23], [31, 32]]
    alone = [o.token_ids for o in tiny.generate(prompts, plain)]
    constrained = [_json(SCHEMAS["nested"], temperature=1.0, seed=s) for s in (3, 4)]
    mixed = tiny.generate([prompts[0], [5, 5], prompts[1], [6, 6]],
                          [plain[0], constrained[0], plain[1], constrained[1]])
    assert [mixed[0].token_ids, mixed[2].token_ids] == alone
    for out in (mixed[1], mixed[3]):
        jsonschema.validate(json.loads(out.text), SCHEMAS["nested"])


@pytest.mark.slow
def test_constrained_output_survives_preemption_and_recompute(tiny_llama_dir):
    # 12 blocks of 16 tokens for 6 growing sequences: the newest are preempted and recomputed
    llm = LLM(str(tiny_llama_dir), num_kv_blocks=12, max_model_len=256)
    schema = {"type": "array", "minItems": 8, "maxItems": 8,
              "items": {"type": "string", "minLength": 2, "maxLength": 3}}
    params = [SamplingParams(structured_outputs={"json": schema}, temperature=1.0, seed=s,
                             max_tokens=150) for s in range(6)]
    outs = llm.generate([[7] * 12 for _ in range(6)], params)
    assert llm.engine.scheduler.num_preemptions > 0
    for out in outs:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)


def test_a_schema_llguidance_cannot_enforce_is_refused_naming_the_keyword():
    with pytest.raises(InvalidParameterError, match="uniqueItems") as info:
        SamplingParams(structured_outputs={"json": {"type": "array", "uniqueItems": True}})
    assert info.value.param == "structured_outputs"
    with pytest.raises(InvalidParameterError, match="exactly one"):
        SamplingParams(structured_outputs={"regex": "a", "choice": ["a"]})
    with pytest.raises(InvalidParameterError, match="ignore_eos"):
        SamplingParams(structured_outputs={"regex": "a+"}, ignore_eos=True)


def test_a_sequence_whose_grammar_is_compiling_waits_while_others_are_scheduled():
    scheduler = Scheduler(BlockManager(16, 16, True), max_num_seqs=8, max_num_batched_tokens=256)
    pending: Future = Future()
    waiting = Sequence("constrained", [1, 2, 3], SamplingParams())
    waiting.grammar = RequestGrammar(pending, compiler=None)
    scheduler.add(waiting)
    scheduler.add(Sequence("plain", [4, 5], SamplingParams()))
    first = scheduler.schedule()
    assert [e.seq.request_id for e in first.scheduled] == ["plain"]
    pending.set_result(object())  # compiled
    second = scheduler.schedule()
    assert "constrained" in [e.seq.request_id for e in second.scheduled]


def test_bitmask_sets_exactly_the_disallowed_tokens_of_constrained_rows_to_minus_infinity():
    generator = torch.Generator().manual_seed(0)
    vocab = 70  # not a multiple of 32: the last word is partly padding
    logits = torch.randn(3, vocab, generator=generator)
    bitmask = torch.randint(-2**31, 2**31 - 1, (1, 3), generator=generator, dtype=torch.int32)
    out = apply_bitmask(logits, torch.tensor([1]), bitmask)
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little")[:vocab].astype(bool)
    expected = logits.clone()
    expected[1, ~torch.from_numpy(bits)] = float("-inf")
    assert torch.equal(out, expected)
    assert torch.equal(logits[1], logits[1])  # the input is not modified
    assert not torch.isinf(logits).any()


def test_the_parallel_mask_fill_of_many_rows_equals_filling_each_row_alone(tiny):
    from engine.structured.bitmask import PARALLEL_FILL_ROWS, fill_bitmask

    compiler = tiny.engine.scheduler.grammars
    grammar = SamplingParams(structured_outputs={"json": SCHEMAS["array_enum"]}).grammar
    grammars = [compiler.submit(grammar) for _ in range(PARALLEL_FILL_ROWS + 1)]
    prefix = tiny.tokenizer.encode('{"tags": ["red", "blue"], "status": "', add_special_tokens=False)
    for i, g in enumerate(grammars):
        g.wait(30)
        assert g.ready
        g.replay(prefix[:i])  # each row at its own point of the document
    rows, together = fill_bitmask(grammars + [None])
    assert rows == list(range(len(grammars)))
    alone = torch.cat([fill_bitmask([g])[1] for g in grammars])
    assert torch.equal(together, alone)
    assert len({tuple(r.tolist()) for r in alone}) > 3  # the rows really differ


def test_each_of_n_samples_follows_its_own_matcher(tiny):
    engine = tiny.engine
    schema = {"type": "array", "minItems": 2, "maxItems": 2, "items": {"enum": ["a", "bb", "ccc"]}}
    engine.add_request("n3", [5, 6], SamplingParams(temperature=1.0, seed=3, max_tokens=40,
                                                     structured_outputs={"json": schema}), n=3)
    texts, reasons = {}, {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts[out.index] = texts.get(out.index, "") + out.text_delta
            if out.finish_reason:
                reasons[out.index] = out.finish_reason
    assert reasons == {0: "stop", 1: "stop", 2: "stop"}
    for text in texts.values():
        jsonschema.validate(json.loads(text), schema)
    assert len(set(texts.values())) > 1
