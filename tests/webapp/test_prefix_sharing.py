"""Whose prefix cache a request lands in: the web side names the tenant from who authenticated, never
from the body, and marks a shared prefix only for a system prompt staff made public."""

import time

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from engine.text.tokenizer import apply_chat_template
from webapp.chat.models import SystemPromptPreset
from webapp.chat.services import turn_prepare
from webapp.keys.services import apikey_create
from webapp.openai_api.services import CHAT, COMPLETIONS, generation_prepare
from webapp.openai_api.views import ChatCompletionCreateApi, CompletionCreateApi

pytestmark = pytest.mark.django_db

HOUSE_STYLE = "You are the support assistant of Example Ltd. Answer in two sentences, politely."


@pytest.fixture
def model(workerless_model):
    return workerless_model.slug  # the bundled tokenizer and chat template; nothing runs here


@pytest.fixture
def alice():
    return get_user_model().objects.create_user("alice", password="alice-pw-123")


@pytest.fixture
def shared_preset():
    return SystemPromptPreset.objects.create(name="House style", text=HOUSE_STYLE, is_prefix_shared=True)


def api(user, endpoint, body):
    api_key = apikey_create(owner=user, name="k")[0]
    view = ChatCompletionCreateApi if endpoint == CHAT else CompletionCreateApi
    serializer = view.InputSerializer(data=body)
    serializer.is_valid(raise_exception=True)
    return generation_prepare(request_id="r1", endpoint=endpoint, api_key=api_key,
                              values=serializer.validated_data, started=time.monotonic()).engine_request()


def chat(system, question="Where is my parcel?"):
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def system_turn(tokenizer, text):
    return apply_chat_template(tokenizer, [{"role": "system", "content": text}], add_generation_prompt=False)


def test_an_api_request_belongs_to_its_keys_owner_whatever_the_body_says(model, alice):
    body = {"model": model, "messages": chat("Be brief."), "user": "user:999",
            "tenant": "user:999", "tenant_weight": 50, "shared_prefix_len": 3}

    request = api(alice, CHAT, body)

    assert (request.tenant, request.tenant_weight, request.shared_prefix_len) == (f"user:{alice.pk}", 1.0, 0)
    assert api(alice, COMPLETIONS, {"model": model, "prompt": "Hi"}).tenant == f"user:{alice.pk}"


def test_a_chat_turn_belongs_to_the_logged_in_user(model, alice):
    turn = turn_prepare(user=alice, data={"type": "send", "model": model, "content": "Hello", "system_prompt": "",
                                          "tenant": "user:999"}, started=time.monotonic())

    assert turn.engine_request().tenant == f"user:{alice.pk}" and turn.engine_request().shared_prefix_len == 0


def test_a_shared_presets_system_turn_is_the_shared_prefix(model, alice, shared_preset, smollm2_hf_tokenizer):
    prefix = system_turn(smollm2_hf_tokenizer, HOUSE_STYLE)

    request = api(alice, CHAT, {"model": model, "messages": chat(HOUSE_STYLE)})
    turn = turn_prepare(user=alice, data={"type": "send", "model": model, "content": "Where is my parcel?",
                                          "system_prompt": HOUSE_STYLE}, started=time.monotonic())

    assert request.shared_prefix_len == len(prefix) and request.prompt_token_ids[:len(prefix)] == prefix
    assert turn.engine_request().shared_prefix_len == len(prefix)
    assert len(prefix) >= 16  # at least one full block of the bundled model's cache is shared


@pytest.mark.parametrize("messages", [
    chat(HOUSE_STYLE + " Also, my account number is 12345."),  # the preset and more: not the preset
    chat(HOUSE_STYLE[:-1]),
    [{"role": "user", "content": HOUSE_STYLE}],  # the text, but not as the system prompt
    chat("Something else entirely."),
])
def test_only_exactly_the_shared_system_prompt_is_shared(model, alice, shared_preset, messages):
    assert api(alice, CHAT, {"model": model, "messages": messages}).shared_prefix_len == 0


def test_a_system_prompt_staff_did_not_mark_is_not_shared(model, alice, shared_preset):
    shared_preset.is_prefix_shared = False
    shared_preset.save()
    SystemPromptPreset.objects.create(user=alice, name="mine", text=HOUSE_STYLE, is_prefix_shared=True)  # not staff's

    assert api(alice, CHAT, {"model": model, "messages": chat(HOUSE_STYLE)}).shared_prefix_len == 0


def test_tools_added_to_a_shared_system_prompt_share_nothing(model, alice, shared_preset):
    tools = [{"type": "function", "function": {"name": "track", "parameters": {"type": "object", "properties": {}}}}]

    assert api(alice, CHAT, {"model": model, "messages": chat(HOUSE_STYLE), "tools": tools}).shared_prefix_len == 0


def test_only_everyones_presets_can_be_marked_shared(alice):
    with pytest.raises(ValidationError, match="is_prefix_shared"):
        SystemPromptPreset(user=alice, name="mine", text="x", is_prefix_shared=True).full_clean()
    SystemPromptPreset(user=None, name="staff's", text="x", is_prefix_shared=True).full_clean()
