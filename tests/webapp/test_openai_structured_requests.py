"""response_format and structured_outputs are checked before any worker: a constraint the engine
cannot enforce is a 400 naming the parameter and what is unsupported, never free output."""

import json

import pytest
from django.contrib.auth import get_user_model

from webapp.keys.services import apikey_create
from webapp.openai_api.constraints import request_constraint
from webapp.registry.models import Model, ModelVersion

pytestmark = pytest.mark.django_db

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "Hello"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.fixture
def key(smollm2_tokenizer_dir, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    model = Model.objects.create(slug="tiny")
    ModelVersion.objects.create(model=model, number=1, path=str(gguf), format="gguf", status="active",
                                tokenizer_dir=str(smollm2_tokenizer_dir))
    return apikey_create(owner=get_user_model().objects.create_user("alice"), name="k")[1]


def post(client, url, body, key):
    return client.post(url, data=json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {key}")


@pytest.mark.parametrize(("url", "extra", "param", "words"), [
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "tags", "schema": {"type": "array", "uniqueItems": True}}}}, "response_format", "uniqueItems"),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "not": {"required": ["a"]}}}}}, "response_format", "not"),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}},
     "response_format.json_schema.name", "name"),
    (CHAT, {"response_format": {"type": "xml"}}, "response_format", "type"),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "strin"}}}},
     "response_format", "strin"),
    (COMPLETIONS, {"structured_outputs": {"regex": "[a-"}}, "structured_outputs", "regex"),
    (COMPLETIONS, {"structured_outputs": {"choice": []}}, "structured_outputs", "choice"),
    (COMPLETIONS, {"structured_outputs": {"json": {"type": "string"}, "regex": "a"}}, "structured_outputs",
     "exactly one"),
    (CHAT, {"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
     "structured_outputs", "combined"),
])
def test_a_constraint_the_engine_cannot_enforce_is_a_400_naming_it(client, key, url, extra, param, words):
    body = {"model": "tiny", **({"messages": HELLO} if url == CHAT else {"prompt": "x"}), **extra}
    response = post(client, url, body, key)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, "invalid_parameter")
    assert words in error["message"]


def test_openai_shapes_become_the_engines_constraints():
    assert request_constraint({"response_format": {"type": "text"}}) is None
    assert request_constraint({}) is None
    assert request_constraint({"response_format": {"type": "json_object"}}) == {"json_object": True}
    assert request_constraint({"response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "schema": PERSON, "strict": True}}}) == {"json": PERSON}
    assert request_constraint({"structured_outputs": {"choice": ["yes", "no"]}}) == {"choice": ["yes", "no"]}


@pytest.mark.parametrize(("extra", "param"), [
    ({"logit_bias": {"5": 101}}, "logit_bias"), ({"logit_bias": {"five": 1}}, "logit_bias"),
    ({"logit_bias": {"49152": 1}}, "logit_bias"),  # past SmolLM2's vocabulary
    ({"logit_bias": [1]}, "logit_bias"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": list(range(257))}, "stop_token_ids"), ({"min_tokens": -1}, "min_tokens"),
])
def test_sampling_extras_out_of_range_are_a_400_naming_them(client, key, extra, param):
    response = post(client, CHAT, {"model": "tiny", "messages": HELLO, **extra}, key)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["param"] == param
