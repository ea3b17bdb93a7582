"""SamplingParams refuses every value outside the published SAMPLING_LIMITS, naming the field."""

import math

import pytest

from engine import InvalidParameterError, SamplingParams
from engine.sampling_params import SAMPLING_LIMITS

SCALARS = {name: limit for name, limit in SAMPLING_LIMITS.items() if limit.max_items is None}


def params(name, value):
    extra = {"max_tokens": None} if name == "min_tokens" else {}  # min_tokens <= max_tokens
    return SamplingParams(**{name: value}, **extra)


def refused(name, value):
    with pytest.raises(InvalidParameterError) as e:
        params(name, value)
    assert e.value.param == name
    assert len(str(e.value)) < 200  # a huge value is not echoed whole
    return e.value


@pytest.mark.parametrize("name", SCALARS)
def test_each_numeric_field_accepts_its_bounds_and_refuses_beyond(name):
    limit = SCALARS[name]
    params(name, limit.high)
    if not limit.low_exclusive:
        params(name, limit.low)
    step = 1 if limit.kind is int else 1e-6
    refused(name, limit.high + step)
    refused(name, limit.low if limit.low_exclusive else limit.low - step)
    refused(name, True)
    refused(name, "1")
    if limit.kind is float:
        for value in (math.nan, math.inf, -math.inf):
            refused(name, value)
    else:
        refused(name, 1.5)


@pytest.mark.parametrize("name", ["top_k", "seed", "max_tokens", "min_tokens", "logprobs"])
def test_integers_far_outside_64_bits_are_refused_with_a_short_message(name):
    refused(name, 10**5000)  # str() of it would raise on Python >= 3.11
    refused(name, -10**5000)


def test_stop_strings_are_bounded_in_count_and_length():
    limit = SAMPLING_LIMITS["stop"]
    SamplingParams(stop=["x" * limit.high] * limit.max_items)
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(stop=["x"] * (limit.max_items + 1))
    assert e.value.param == "stop"
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(stop="x" * (limit.high + 1))
    assert e.value.param == "stop"
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(stop=7)
    assert e.value.param == "stop"


def test_stop_token_ids_are_bounded_in_count_and_value():
    limit = SAMPLING_LIMITS["stop_token_ids"]
    SamplingParams(stop_token_ids=[limit.high] * limit.max_items)
    for bad in ([0] * (limit.max_items + 1), [-1], [limit.high + 1], [True], [1.0]):
        with pytest.raises(InvalidParameterError) as e:
            SamplingParams(stop_token_ids=bad)
        assert e.value.param == "stop_token_ids"


@pytest.mark.parametrize("flag", ["ignore_eos", "skip_special_tokens", "include_stop_str_in_output"])
def test_flags_must_be_booleans(flag):
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(**{flag: "no"})
    assert e.value.param == flag


def test_a_field_changed_after_construction_is_caught_by_validate():
    p = SamplingParams()
    p.top_k = 2**64
    with pytest.raises(InvalidParameterError) as e:
        p.validate()
    assert e.value.param == "top_k"
