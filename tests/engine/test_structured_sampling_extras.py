"""logit_bias in the batched sampler, against the reference computation (the biased argmax), and
its limits; min_tokens and stop_token_ids as the engine applies them."""

import pytest
import torch

from engine import LLM, InvalidParameterError, SamplingParams
from engine.sampling.sampler import Sampler
from engine.sampling.sampling_metadata import SamplingMetadata


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), num_kv_blocks=64, max_model_len=256)


def _meta(params, vocab):
    n = len(params)
    return SamplingMetadata.build(params, [[]] * n, [[]] * n, [None] * n, [[]] * n, "cpu")


def test_biased_greedy_rows_pick_the_argmax_of_logits_plus_bias_and_others_are_untouched():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 100, generator=generator)
    top = logits.argmax(dim=-1)
    bias0 = {int(top[0]): -100.0, 7: 3.5}
    bias2 = {int(top[2]): -2.0, 42: 50.0, 43: 49.0}
    params = [SamplingParams(temperature=0, logit_bias=bias0), SamplingParams(temperature=0),
              SamplingParams(temperature=0, logit_bias=bias2)]
    reference = logits.clone()
    for row, bias in ((0, bias0), (2, bias2)):
        for token, value in bias.items():
            reference[row, token] += value
    out = Sampler()(logits, _meta(params, 100))
    assert out.sampled_token_ids.tolist() == reference.argmax(dim=-1).tolist()
    assert out.sampled_token_ids[1] == top[1] and out.sampled_token_ids[2] == 42


@pytest.mark.slow
def test_a_bias_of_100_forces_the_token_through_the_engine(tiny):
    out = tiny.generate([[5, 6, 7]], SamplingParams(temperature=0.9, seed=1, max_tokens=6, ignore_eos=True,
                                                     logit_bias={"1234": 100}))[0]
    assert out.token_ids == [1234] * 6  # JSON's string keys are token ids too


def test_min_tokens_and_stop_token_ids_match_the_free_greedy_run(tiny):
    free = tiny.generate([[9, 8, 7]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].token_ids
    stop = free[3]
    stopped = tiny.generate([[9, 8, 7]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                         stop_token_ids=[stop]))[0]
    first = free.index(stop)
    assert stopped.token_ids == free[:first + 1] and stopped.finish_reason == "stop"
    assert stopped.stop_reason == stop
    held = tiny.generate([[9, 8, 7]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, min_tokens=8,
                                                      stop_token_ids=[stop]))[0]
    assert len(held.token_ids) >= 8 and stop not in held.token_ids[:8]


@pytest.mark.parametrize(("bias", "words"), [
    ({5: 100.5}, "biases must be"), ({"x": 1}, "keys must be token ids"), ({-1: 1}, "keys must be token ids"),
    ([1, 2], "must be an object"), ({i: 1 for i in range(1025)}, "at most 1024"),
])
def test_out_of_range_biases_are_refused_naming_logit_bias(bias, words):
    with pytest.raises(InvalidParameterError, match=words) as info:
        SamplingParams(logit_bias=bias)
    assert info.value.param == "logit_bias"


def test_a_token_id_past_the_vocabulary_is_refused_at_admission(tiny):
    with pytest.raises(InvalidParameterError, match="vocabulary") as info:
        tiny.engine.add_request("r", [1, 2], SamplingParams(logit_bias={49152: 1}))
    assert info.value.param == "logit_bias" and not tiny.engine.has_request("r")
