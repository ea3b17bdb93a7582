"""Every number and list of the API has a range, refused with a 400 naming the parameter, and no
hostile body (deep nesting, lone surrogates, huge numbers) gets anything but a 400 OpenAI error."""

import json

import pytest
from django.contrib.auth import get_user_model

from engine.sampling_params import SAMPLING_LIMITS, SamplingParams
from webapp.keys.services import apikey_create
from webapp.openai_api.serializers import MAX_MESSAGES
from webapp.usage.models import UsageRecord

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def key(workerless_model):
    return apikey_create(owner=get_user_model().objects.create_user("alice"), name="k")[1]


def post(client, url, body, key):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")


def assert_invalid(response, param):
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_parameter", param)
    return error


def chat(**fields):
    return {"model": "tiny", "messages": HELLO, **fields}


OUTSIDE = [
    ("seed", 2**64), ("seed", -2**63 - 1), ("seed", 10**300), ("top_k", 2**31), ("top_k", -2),
    ("max_tokens", 2**31), ("max_tokens", 0), ("temperature", 2.01), ("temperature", -0.1), ("top_p", 0),
    ("top_p", 1.5), ("min_p", 1.1), ("repetition_penalty", 0), ("repetition_penalty", 10.5),
    ("presence_penalty", 2.5), ("frequency_penalty", -3), ("priority", 2**31), ("n", 17), ("n", 0),
    ("max_completion_tokens", 2**31), ("top_k", "40"), ("seed", 1.5), ("temperature", True),
    ("stop", ["x" * 1025]), ("stop", ["s"] * 17), ("user", "u" * 257), ("model", "m" * 201),
    ("temperature", float("inf")), ("max_tokens", float("nan")),
]


@pytest.mark.parametrize(("param", "value"), OUTSIDE, ids=[f"{p}={str(v)[:12]}" for p, v in OUTSIDE])
def test_a_value_outside_its_range_gets_400_naming_it(client, key, param, value):
    body = json.dumps(chat(**{param: value}), allow_nan=True)  # NaN and Infinity: Python's json reads them

    assert_invalid(post(client, CHAT, body, key), param)
    assert UsageRecord.objects.get().error_code == "invalid_parameter"


def test_the_api_ranges_are_never_wider_than_the_engines(client, key):
    """The extreme values the API lets through are values SamplingParams accepts."""
    extremes = {"seed": [-2**63, 2**64 - 1], "top_k": [-1, 2**31 - 1], "max_tokens": [1, 2**31 - 1],
                "temperature": [0, 2], "top_p": [1e-9, 1], "min_p": [0, 1], "repetition_penalty": [1e-9, 10],
                "presence_penalty": [-2, 2], "frequency_penalty": [-2, 2],
                "stop": [["x" * SAMPLING_LIMITS["stop"].high] * SAMPLING_LIMITS["stop"].max_items]}
    for param, values in extremes.items():
        for value in values:
            response = post(client, CHAT, chat(**{param: value}), key)
            assert response.status_code == 503 and response.json()["error"]["code"] == "no_worker", (param, value)
            SamplingParams(**{param: value})  # raises if the engine would refuse it


@pytest.mark.parametrize(("body", "param"), [
    (chat(messages=HELLO * (MAX_MESSAGES + 1)), "messages"),
    (chat(messages=[{"role": "user", "content": "hi", "name": "n" * 65}]), "messages[0].name"),
    (chat(messages=[{"role": "user", "content": "hi", "name": 7}]), "messages[0].name"),
    (chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}] * 2049}]), "messages[0].content"),
    (chat(messages=[{"role": "r" * 10_000, "content": "hi"}]), "messages[0].role"),
    (chat(top_logprobs=21, logprobs=True), "top_logprobs"),
    ({"model": "tiny", "prompt": [1, 2**31]}, "prompt"),
    ({"model": "tiny", "prompt": [1, -1]}, "prompt"),
    ({"model": "tiny", "prompt": "x", "logprobs": 21}, "logprobs"),
])
def test_list_lengths_and_items_have_caps(client, key, body, param):
    url = COMPLETIONS if "prompt" in body else CHAT

    error = assert_invalid(post(client, url, body, key), param)
    assert len(error["message"]) < 300  # a hostile value is never echoed back at length


@pytest.mark.parametrize("depth", [33, 1_000, 100_000])
def test_json_nested_deeply_gets_400_not_a_500(client, key, depth):
    body = '{"model": "tiny", "messages": ' + "[" * depth + "]" * depth + "}"

    error = assert_invalid(post(client, CHAT, body, key), "messages" if depth <= 900 else None)
    assert "nested too deeply" in error["message"]
    assert UsageRecord.objects.get().error_code == "invalid_parameter"


@pytest.mark.parametrize(("url", "body", "param"), [
    (CHAT, '{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}', "model"),
    (CHAT, '{"model": "tiny", "user": "\\udfff", "messages": [{"role": "user", "content": "hi"}]}', "user"),
    (CHAT, '{"model": "tiny", "messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages[0].content"),
    (CHAT, '{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
     "messages[0].content[0].text"),
    (CHAT, '{"model": "tiny", "messages": [{"role": "user", "content": "hi", "name": "\\ud800"}]}',
     "messages[0].name"),
    (CHAT, '{"model": "tiny", "stop": ["\\ud800"], "messages": [{"role": "user", "content": "hi"}]}', "stop[0]"),
    (CHAT, '{"model": "tiny", "\\ud800": 1, "messages": [{"role": "user", "content": "hi"}]}', None),
    (COMPLETIONS, '{"model": "tiny", "prompt": "\\ud83d"}', "prompt"),
])
def test_a_lone_surrogate_gets_400_naming_the_field_and_a_usage_record(client, key, url, body, param):
    error = assert_invalid(post(client, url, body, key), param)

    assert "Unicode" in error["message"]
    record = UsageRecord.objects.get()
    assert (record.status, record.error_code, record.end_user) == ("error", "invalid_parameter", "")


@pytest.mark.parametrize(("url", "body", "param"), [
    (CHAT, '{"model": "tiny\\u0000", "messages": [{"role": "user", "content": "hi"}]}', "model"),
    (CHAT, '{"model": "tiny", "messages": [{"role": "user", "content": "a\\u0000b"}]}', "messages[0].content"),
    (COMPLETIONS, '{"model": "tiny", "prompt": "\\u0000", "user": "x"}', "prompt"),
])
def test_a_nul_character_gets_400_naming_the_field_and_a_usage_record(client, key, url, body, param):
    """PostgreSQL's text cannot hold U+0000: found by the fuzz suite's PostgreSQL run (a 500)."""
    error = assert_invalid(post(client, url, body, key), param)

    assert "NUL" in error["message"]
    record = UsageRecord.objects.get()
    assert (record.status, record.error_code) == ("error", "invalid_parameter")


def test_a_valid_astral_character_is_not_a_surrogate(client, key):
    response = post(client, CHAT, chat(messages=[{"role": "user", "content": "hi \U0001F600"}], user="\U0001F600"),
                    key)

    assert response.json()["error"]["code"] == "no_worker"
    assert UsageRecord.objects.get().end_user == "\U0001F600"


@pytest.mark.parametrize("body", [b"\xff\xfe{", b'{"model": "tiny", "prompt": "x"', b"[]", b"null", b"7",
                                  b'"text"', b'{"model": "tiny", "prompt": ' + b"9" * 5000 + b"}"])
def test_bodies_that_are_not_a_json_object_get_400(client, key, body):
    response = post(client, COMPLETIONS, body, key)

    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
