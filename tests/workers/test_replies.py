"""Messages survive JSON, and a request's deltas leave in batches that add up to the whole."""

from __future__ import annotations

import json

import pytest

from engine import SamplingParams
from workers.protocol import (Chunk, ErrorInfo, GenerateRequest, ProtocolError, Reply,
                              WorkerInfo)
from workers.replies import FLUSH_INTERVAL_S, FLUSH_TOKENS, InFlight


def engine_outputs(llm, request_id: str, prompt: list[int], params: SamplingParams) -> list:
    engine = llm.engine
    engine.add_request(request_id, prompt, params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.request_id == request_id]
    return outputs


def batch(outputs, step_s: float) -> list[Chunk]:
    """Feed one output per engine step, ``step_s`` apart, sending chunks as they fall due."""
    inflight = InFlight(GenerateRequest("r", "m", [1], {}, reply_to="x"))
    chunks = []
    for i, out in enumerate(outputs):
        inflight.add(out)
        now = 100.0 + i * step_s
        if inflight.is_due(now):
            chunks.append(inflight.take_chunk(now))
    return chunks


def test_fast_steps_are_batched_first_token_alone_then_by_token_count(reference_llm):
    outputs = engine_outputs(reference_llm, "fast", [7, 8, 9],
                             SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=2))

    chunks = batch(outputs, step_s=FLUSH_INTERVAL_S / 100)

    assert [len(c.token_ids) for c in chunks] == [1, FLUSH_TOKENS, FLUSH_TOKENS,
                                                  40 - 1 - 2 * FLUSH_TOKENS]
    assert "".join(c.text for c in chunks) == "".join(o.text_delta for o in outputs)
    assert [t for c in chunks for t in c.token_ids] == [t for o in outputs for t in o.token_ids_delta]
    token_ids = [t for c in chunks for t in c.token_ids]
    assert [lp["token_id"] for c in chunks for lp in c.logprobs] == token_ids
    assert all(len(lp["top"]) == 2 for c in chunks for lp in c.logprobs)
    assert [c.finished for c in chunks] == [False, False, False, True]
    assert chunks[-1].finish_reason == "length" and chunks[-1].num_output_tokens == 40


def test_slow_steps_send_every_step(reference_llm):
    outputs = engine_outputs(reference_llm, "slow", [7, 8, 9],
                             SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))

    chunks = batch(outputs, step_s=FLUSH_INTERVAL_S * 1.5)

    assert [len(c.token_ids) for c in chunks] == [1] * 10
    assert chunks[0].logprobs is None


def test_messages_round_trip_through_json():
    chunk = Chunk("r1", "héllo", [1, 2], [{"token_id": 1, "logprob": -0.5, "top": [[1, -0.5]]}],
                  True, None, 3, 2, 0, 0.25, ErrorInfo("worker_lost", "gone"), version="7")
    reply = Reply("chunk", "w1", chunk)
    request = GenerateRequest("r1", "m", [1, 2], {"temperature": 0}, priority=2, reply_to="x", tenant="user:7",
                              tenant_weight=2.5, shared_prefix_len=2)
    info = WorkerInfo("w1", "m", "v", "h", 1, 2.0, 3.0, 8, 256, {"num_running": 1}, draining=True)

    assert Reply.from_dict(json.loads(json.dumps(reply.to_dict()))) == reply
    assert GenerateRequest.from_dict(json.loads(json.dumps(request.to_dict()))) == request
    assert WorkerInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info


@pytest.mark.parametrize("data", [
    {"model": "m", "prompt_token_ids": [1], "params": {}},  # no request_id
    {"request_id": "", "model": "m", "prompt_token_ids": [1], "params": {}},
    ["not", "an", "object"],
])
def test_malformed_requests_are_refused(data):
    with pytest.raises(ProtocolError):
        GenerateRequest.from_dict(data)


def test_a_request_without_tenancy_fields_is_the_engines_single_tenant():
    request = GenerateRequest.from_dict({"request_id": "r", "model": "m", "prompt_token_ids": [1], "params": {}})

    assert (request.tenant, request.tenant_weight, request.shared_prefix_len) == ("", 1.0, 0)


@pytest.mark.parametrize("field,value", [
    ("tenant", 7), ("tenant", None),
    ("tenant_weight", 0), ("tenant_weight", -1.5), ("tenant_weight", float("nan")), ("tenant_weight", float("inf")),
    ("tenant_weight", "2"), ("tenant_weight", True),
    ("shared_prefix_len", -1), ("shared_prefix_len", 4), ("shared_prefix_len", 1.5), ("shared_prefix_len", True),
])
def test_a_bad_tenancy_field_is_refused_naming_it(field, value):
    data = {"request_id": "r", "model": "m", "prompt_token_ids": [1, 2, 3], "params": {}, field: value}

    with pytest.raises(ProtocolError, match=field):
        GenerateRequest.from_dict(json.loads(json.dumps(data)))
