"""What an API request becomes for the engine: prompt ids, SamplingParams, stream flags."""

import time

import pytest
from django.contrib.auth import get_user_model

from engine.sampling_params import SamplingParams
from engine.text.tokenizer import apply_chat_template
from webapp.keys.services import apikey_create
from webapp.openai_api.errors import OpenAIError
from webapp.openai_api.services import CHAT, COMPLETIONS, generation_prepare
from webapp.openai_api.views import ChatCompletionCreateApi, CompletionCreateApi
from webapp.registry.models import Model, ModelVersion

pytestmark = pytest.mark.django_db


@pytest.fixture
def api_key(smollm2_tokenizer_dir, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    ModelVersion.objects.create(model=Model.objects.create(slug="smol"), number=1, path=str(gguf), format="gguf",
                                status="active", tokenizer_dir=str(smollm2_tokenizer_dir))
    return apikey_create(owner=get_user_model().objects.create_user("alice"), name="k", can_set_priority=True)[0]


def prepare(api_key, endpoint, data):
    """What the endpoint's view does: its InputSerializer validates the body, then the service prepares it."""
    view = ChatCompletionCreateApi if endpoint == CHAT else CompletionCreateApi
    serializer = view.InputSerializer(data=data)
    serializer.is_valid(raise_exception=True)
    return generation_prepare(request_id="r1", endpoint=endpoint, api_key=api_key,
                              values=serializer.validated_data, started=time.monotonic())


def test_chat_request_maps_onto_engine_sampling_params(api_key, smollm2_hf_tokenizer):
    messages = [{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}]

    gen = prepare(api_key, CHAT, {
        "model": "smol", "messages": messages, "max_tokens": 50, "max_completion_tokens": 7, "temperature": 0.5,
        "top_p": 0.9, "stop": "END", "seed": 3, "presence_penalty": 0.1, "frequency_penalty": 0.2,
        "logprobs": True, "top_logprobs": 3, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1,
        "ignore_eos": True, "priority": -1, "user": "u-1", "stream": True, "stream_options": {"include_usage": True}})

    expected_messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    assert gen.prompt_token_ids == apply_chat_template(smollm2_hf_tokenizer, expected_messages)
    assert gen.params == {"max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "stop": ["END"], "seed": 3,
                          "presence_penalty": 0.1, "frequency_penalty": 0.2, "logprobs": 3, "top_k": 40,
                          "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": True}
    assert SamplingParams(**gen.params).logprobs == 3  # the engine accepts what we send
    assert (gen.priority, gen.stream, gen.include_usage, gen.wants_logprobs) == (-1, True, True, True)
    assert gen.engine_request().model == "smol" and gen.engine_request().request_id == "r1"


def test_a_request_belongs_to_the_key_owner_at_the_key_weight(api_key):
    other_key = apikey_create(owner=api_key.owner, name="second", fair_share_weight=3)[0]
    body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}]}

    first, second = prepare(api_key, CHAT, body).engine_request(), prepare(other_key, CHAT, body).engine_request()

    # one tenant per user, whichever of the user's keys asks; the weight is the key's
    assert first.tenant == second.tenant == f"user:{api_key.owner.pk}"
    assert (first.tenant_weight, second.tenant_weight) == (1.0, 3.0)


def test_chat_without_a_length_limit_leaves_it_to_the_context(api_key):
    gen = prepare(api_key, CHAT, {"model": "smol", "messages": [{"role": "user", "content": "hi"}]})

    assert gen.params == {"max_tokens": None}
    assert not gen.wants_logprobs and not gen.stream


def test_completion_defaults_to_16_tokens_and_takes_token_ids_verbatim(api_key, smollm2_hf_tokenizer):
    text = prepare(api_key, COMPLETIONS, {"model": "smol", "prompt": "Once upon a time", "logprobs": 0})
    ids = prepare(api_key, COMPLETIONS, {"model": "smol", "prompt": [[5, 6, 7]]})

    assert text.prompt_token_ids == smollm2_hf_tokenizer.encode("Once upon a time")
    assert text.params == {"max_tokens": 16, "logprobs": 0} and text.wants_logprobs
    assert ids.prompt_token_ids == [5, 6, 7]


def test_a_template_that_refuses_the_conversation_is_a_400_on_messages(api_key, tmp_path):
    import json
    import shutil

    version = ModelVersion.objects.get()
    strict = tmp_path / "strict"
    shutil.copytree(version.tokenizer_dir, strict)
    config = json.loads((strict / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ raise_exception('Conversation roles must alternate') }}"
    (strict / "tokenizer_config.json").write_text(json.dumps(config))
    ModelVersion.objects.filter(pk=version.pk).update(tokenizer_dir=str(strict))

    with pytest.raises(OpenAIError) as caught:
        prepare(api_key, CHAT, {"model": "smol", "messages": [{"role": "user", "content": "hi"}]})
    assert (caught.value.status, caught.value.param) == (400, "messages")
    assert "alternate" in caught.value.message


def test_preparing_a_request_reads_the_registry_once(api_key, django_assert_max_num_queries):
    """Every request pays for this with the GIL held, beside the engine's thread (embedded mode):
    the model, its version and the key's scope are looked up once (they were twice), the budget
    rows once, and the usage record is written once."""
    prepare(api_key, COMPLETIONS, {"model": "smol", "prompt": "warm"})  # the tokenizer loads
    with django_assert_max_num_queries(6):
        prepare(api_key, COMPLETIONS, {"model": "smol", "prompt": "Once upon a time", "logit_bias": {"5": 1}})


def test_a_logit_bias_beyond_the_vocabulary_names_its_size(api_key, smollm2_hf_tokenizer):
    with pytest.raises(OpenAIError) as err:
        prepare(api_key, COMPLETIONS, {"model": "smol", "prompt": "x", "logit_bias": {"49152": 1}})
    assert err.value.param == "logit_bias" and "49152" in str(err.value.message)
