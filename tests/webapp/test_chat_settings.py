"""The chat page's settings: every sampling parameter of the API, held to the API's own limits
(the reference: the API's SamplingInputSerializer refuses exactly what the page refuses), staff's
per-model defaults, system prompt presets, and a model picker showing only the user's models."""

from __future__ import annotations

import json
import re

import pytest
from django.core.exceptions import ValidationError

from webapp.chat.models import ModelChatDefaults, SystemPromptPreset
from webapp.chat.sampling import FIELDS
from webapp.chat.services import ChatInputError, preset_delete, preset_save
from webapp.openai_api.serializers import SamplingInputSerializer
from webapp.registry.models import Model

from tests.webapp.test_chat_pages import alice, bob, logged_in, prepare, smol  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]

GOOD = {"temperature": 0.0, "top_p": 0.5, "top_k": 40, "min_p": 0.05, "presence_penalty": -2.0,
        "frequency_penalty": 2.0, "repetition_penalty": 1.3, "seed": 2**64 - 1, "max_tokens": 7,
        "stop": ["\n\n", "END"]}
BAD = [("temperature", 2.5), ("top_p", 0), ("top_p", 1.01), ("top_k", -2), ("min_p", 1.5),
       ("presence_penalty", 2.1), ("frequency_penalty", -2.1), ("repetition_penalty", 0), ("repetition_penalty", 11),
       ("seed", 2**64), ("max_tokens", 0), ("stop", ["s"] * 17), ("stop", ["x" * 1025]), ("stop", [1])]


def api_accepts(name, value) -> bool:
    return SamplingInputSerializer(data={"model": "m", name: value}).is_valid()


def test_every_sampling_parameter_of_the_api_reaches_the_engine_request(alice, smol):
    assert set(FIELDS) == {"temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                           "repetition_penalty", "seed", "stop", "max_tokens"}
    turn = prepare(alice, type="send", content="hi", **GOOD)

    assert turn.params == GOOD
    assert all(api_accepts(name, value) for name, value in GOOD.items())
    turn.conversation.refresh_from_db()
    assert turn.conversation.sampling == GOOD  # reopening the conversation restores them


@pytest.mark.parametrize("name, value", BAD)
def test_a_value_the_api_refuses_is_refused_naming_the_field(alice, smol, name, value):
    assert not api_accepts(name, value)
    with pytest.raises(ChatInputError) as refused:
        prepare(alice, type="send", content="hi", **{name: value})

    assert refused.value.code == "invalid_parameter" and refused.value.param == name
    assert name in refused.value.message


def test_the_number_inputs_text_is_read_as_numbers(alice, smol):
    turn = prepare(alice, type="send", content="hi", top_k="12", seed="18446744073709551615", min_p="0.1", stop="")

    assert turn.params == {"max_tokens": None, "top_k": 12, "seed": 2**64 - 1, "min_p": 0.1}
    with pytest.raises(ChatInputError) as refused:
        prepare(alice, type="send", content="hi", top_k="1.5")
    assert refused.value.param == "top_k"


def test_staffs_model_defaults_apply_and_the_turns_own_values_win(alice, smol):
    ModelChatDefaults.objects.create(model=Model.objects.get(slug="smol"), system_prompt="Be brief.",
                                     sampling={"temperature": 0.2, "top_k": 5, "stop": ["###"]})

    turn = prepare(alice, type="send", content="hi", top_k=9)

    assert turn.params == {"max_tokens": None, "temperature": 0.2, "top_k": 9, "stop": ["###"]}
    page = logged_in(alice).get("/")
    state = json.loads(re.search(rb'id="chat-state" type="application/json">(.*?)</script>', page.content).group(1))
    assert state["defaults"] == {"smol": {"sampling": {"temperature": 0.2, "top_k": 5, "stop": ["###"]},
                                          "system_prompt": "Be brief."}}


@pytest.mark.parametrize("sampling", [{"temperature": 9}, {"colour": 1}, ["temperature"]])
def test_staff_cannot_save_a_default_outside_the_apis_limits(smol, sampling):
    defaults = ModelChatDefaults(model=Model.objects.get(slug="smol"), sampling=sampling)
    with pytest.raises(ValidationError) as refused:
        defaults.full_clean()
    assert "sampling" in refused.value.message_dict


def test_presets_are_the_users_own_plus_staffs_shared_ones(alice, bob, smol):
    SystemPromptPreset.objects.create(name="Pirate", text="Talk like a pirate.")
    mine = preset_save(user=alice, name="Terse", text="One line answers.", max_chars=100)
    preset_save(user=bob, name="Bob's", text="Bob only.", max_chars=100)
    preset_save(user=alice, name="Terse", text="One short line.", max_chars=100)  # same name: replaced

    page = logged_in(alice).get("/")
    state = json.loads(re.search(rb'id="chat-state" type="application/json">(.*?)</script>', page.content).group(1))
    assert state["presets"] == [{"id": state["presets"][0]["id"], "name": "Pirate", "text": "Talk like a pirate.",
                                 "shared": True, "knowledge_bases": []},
                                {"id": mine.pk, "name": "Terse", "text": "One short line.", "shared": False,
                                 "knowledge_bases": []}]
    shared = SystemPromptPreset.objects.get(name="Pirate")
    assert not preset_delete(user=alice, preset_id=shared.pk)  # staff's stay
    assert preset_delete(user=alice, preset_id=mine.pk)
    with pytest.raises(ChatInputError) as refused:
        preset_save(user=alice, name="Long", text="x" * 101, max_chars=100)
    assert refused.value.param == "text"


def test_the_model_picker_shows_only_the_models_the_user_may_use(alice, smol):
    from webapp.keys.services import chatlimits_get_or_create
    from webapp.registry.models import ModelVersion

    other = Model.objects.create(slug="other")
    ModelVersion.objects.create(model=other, number=1, path="/x", format="gguf", status="active",
                                tokenizer_dir=ModelVersion.objects.get(model__slug="smol").tokenizer_dir)
    assert b'<option value="other">' in logged_in(alice).get("/").content
    chatlimits_get_or_create(user=alice).models.set([Model.objects.get(slug="smol")])

    page = logged_in(alice).get("/").content
    assert re.findall(rb'<option value="([^"]*)">', page.split(b'id="model"')[1].split(b"</select>")[0]) == [b"smol"]
    with pytest.raises(ChatInputError) as refused:
        prepare(alice, type="send", content="hi", model="other")
    assert refused.value.param == "model"
