"""A model without a chat template (Gemma 3 270M's GGUF) serves completions; chat is refused naming
the fix until staff set a template for the version in the console: a preset (with its turn's end
token as a stop) or a custom jinja template, checked when saved."""

import json
import shutil

import pytest
from django.contrib.auth import get_user_model

from webapp.keys.services import apikey_create
from webapp.openai_api.services import generation_prepare, CHAT
from webapp.registry.chat_templates import PRESETS
from webapp.registry.models import Model, ModelVersion

pytestmark = pytest.mark.django_db

HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]


@pytest.fixture
def version(smollm2_tokenizer_dir, tmp_path):
    """The bundled tokenizer with its chat template taken out."""
    directory = tmp_path / "tokenizer"
    shutil.copytree(smollm2_tokenizer_dir, directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    return ModelVersion.objects.create(model=Model.objects.create(slug="base"), number=1, path=str(gguf),
                                       format="gguf", status="active", tokenizer_dir=str(directory))


@pytest.fixture
def key(version):
    return apikey_create(owner=get_user_model().objects.create_user("alice"), name="k")


@pytest.fixture
def staff_client(client):
    client.force_login(get_user_model().objects.create_user("admin", password="pw", is_staff=True))
    return client


def post(client, url, body, key):
    return client.post(url, data=json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {key[1]}")


def set_template(staff_client, version, preset, template=""):
    return staff_client.post(f"/console/models/versions/{version.id}/chat-template/",
                             {"chat_template_preset": preset, "chat_template": template}, follow=True)


def test_chat_is_refused_naming_the_fix_while_completions_are_served(client, key):
    refused = post(client, "/v1/chat/completions", {"model": "base", "messages": HELLO}, key)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "messages" and "/v1/completions" in error["message"]
    assert "console" in error["message"] and "Gemma" in error["message"]
    prompt = post(client, "/tokenize", {"model": "base", "prompt": "Hello"}, key)
    assert prompt.status_code == 200 and prompt.json()["count"] > 0


def test_a_preset_set_in_the_console_renders_chats_and_stops_at_its_turn_end(
        client, staff_client, key, version, smollm2_hf_tokenizer):
    page = set_template(staff_client, version, "chatml")
    assert "chat template saved" in page.content.decode()
    version.refresh_from_db()
    assert version.chat_template_preset == "chatml"
    rendered = post(client, "/tokenize", {"model": "base", "messages": HELLO,
                                          "add_generation_prompt": True}, key).json()["tokens"]
    # the preset is ChatML as SmolLM2's own template writes it (bar its default system prompt)
    text = smollm2_hf_tokenizer.apply_chat_template(HELLO, add_generation_prompt=True, tokenize=False)
    reference = smollm2_hf_tokenizer.encode(text, add_special_tokens=False)
    assert rendered == reference
    generation = generation_prepare(request_id="chatcmpl-1", endpoint=CHAT, api_key=key[0],
                                    values={"model": "base", "messages": HELLO, "stop_token_ids": [7]},
                                    started=0.0)
    im_end = smollm2_hf_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert generation.params["stop_token_ids"] == [7, im_end]


def test_a_preset_whose_turn_end_the_vocabulary_lacks_is_refused_on_save(staff_client, version):
    page = set_template(staff_client, version, "gemma").content.decode()
    assert "&lt;end_of_turn&gt;" in page or "<end_of_turn>" in page
    version.refresh_from_db()
    assert version.chat_template_preset == ""


@pytest.mark.parametrize("template, words", [
    ("{% for message in messages %}{{ message['content'] }", "does not render"),
    ("{{ raise_exception('no system role') }}", "no system role"),
    ("   ", "empty"),
])
def test_a_broken_custom_template_is_refused_on_save(staff_client, version, template, words):
    page = set_template(staff_client, version, "custom", template).content.decode()
    assert words in page
    version.refresh_from_db()
    assert version.chat_template_preset == "" and version.chat_template == ""


def test_a_custom_template_is_what_chats_render(client, staff_client, key, version):
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    set_template(staff_client, version, "custom", template)
    body = {"model": "base", "messages": HELLO, "add_generation_prompt": True}
    tokens = post(client, "/tokenize", body, key).json()["tokens"]
    text = post(client, "/detokenize", {"model": "base", "tokens": tokens}, key).json()["prompt"]
    assert text == "[system] Be brief.\n[user] Hello\n"


def test_every_preset_renders_a_conversation():
    from webapp.registry.tokenizers import _compile

    for preset in PRESETS.values():
        text = _compile(preset.template).render(messages=HELLO, add_generation_prompt=True,
                                                bos_token="<s>")
        assert "Hello" in text and "Be brief." in text
        assert all(stop in text for stop in preset.stop_tokens)
