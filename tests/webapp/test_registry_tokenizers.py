"""The web process's torch-free tokenizer gives the engine's token ids."""

import pytest

from engine.text.tokenizer import apply_chat_template as engine_apply_chat_template
from webapp.registry.tokenizers import ChatTemplateError, ModelTokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "Héllo, naïve 🍰 world"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Write\n  a   haiku\twith <|im_start|> in it."}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_ids_equal_the_engines(smollm2_tokenizer_dir, smollm2_hf_tokenizer, messages):
    tokenizer = ModelTokenizer.from_dir(smollm2_tokenizer_dir)

    assert tokenizer.apply_chat_template(messages) == engine_apply_chat_template(smollm2_hf_tokenizer, messages)


def test_chat_template_without_generation_prompt_equals_the_engines(smollm2_tokenizer_dir, smollm2_hf_tokenizer):
    tokenizer = ModelTokenizer.from_dir(smollm2_tokenizer_dir)
    messages = CONVERSATIONS[2]

    ours = tokenizer.apply_chat_template(messages, add_generation_prompt=False)

    assert ours == engine_apply_chat_template(smollm2_hf_tokenizer, messages, add_generation_prompt=False)


@pytest.mark.parametrize("text", ["Once upon a time", "  leading spaces\nand lines", "émoji 🍰 ünïcode"])
def test_plain_prompt_ids_equal_the_engines(smollm2_tokenizer_dir, smollm2_hf_tokenizer, text):
    tokenizer = ModelTokenizer.from_dir(smollm2_tokenizer_dir)

    assert tokenizer.encode(text) == smollm2_hf_tokenizer.encode(text, add_special_tokens=True)


def test_eos_ids_and_context_length_come_from_the_export(smollm2_tokenizer_dir):
    tokenizer = ModelTokenizer.from_dir(smollm2_tokenizer_dir)

    assert tokenizer.eos_token_ids == [2]
    assert tokenizer.max_model_len == 8192
    assert tokenizer.decode_token(2) == "<|im_end|>"


def test_template_raise_exception_becomes_chat_template_error(smollm2_tokenizer_dir):
    tokenizer = ModelTokenizer.from_dir(smollm2_tokenizer_dir)
    tokenizer.chat_template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"

    with pytest.raises(ChatTemplateError, match="user first"):
        tokenizer.apply_chat_template([{"role": "assistant", "content": "hi"}])


def test_model_without_chat_template_refuses_chat(smollm2_tokenizer_dir):
    tokenizer = ModelTokenizer.from_dir(smollm2_tokenizer_dir)
    tokenizer.chat_template = None

    with pytest.raises(ChatTemplateError, match="no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def test_sandbox_refuses_attribute_escapes(smollm2_tokenizer_dir):
    tokenizer = ModelTokenizer.from_dir(smollm2_tokenizer_dir)
    tokenizer.chat_template = "{{ messages.__class__.__mro__ }}"

    with pytest.raises(ChatTemplateError, match="unsafe"):
        tokenizer.render_chat([{"role": "user", "content": "hi"}])


def test_start_up_loads_each_active_versions_tokenizer_before_the_first_request(workerless_model, tmp_path):
    """registry/warm_up.py: the first request finds the tokenizer loaded and its template compiled;
    a version still being exported is skipped, a broken one logged and skipped."""
    from webapp.registry.models import Model, ModelVersion
    from webapp.registry.selectors import modelversion_tokenizer
    from webapp.registry.tokenizers import load_tokenizer
    from webapp.registry.warm_up import warm_tokenizers

    for slug, tokenizer_dir in (("exporting", ""), ("broken", str(tmp_path / "missing"))):
        ModelVersion.objects.create(model=Model.objects.create(slug=slug), number=1, path="x.gguf",
                                    format="gguf", status="active", tokenizer_dir=tokenizer_dir)
    load_tokenizer.cache_clear()

    assert warm_tokenizers() == 1

    info = load_tokenizer.cache_info()
    assert info.currsize == 1
    modelversion_tokenizer(workerless_model.versions.get())
    assert load_tokenizer.cache_info().hits == info.hits + 1  # the request's lookup: no load


def test_a_web_server_of_its_own_warms_the_tokenizers_at_start_up(workerless_model, monkeypatch):
    """`make stack`'s and docker-compose's Daphne processes start with PAGODA_WARM_TOKENIZERS=1:
    RegistryConfig.ready() warms the tokenizers in a thread (the embedded server does it beside
    its workers); without the flag (migrate, shell, tests) nothing is loaded."""
    from django.apps import apps

    from webapp.registry import warm_up
    from webapp.registry.tokenizers import load_tokenizer

    started = []
    # the thread's work run here, at once (its own connection would not see this test's rows)
    monkeypatch.setattr(warm_up, "when_apps_ready", lambda work, what, name: started.append(work) or work())
    registry = apps.get_app_config("registry")
    monkeypatch.delenv("PAGODA_WARM_TOKENIZERS", raising=False)
    registry.ready()
    assert started == []
    monkeypatch.setenv("PAGODA_WARM_TOKENIZERS", "1")
    load_tokenizer.cache_clear()
    registry.ready()
    assert started == [warm_up.warm_tokenizers] and load_tokenizer.cache_info().currsize == 1
