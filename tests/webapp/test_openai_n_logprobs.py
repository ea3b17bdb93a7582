"""n choices, chat logprobs in OpenAI's exact shape and cached_tokens, through the real API and a real
embedded worker serving the tiny Llama; the engine's own LLM on the same checkpoint is the reference."""

import json
import uuid

import openai.types
import openai.types.chat
import pytest
from django.contrib.auth import get_user_model
from django.test import AsyncClient

from engine import LLM, SamplingParams
from engine.text.tokenizer import apply_chat_template
from webapp.keys.services import apikey_create
from webapp.registry.models import Model, ModelVersion
from webapp.usage.models import UsageRecord
from workers import embedded

MODEL = "tiny-n"
TINY_SETTINGS = {"num_kv_blocks": 64, "max_model_len": 512, "max_num_seqs": 8}
STORY = [{"role": "user", "content": "Tell me a story about a lighthouse keeper and the sea."}]
SEED = 77
# OpenAI's documented chat logprobs schema (https://platform.openai.com/docs/api-reference/chat/object).
LOGPROBS_KEYS = {"content", "refusal"}
TOKEN_KEYS = {"token", "logprob", "bytes", "top_logprobs"}
TOP_KEYS = {"token", "logprob", "bytes"}


@pytest.fixture(scope="module")
def worker(tiny_llama_dir):
    embedded.start_embedded_worker(MODEL, "1", str(tiny_llama_dir), TINY_SETTINGS)
    assert embedded.wait_for_embedded_worker(MODEL, timeout=60)
    yield
    embedded.stop_embedded_workers(drain_timeout=5)


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), **TINY_SETTINGS)


@pytest.fixture
def key(worker, tiny_llama_dir, smollm2_tokenizer_dir, db):
    """The tiny Llama has the bundled tokenizer: its web-side export (with the chat template) is the same."""
    model = Model.objects.create(slug=MODEL)
    ModelVersion.objects.create(model=model, number=1, path=str(tiny_llama_dir), format="hf", status="active",
                                tokenizer_dir=str(smollm2_tokenizer_dir))
    return apikey_create(owner=get_user_model().objects.create_user("n"), name="n")[1]


def post(client, key, path, **body):
    return client.post(path, data=json.dumps({"model": MODEL, **body}), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {key}")


async def stream(key, path, **body) -> list[dict]:
    """The events of a streamed response, read as Daphne reads them (on the event loop)."""
    response = await AsyncClient().post(path, data=json.dumps({"model": MODEL, "stream": True, **body}),
                                        content_type="application/json", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.content
    raw = b"".join([part async for part in response.streaming_content]).decode()
    parts = [p.removeprefix("data: ") for p in raw.split("\n\n") if p]
    assert parts[-1] == "[DONE]"
    return [json.loads(p) for p in parts[:-1]]


def engine_samples(reference, ids, n, **params):
    return reference.generate([ids], SamplingParams(seed=SEED, ignore_eos=True, **params), n=n)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_n_3_seeded_chat_gives_the_engines_three_distinct_samples_and_sums_their_usage(client, key, reference):
    ids = apply_chat_template(reference.tokenizer, STORY)
    want = engine_samples(reference, ids, 3, temperature=1.0, max_tokens=8)

    response = post(client, key, "/v1/chat/completions", messages=STORY, n=3, seed=SEED, max_tokens=8,
                    temperature=1.0, ignore_eos=True)

    assert response.status_code == 200, response.content
    body = response.json()
    openai.types.chat.ChatCompletion.model_validate(body)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in body["choices"]] == [w.text for w in want]
    assert len({c["message"]["content"] for c in body["choices"]}) == 3
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert body["usage"]["completion_tokens"] == 3 * 8
    record = UsageRecord.objects.get(request_id=body["id"])
    assert (record.prompt_tokens, record.completion_tokens) == (len(ids), 24)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_streamed_n_2_completions_name_each_choice_and_add_up_to_the_unstreamed_ones(key, reference):
    prompt = "The lighthouse keeper opened the door and"
    want = engine_samples(reference, reference.engine.encode_prompt(prompt), 2, temperature=1.0, max_tokens=10)

    chunks = await stream(key, "/v1/completions", prompt=prompt, n=2, seed=SEED, max_tokens=10,
                          ignore_eos=True, stream_options={"include_usage": True})

    for chunk in chunks:  # openai.types.Completion requires a finish_reason, which streamed deltas lack
        assert set(chunk) == {"id", "object", "created", "model", "choices", "usage"}
    texts = {0: "", 1: ""}
    for chunk in chunks[:-1]:
        [choice] = chunk["choices"]
        texts[choice["index"]] += choice["text"]
    assert [texts[0], texts[1]] == [w.text for w in want]
    finishes = [c["choices"][0]["index"] for c in chunks[:-1] if c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1]
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == 20
    assert usage["prompt_tokens"] == len(reference.engine.encode_prompt(prompt))  # the prompt once
    assert isinstance(usage["prompt_tokens_details"]["cached_tokens"], int)  # completions report it too


@pytest.mark.django_db(transaction=True)
def test_chat_logprobs_have_openais_exact_shape_and_the_engines_values(client, key, reference):
    ids = apply_chat_template(reference.tokenizer, STORY)
    [want] = reference.generate([ids], SamplingParams(temperature=0, max_tokens=6, logprobs=3, ignore_eos=True))

    body = post(client, key, "/v1/chat/completions", messages=STORY, temperature=0, max_tokens=6,
                ignore_eos=True, logprobs=True, top_logprobs=3).json()

    parsed = openai.types.chat.ChatCompletion.model_validate(body)
    # The documented keys are the openai package's own fields, no more, no fewer.
    assert LOGPROBS_KEYS == set(openai.types.chat.chat_completion.ChoiceLogprobs.model_fields)
    assert TOKEN_KEYS == set(openai.types.chat.ChatCompletionTokenLogprob.model_fields)
    assert TOP_KEYS == set(openai.types.chat.chat_completion_token_logprob.TopLogprob.model_fields)
    logprobs = body["choices"][0]["logprobs"]
    assert set(logprobs) == LOGPROBS_KEYS and logprobs["refusal"] is None
    assert len(logprobs["content"]) == 6
    for entry, lp in zip(logprobs["content"], want.logprobs):
        assert set(entry) == TOKEN_KEYS and len(entry["top_logprobs"]) == 3
        assert all(set(top) == TOP_KEYS for top in entry["top_logprobs"])
        assert entry["logprob"] == pytest.approx(lp.logprob, abs=1e-4)
        assert entry["token"] == reference.tokenizer.decode([lp.token_id])
        assert bytes(entry["bytes"]) == reference.tokenizer.convert_tokens_to_string(
            [reference.tokenizer.convert_ids_to_tokens(lp.token_id)]).encode()
    assert "".join(e.token for e in parsed.choices[0].logprobs.content) == parsed.choices[0].message.content


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_streamed_chat_logprobs_chunks_parse_as_openais_chunk_type(key):
    chunks = await stream(key, "/v1/chat/completions", messages=STORY, temperature=0, max_tokens=4,
                          ignore_eos=True, logprobs=True, top_logprobs=2, n=2)

    for chunk in chunks:
        openai.types.chat.ChatCompletionChunk.model_validate(chunk)
    content = [c["choices"][0] for c in chunks if c["choices"][0]["logprobs"]]
    assert {c["index"] for c in content} == {0, 1}
    assert sum(len(c["logprobs"]["content"]) for c in content) == 8
    assert all(set(c["logprobs"]) == LOGPROBS_KEYS for c in content)
    assert all(set(e) == TOKEN_KEYS for c in content for e in c["logprobs"]["content"])


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_cached_tokens_count_the_prefix_cache_hits_also_when_streamed(key):
    long_story = [{"role": "user", "content": f"{uuid.uuid4().hex} " + "The sea was calm that night. " * 12}]
    first = await AsyncClient().post("/v1/chat/completions", content_type="application/json",
                                     headers={"Authorization": f"Bearer {key}"}, data=json.dumps(
                                         {"model": MODEL, "messages": long_story, "temperature": 0, "max_tokens": 2}))
    first = first.json()
    again = await stream(key, "/v1/chat/completions", messages=long_story, temperature=0, max_tokens=2,
                         stream_options={"include_usage": True})

    prompt = again[-1]["usage"]["prompt_tokens"]
    cached = again[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (prompt - 1) // 16 * 16  # every full block but the one holding the last token
    # The first time only the chat template's opening (shared with the other tests) was cached.
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] < cached


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize("n", [0, 17, "two", 1.5])
def test_n_outside_1_to_16_is_a_400_naming_n(client, key, n):
    response = post(client, key, "/v1/chat/completions", messages=STORY, n=n)

    assert response.status_code == 400
    assert response.json()["error"]["param"] == "n"
