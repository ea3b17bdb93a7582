"""Every refusal of the OpenAI API is an OpenAI error object with the right status, and is accounted."""

import json

import pytest
from django.contrib.auth import get_user_model

from webapp.keys.services import apikey_create, apikey_revoke
from webapp.registry.models import Model, ModelVersion
from webapp.usage.models import UsageRecord

pytestmark = pytest.mark.django_db

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def served(smollm2_tokenizer_dir, tmp_path):
    """Two active models whose workers are not running (no worker is started in these tests)."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    for slug in ("tiny", "other"):
        model = Model.objects.create(slug=slug)
        ModelVersion.objects.create(model=model, number=1, path=str(gguf), format="gguf", status="active",
                                    tokenizer_dir=str(smollm2_tokenizer_dir))


@pytest.fixture
def owner():
    return get_user_model().objects.create_user("alice")


@pytest.fixture
def key(owner):
    return apikey_create(owner=owner, name="all models")[1]


def post(client, url, body, key=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    data = body if isinstance(body, str) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json", **headers)


def assert_error(response, status, code, param=None):
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["param"] == param and error["message"]
    return error


@pytest.mark.slow
@pytest.mark.parametrize("header", [None, "Bearer", "Bearer pgd-wrong", "Basic dXNlcjpwYXNz"])
def test_missing_or_wrong_keys_get_401_invalid_api_key(client, served, header):
    headers = {"HTTP_AUTHORIZATION": header} if header else {}

    response = client.post(CHAT, data=json.dumps({"model": "tiny", "messages": HELLO}),
                           content_type="application/json", **headers)

    assert_error(response, 401, "invalid_api_key")
    assert not UsageRecord.objects.exists()  # nobody to account it to


def test_a_revoked_key_gets_401(client, served, owner):
    api_key, raw = apikey_create(owner=owner, name="old")
    apikey_revoke(api_key=api_key)

    assert_error(post(client, COMPLETIONS, {"model": "tiny", "prompt": "x"}, raw), 401, "invalid_api_key")


def test_models_list_also_needs_a_key(client, served):
    assert_error(client.get("/v1/models"), 401, "invalid_api_key")


def test_unknown_model_gets_404_model_not_found_and_is_recorded(client, served, key):
    response = post(client, CHAT, {"model": "gpt-9", "messages": HELLO}, key)

    assert_error(response, 404, "model_not_found", "model")
    record = UsageRecord.objects.get()
    assert (record.status, record.error_code, record.model_name, record.model) == \
        ("error", "model_not_found", "gpt-9", None)


def test_a_model_outside_the_keys_scope_answers_exactly_like_an_unknown_one(client, served, owner):
    _, raw = apikey_create(owner=owner, name="tiny only", models=[Model.objects.get(slug="tiny")])

    def answers(url, body=None, model="other"):
        response = (post(client, url, {**body, "model": model}, raw) if body is not None
                    else client.get(f"{url}/{model}", HTTP_AUTHORIZATION=f"Bearer {raw}"))
        return response.status_code, response.json()["error"]["message"].replace(model, "M")

    for url, body in ((CHAT, {"messages": HELLO}), (COMPLETIONS, {"prompt": "x"}), ("/v1/models", None)):
        assert answers(url, body) == answers(url, body, model="no-such-model")
        assert_error(post(client, url, {**body, "model": "other"}, raw) if body else
                     client.get("/v1/models/other", HTTP_AUTHORIZATION=f"Bearer {raw}"), 404, "model_not_found",
                     "model")


@pytest.mark.parametrize(("url", "body", "param"), [
    (CHAT, {"model": "tiny", "messages": HELLO, "n": 17}, "n"),
    (CHAT, {"model": "tiny", "messages": HELLO, "temperature": 2.5}, "temperature"),
    (CHAT, {"model": "tiny", "messages": HELLO, "top_p": 0}, "top_p"),
    (CHAT, {"model": "tiny", "messages": HELLO, "max_tokens": 0}, "max_tokens"),
    (CHAT, {"model": "tiny", "messages": HELLO, "stop": [1, 2]}, "stop"),
    (CHAT, {"model": "tiny", "messages": HELLO, "top_logprobs": 3}, "top_logprobs"),
    (CHAT, {"model": "tiny", "messages": HELLO, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    (CHAT, {"model": "tiny", "messages": HELLO, "tools": [{"type": "function"}]}, "tools"),
    (CHAT, {"model": "tiny", "messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options"),
    (CHAT, {"model": "tiny", "messages": []}, "messages"),
    (CHAT, {"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    (CHAT, {"model": "tiny", "messages": [HELLO[0], {"role": "user"}]}, "messages[1].content"),
    (CHAT, {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    (CHAT, {"messages": HELLO}, "model"),
    (COMPLETIONS, {"model": "tiny", "prompt": ["a"] * 17}, "prompt"),
    (COMPLETIONS, {"model": "tiny", "prompt": ["a"] * 5, "n": 16}, "prompt"),
    (COMPLETIONS, {"model": "tiny", "prompt": ""}, "prompt"),
    (COMPLETIONS, {"model": "tiny", "prompt": "x", "logprobs": 50}, "logprobs"),
    (COMPLETIONS, {"model": "tiny", "prompt": "x", "top_k": -2}, "top_k"),
])
def test_invalid_parameters_get_400_naming_the_parameter(client, served, key, url, body, param):
    error = assert_error(post(client, url, body, key), 400, "invalid_parameter", param)

    assert error["type"] == "invalid_request_error"
    assert UsageRecord.objects.get().error_code == "invalid_parameter"


def test_a_body_that_is_not_json_gets_400(client, served, key):
    assert_error(post(client, CHAT, "{not json", key), 400, "invalid_parameter")


def test_an_active_model_without_a_live_worker_gets_503_and_an_error_record(client, served, key):
    response = post(client, CHAT, {"model": "tiny", "messages": HELLO}, key)

    error = assert_error(response, 503, "no_worker", "model")
    assert error["type"] == "server_error"
    record = UsageRecord.objects.get()
    assert (record.status, record.error_code, record.model.slug, record.version.number) == \
        ("error", "no_worker", "tiny", 1)
    assert record.completion_tokens == 0 and record.latency > 0


def test_streaming_to_a_model_without_worker_gets_503_before_any_event(client, served, key):
    response = post(client, COMPLETIONS, {"model": "tiny", "prompt": "x", "stream": True}, key)

    assert_error(response, 503, "no_worker", "model")
    assert response["Content-Type"] == "application/json"


def test_get_on_a_completion_endpoint_is_405_as_an_openai_error(client, served, key):
    response = client.get(CHAT, HTTP_AUTHORIZATION=f"Bearer {key}")

    assert_error(response, 405, "method_not_allowed")


def test_models_lists_the_served_models_a_key_may_use(client, served, owner, key):
    _, scoped = apikey_create(owner=owner, name="tiny only", models=[Model.objects.get(slug="tiny")])
    Model.objects.create(slug="not-served")

    everything = client.get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    only_tiny = client.get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {scoped}").json()

    assert everything["object"] == "list"
    assert [m["id"] for m in everything["data"]] == ["other", "tiny"]
    assert [m["id"] for m in only_tiny["data"]] == ["tiny"]
    assert only_tiny["data"][0]["object"] == "model"


def test_retrieving_an_unknown_model_is_404(client, served, key):
    assert_error(client.get("/v1/models/nope", HTTP_AUTHORIZATION=f"Bearer {key}"), 404, "model_not_found",
                 "model")


def test_a_body_over_the_upload_limit_gets_413(client, served, key, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 200

    response = post(client, COMPLETIONS, {"model": "tiny", "prompt": "x" * 500}, key)

    assert_error(response, 413, "request_too_large")
