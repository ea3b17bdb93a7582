"""A number no field can hold, or NaN / Infinity (Python's json reads them; JSON has no such
numbers), is a 400 naming the field wherever a client's JSON is read: the API's bodies (nested
values included: logit_bias, a tool's or response format's JSON schema, token ids), /detokenize,
/v1/batches and the Batch API's lines, the chat's WebSocket frames and the console's engine
settings. One reader does it (webapp/openai_api/body.py's ``json_read``); before it, a
``{"temperature": 1000...0}`` (401 digits) was a 500: a float field compared it and overflowed."""

from __future__ import annotations

import json

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from webapp.config.asgi import application
from webapp.keys.services import apikey_create
from webapp.registry.models import ModelVersion
from webapp.registry.services import model_create, modelversion_create
from webapp.usage.models import UsageRecord

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = '"messages": [{"role": "user", "content": "Hello"}]'
HUGE = "1" + "0" * 400  # an integer beyond any float
HUGER = "9" * 5000  # beyond Python's own 4,300-digit limit for reading an integer
TIMEOUT = 30

# (url, body, the parameter the 400 names, a word of its message)
TOO_LARGE = [
    (CHAT, f'{{"model": "tiny", {HELLO}, "temperature": {HUGE}}}', "temperature", "too large"),
    (CHAT, f'{{"model": "tiny", {HELLO}, "temperature": 1e400}}', "temperature", "too large"),
    (CHAT, f'{{"model": "tiny", {HELLO}, "top_p": -1e400}}', "top_p", "too large"),
    (CHAT, f'{{"model": "tiny", {HELLO}, "max_tokens": {HUGER}}}', "max_tokens", "too large"),
    (CHAT, f'{{"model": "tiny", {HELLO}, "seed": {2**64}}}', "seed", "too large"),
    (CHAT, f'{{"model": "tiny", {HELLO}, "seed": -{2**63 + 1}}}', "seed", "too large"),
    (CHAT, f'{{"model": "tiny", {HELLO}, "temperature": NaN}}', "temperature", "NaN"),
    (CHAT, f'{{"model": "tiny", {HELLO}, "top_p": Infinity}}', "top_p", "Infinity"),
    (CHAT, f'{{"model": "tiny", {HELLO}, "presence_penalty": -Infinity}}', "presence_penalty", "-Infinity"),
    (CHAT, f'{{"model": "tiny", {HELLO}, "logit_bias": {{"11": {HUGE}}}}}', "logit_bias.11", "too large"),
    (CHAT, f'{{"model": "tiny", {HELLO}, "logit_bias": {{"11": NaN}}}}', "logit_bias.11", "NaN"),
    (CHAT, f'{{"model": "tiny", {HELLO}, "tools": [{{"type": "function", "function": {{"name": "f", "parameters": '
           f'{{"type": "object", "properties": {{"n": {{"type": "integer", "maximum": 1e999}}}}}}}}}}]}}',
     "tools[0].function.parameters.properties.n.maximum", "too large"),
    (CHAT, f'{{"model": "tiny", {HELLO}, "response_format": {{"type": "json_schema", "json_schema": {{"name": "x", '
           f'"schema": {{"type": "number", "minimum": -{HUGE}}}}}}}}}', "response_format.json_schema.schema.minimum",
     "too large"),
    (CHAT, f'{{"model": "tiny", {HELLO}, "an_unknown_field": 1e400}}', "an_unknown_field", "too large"),
    (COMPLETIONS, f'{{"model": "tiny", "prompt": [1, {HUGE}]}}', "prompt[1]", "too large"),
    (COMPLETIONS, '{"model": "tiny", "prompt": "hi", "stop_token_ids": [1e400]}', "stop_token_ids[0]", "too large"),
    (COMPLETIONS, "1e400", None, "too large"),
]


@pytest.fixture
def key(workerless_model):
    return apikey_create(owner=get_user_model().objects.create_user("alice"), name="k")[1]


def post(client, url, body: str, key: str):
    return client.post(url, data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")


def assert_refused(response, param, word):
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_parameter", param)
    assert word in error["message"] and len(error["message"]) < 300  # the literal is never echoed at length
    return error


@pytest.mark.django_db
@pytest.mark.parametrize(("url", "body", "param", "word"), TOO_LARGE,
                         ids=[f"{p}:{b[b.rfind(':') + 1:][:14]}" for _, b, p, _ in TOO_LARGE])
def test_a_number_no_field_can_hold_gets_400_naming_the_field_and_a_usage_record(client, key, url, body, param,
                                                                                 word):
    assert_refused(post(client, url, body, key), param, word)

    record = UsageRecord.objects.get()
    assert (record.status, record.error_code) == ("error", "invalid_parameter")


@pytest.mark.django_db
def test_numbers_at_the_edges_are_read_and_the_request_answered_as_before(client, key):
    body = f'{{"model": "tiny", {HELLO}, "seed": {2**64 - 1}, "temperature": 1e-400, "top_k": {-1}}}'

    response = post(client, CHAT, body, key)  # no worker serves "tiny"

    assert response.status_code == 503 and response.json()["error"]["code"] == "no_worker", response.content


@pytest.mark.django_db
def test_a_schema_bound_within_reach_is_left_to_the_grammar_compiler(client, key):
    """A JSON schema's numbers are read like any other (beyond reach: the first test); within reach,
    what a bound means is the compiler's to judge: this range it cannot enforce, naming the parameter."""
    body = (f'{{"model": "tiny", {HELLO}, "response_format": {{"type": "json_schema", "json_schema": {{'
            f'"name": "x", "schema": {{"type": "number", "maximum": 1.5e308, "minimum": {-2**63}}}}}}}}}')

    error = assert_refused(post(client, CHAT, body, key), "response_format", "cannot be enforced")
    assert "too large" not in error["message"]


@pytest.mark.django_db
def test_detokenize_refuses_a_token_id_too_large(client, key):
    response = post(client, "/detokenize", f'{{"model": "tiny", "tokens": [1, {HUGE}]}}', key)

    assert_refused(response, "tokens[1]", "too large")


@pytest.mark.django_db
def test_a_batch_refuses_metadata_with_infinity_naming_it(client, key):
    response = post(client, "/v1/batches", '{"input_file_id": "file-x", "endpoint": "/v1/completions", '
                                           '"completion_window": "24h", "metadata": {"run": Infinity}}', key)

    assert_refused(response, "metadata.run", "Infinity")


@pytest.mark.django_db
@pytest.mark.parametrize(("value", "word"), [(HUGE, "too large"), ("1e400", "too large"), ("NaN", "NaN")])
def test_a_batch_line_with_a_number_too_large_is_refused_naming_the_line_and_field(client, key, value, word):
    good = {"custom_id": "a", "method": "POST", "url": COMPLETIONS, "body": {"model": "tiny", "prompt": "x"}}
    bad = ('{"custom_id": "b", "method": "POST", "url": "/v1/completions", '
           f'"body": {{"model": "tiny", "prompt": "x", "temperature": {value}}}}}')
    content = (json.dumps(good) + "\n" + bad + "\n").encode()

    response = client.post("/v1/files", {"purpose": "batch", "file": SimpleUploadedFile("in.jsonl", content)},
                           HTTP_AUTHORIZATION=f"Bearer {key}")

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["message"].startswith("Line 2: body.temperature: ") and word in error["message"]
    assert (error["code"], error["param"]) == ("invalid_batch_line", "file")


@pytest.mark.django_db
def test_the_console_refuses_engine_settings_json_with_a_number_too_large_naming_it(client, tmp_path):
    client.force_login(get_user_model().objects.create_user("admin", is_staff=True))
    upload = SimpleUploadedFile("m.gguf", b"GGUF" + bytes(64))

    page = client.post("/console/models/", {"model_slug": "tiny", "file": upload,
                                            "engine_settings": f'{{"max_num_seqs": {HUGE}}}'}, follow=True)

    text = page.content.decode()
    assert page.status_code == 200 and "Upload refused" in text and "max_num_seqs is an integer too large" in text
    assert not ModelVersion.objects.exists()


@pytest.mark.django_db
def test_the_console_settings_form_refuses_a_budget_too_large_for_a_float(client, tiny_llama_dir):
    client.force_login(get_user_model().objects.create_user("admin", is_staff=True))
    version = modelversion_create(model=model_create(slug="tiny"), path=tiny_llama_dir, engine_settings={})

    page = client.post(f"/console/models/versions/{version.pk}/settings/",
                       {"kv_cache_memory": "1e400", "max_num_seqs": "4"}, follow=True)

    assert page.status_code == 200 and "must be a positive number of MiB" in page.content.decode()
    assert ModelVersion.objects.get().engine_settings == {}


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("frame", "param", "word"), [
    (f'{{"type": "send", "model": "tiny", "content": "hi", "temperature": {HUGE}}}', "temperature", "too large"),
    ('{"type": "send", "model": "tiny", "content": "hi", "top_k": 1e400}', "top_k", "too large"),
    ('{"type": "send", "model": "tiny", "content": "hi", "seed": NaN}', "seed", "NaN"),
    ('{"type": "send", "model": "tiny", "content": "hi", "stop": [Infinity]}', "stop[0]", "Infinity"),
], ids=["huge", "1e400", "NaN", "nested"])
async def test_the_chat_refuses_a_sampling_number_too_large_with_an_error_frame_naming_it(frame, param, word):
    from asgiref.sync import sync_to_async

    @sync_to_async
    def session_cookie() -> bytes:
        browser = Client()
        browser.force_login(get_user_model().objects.create_user("alice", password="pw"))
        return f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}".encode()

    ws = WebsocketCommunicator(application, "/ws/chat/", headers=[
        (b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8000"), (b"cookie", await session_cookie())])
    assert (await ws.connect())[0]
    await ws.send_to(text_data=frame)
    error = await ws.receive_json_from(timeout=TIMEOUT)
    await ws.send_to(text_data="not json")  # the socket stays usable
    after = await ws.receive_json_from(timeout=TIMEOUT)
    await ws.disconnect()

    assert (error["type"], error["code"], error["param"]) == ("error", "invalid_parameter", param)
    assert word in error["message"] and len(error["message"]) < 300
    assert after["code"] == "invalid_json"
