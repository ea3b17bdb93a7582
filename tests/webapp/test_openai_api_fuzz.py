"""Fuzzing the /v1 API through the real ASGI application (webapp.config.asgi) with a real key.

schemathesis reads the API's own OpenAPI document (GET v1/openapi.json) and sends bodies that fit
it and bodies that break it (wrong types, values past each range, missing fields); hypothesis
adds hostile JSON of its own (lone surrogates, NaN, huge numbers, deep nesting, any value in any
field). No worker runs here, so a request that passes validation ends in the documented 503
no_worker. Whatever is sent: never a 5xx other than that 503, and every error is an OpenAI error
object ``{"error": {"message", "type", "param", "code"}}``, or on Anthropic's Messages routes an
Anthropic one ``{"type": "error", "error": {"type", "message"}}``.
"""

import asyncio
import json
import logging
import os

import httpx
import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.test import override_settings
from hypothesis import HealthCheck, given, settings, strategies as st

from webapp.config.asgi import application
from webapp.keys.services import apikey_create
from webapp.openai_api.errors import SHED_MESSAGES

pytestmark = pytest.mark.django_db(transaction=True)  # the app runs on its own event loop thread

# Per operation (eleven of them) and per hostile endpoint: about 90 s in all; FUZZ_EXAMPLES=2000 hunts longer.
MAX_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
FUZZ_SETTINGS = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(HealthCheck))
HOSTILE_SETTINGS = settings(FUZZ_SETTINGS, max_examples=MAX_EXAMPLES * 4)  # cheap: most end at the parser
DOCUMENTED_5XX = {503: {"no_worker", "model_not_ready", "server_shutting_down", *SHED_MESSAGES}}


class LoggedFailures(logging.Handler):
    """The server-side tracebacks behind any 500 (clients never see them), for the failure message."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.texts: list[str] = []

    def emit(self, record):
        self.texts.append(self.format(record))


FAILURES = LoggedFailures()
logging.getLogger("webapp.openai_api.errors").addHandler(FAILURES)


@pytest.fixture
def raw_key(workerless_model):
    return apikey_create(owner=get_user_model().objects.create_user("fuzz"), name="fuzz")[1]


@pytest.fixture(autouse=True)
def testserver_host(settings):
    settings.ALLOWED_HOSTS = ["testserver"]


def published_schema() -> dict:
    """What GET v1/openapi.json answers (schemathesis' lazy fixture loader predates pytest 9)."""
    from django.test import Client

    with override_settings(ALLOWED_HOSTS=["testserver"]):
        return Client().get("/v1/openapi.json").json()


schema = schemathesis.openapi.from_dict(published_schema())
schema.app = application  # cases are sent to the ASGI application, as from_asgi() would


ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")


def assert_anthropic_answer(status: int, content_type: str, body: bytes) -> None:
    """Success, or an Anthropic error object; a 5xx only as the documented 503 (overloaded_error)."""
    if status < 400:
        return
    assert content_type.startswith("application/json"), (status, body[:200])
    answer = json.loads(body)
    assert set(answer) == {"type", "error"} and answer["type"] == "error", answer
    error = answer["error"]
    assert set(error) == {"type", "message"} and isinstance(error["message"], str) and error["message"], error
    assert "Traceback" not in error["message"] and "Error:" not in error["message"], error
    if status >= 500:
        assert status == 503 and error["type"] == "overloaded_error", (status, error, FAILURES.texts[-1:])


def assert_answer(path: str, status: int, content_type: str, body: bytes) -> None:
    """The route's own shape: Anthropic's on the Messages routes, OpenAI's elsewhere."""
    check = assert_anthropic_answer if path in ANTHROPIC_PATHS else assert_openai_answer
    check(status, content_type, body)


def assert_openai_answer(status: int, content_type: str, body: bytes) -> None:
    """Success, or an OpenAI error object; a 5xx only as a documented 503."""
    if status < 400:
        return
    assert content_type.startswith("application/json"), (status, body[:200])
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    assert error["param"] is None or isinstance(error["param"], str)
    assert "Traceback" not in error["message"] and "Error:" not in error["message"], error
    if status >= 500:
        assert error["code"] in DOCUMENTED_5XX.get(status, set()), (status, error, FAILURES.texts[-1:])


@pytest.mark.slow
@schema.parametrize()
@FUZZ_SETTINGS
def test_schema_driven_bodies_never_get_a_5xx_or_a_non_openai_error(case, raw_key):
    response = case.call(headers={"Authorization": f"Bearer {raw_key}"})

    content_type = (response.headers.get("content-type") or [""])[0]  # schemathesis: a list per header
    assert_answer(case.path, response.status_code, content_type, response.content)


# Hostile JSON: lone surrogates, NaN and infinities, integers past 64 bits, nesting, any type anywhere.
texts = st.one_of(st.text(max_size=12), st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2),
                  st.sampled_from(["\ud800", "a\udfffb", "\x00", "\U0001F600", "x" * 2000]))
numbers = st.one_of(st.integers(), st.integers(min_value=2**63 - 2, max_value=2**70), st.integers(max_value=-2**63),
                    st.floats(allow_nan=True, allow_infinity=True))
values = st.recursive(st.one_of(st.none(), st.booleans(), numbers, texts),
                      lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)),
                      max_leaves=8)
FIELDS = ["max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n",
          "presence_penalty", "frequency_penalty", "repetition_penalty", "user", "stream", "stream_options",
          "logprobs", "top_logprobs", "priority", "ignore_eos", "response_format", "tools",
          # Anthropic's Messages and OpenAI's Responses
          "system", "stop_sequences", "tool_choice", "metadata", "input", "instructions", "max_output_tokens",
          "text", "encoding_format", "dimensions", "previous_response_id", "store", "background", "parallel_tool_calls"]
# Content blocks (Anthropic) and input items (Responses) of every kind, with any value in any field.
blocks = st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "tool_result", "image", "message", "function_call",
                              "function_call_output", "input_text"]) | texts},
    optional={name: st.one_of(texts, values) for name in ("text", "id", "name", "input", "tool_use_id", "content",
                                                           "call_id", "output", "arguments", "role", "is_error")}),
    max_size=3)
messages = st.one_of(
    st.just([{"role": "user", "content": "hi"}]), values,
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]) | texts},
                                   optional={"content": st.one_of(texts, values, blocks), "name": texts}),
             max_size=3))
bodies = st.fixed_dictionaries(
    {"model": st.one_of(st.just("tiny"), values)},
    optional={"messages": messages, "prompt": st.one_of(texts, values), **{name: values for name in FIELDS},
              "input": st.one_of(texts, values, blocks)})
deep = st.integers(min_value=1, max_value=5_000).map(
    lambda depth: '{"model": "tiny", "messages": ' + "[" * depth + "]" * depth + "}")


def post(raw_key: str, path: str, body: str) -> httpx.Response:
    async def send():
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return await client.post(path, content=body.encode("utf-8", "surrogatepass"), headers={
                "Authorization": f"Bearer {raw_key}", "Content-Type": "application/json"})
    return asyncio.run(send())


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
                                  *ANTHROPIC_PATHS])
@HOSTILE_SETTINGS
@given(body=st.one_of(bodies.map(lambda b: json.dumps(b, allow_nan=True)), deep, texts))
def test_hostile_json_never_gets_a_5xx_or_a_non_openai_error(raw_key, path, body):
    response = post(raw_key, path, body)

    assert_answer(path, response.status_code, response.headers.get("content-type", ""), response.content)


def test_the_published_schema_states_the_engines_ranges():
    body = published_schema()["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]
    fields = body["application/json"]["schema"]["properties"]

    assert (fields["seed"]["minimum"], fields["seed"]["maximum"]) == (-2**63, 2**64 - 1)
    assert fields["top_k"]["maximum"] == 2**31 - 1 and fields["temperature"]["maximum"] == 2
    assert fields["messages"]["maxItems"] == 2048 and fields["top_p"]["exclusiveMinimum"] == 0


def test_the_published_schema_has_the_embeddings_operation():
    operation = published_schema()["paths"]["/v1/embeddings"]["post"]
    fields = operation["requestBody"]["content"]["application/json"]["schema"]["properties"]

    assert operation["operationId"] == "createEmbedding"
    assert set(fields) == {"model", "input", "encoding_format", "dimensions", "user"}
    assert fields["encoding_format"]["enum"] == ["float", "base64"]
    assert [alt.get("maxItems") for alt in fields["input"]["anyOf"]] == [None, 2048, None, 2048]


def test_the_published_schema_takes_a_list_of_prompts_and_n_up_to_16():
    fields = published_schema()["paths"]["/v1/completions"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]

    assert [alt.get("maxItems") for alt in fields["prompt"]["anyOf"]] == [None, None, 16, 16]
    assert fields["prompt"]["anyOf"][3]["items"]["type"] == "array"
    assert "index = prompt index x n + sample index" in fields["prompt"]["description"]
    assert (fields["n"]["maximum"], fields["best_of"]["maximum"]) == (16, 16)
