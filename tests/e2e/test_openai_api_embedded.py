"""The official openai client against Daphne in embedded mode (workers inside the web process)."""

import httpx
import openai
import pytest

from engine.sampling_params import SamplingParams
from engine.text.tokenizer import apply_chat_template, load_tokenizer
from tests.e2e.sites import READYZ_TOKEN

pytestmark = pytest.mark.e2e

STORY = [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}]
PROMPT = "The lighthouse keeper opened the door and"
# SmolLM2 needs far longer than this for 300 tokens on a CPU: an early end means the abort worked.
ABORT_WITHIN_S = 6.0


@pytest.fixture(scope="module")
def client(embedded_site):
    return openai.OpenAI(base_url=f"{embedded_site.url}/v1", api_key=embedded_site.keys["all"], max_retries=0,
                         timeout=120)


@pytest.fixture(scope="module")
def greedy_story(tiny_llm):
    """The engine's own greedy continuation of STORY (12 tokens)."""
    return tiny_llm.chat(STORY, SamplingParams(temperature=0, max_tokens=12))[0]


def test_models_lists_both_served_models(client):
    assert sorted(m.id for m in client.models.list()) == ["smollm2", "tiny"]
    assert client.models.retrieve("tiny").id == "tiny"


def test_readyz_is_ready_once_every_active_model_has_a_worker(embedded_site):
    response = httpx.get(f"{embedded_site.url}/readyz", headers={"X-Readyz-Token": READYZ_TOKEN})

    assert response.status_code == 200 and response.json()["checks"]["workers"] == "ok"


def test_greedy_chat_completion_and_its_usage_record_equal_the_engines(client, embedded_site, greedy_story):
    response = client.chat.completions.create(model="tiny", messages=STORY, temperature=0, max_tokens=12)

    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == greedy_story.text
    assert choice.finish_reason == greedy_story.finish_reason
    assert response.usage.prompt_tokens == len(greedy_story.prompt_token_ids)
    assert response.usage.completion_tokens == len(greedy_story.token_ids)
    record = embedded_site.usage(response.id)
    assert (record["status"], record["endpoint"], record["finish_reason"]) == ("ok", "chat.completions",
                                                                              greedy_story.finish_reason)
    assert record["prompt_tokens"] == len(greedy_story.prompt_token_ids)
    assert record["completion_tokens"] == len(greedy_story.token_ids)
    assert 0 < record["time_to_first_token"] <= record["latency"]


def test_streamed_chat_adds_up_to_the_engines_text_and_ends_with_a_usage_chunk(client, embedded_site,
                                                                                 greedy_story):
    chunks = list(client.chat.completions.create(model="tiny", messages=STORY, temperature=0, max_tokens=12,
                                                 stream=True, stream_options={"include_usage": True}))

    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == greedy_story.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [greedy_story.finish_reason]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and all(c.usage is None for c in chunks[:-1])
    assert usage_chunk.usage.prompt_tokens == len(greedy_story.prompt_token_ids)
    assert usage_chunk.usage.completion_tokens == len(greedy_story.token_ids)
    assert usage_chunk.usage.total_tokens == len(greedy_story.prompt_token_ids) + len(greedy_story.token_ids)
    assert embedded_site.usage(chunks[0].id)["completion_tokens"] == len(greedy_story.token_ids)


def test_a_stream_without_include_usage_has_no_usage_and_ends_with_done(embedded_site):
    response = httpx.post(f"{embedded_site.url}/v1/chat/completions", timeout=60,
                          headers={"Authorization": f"Bearer {embedded_site.keys['all']}"},
                          json={"model": "tiny", "messages": STORY, "max_tokens": 4, "stream": True})

    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert all('"usage"' not in event for event in events)


def test_completion_text_and_logprobs_equal_the_engines(client, tiny_llm):
    reference = tiny_llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=10, logprobs=2))[0]

    response = client.completions.create(model="tiny", prompt=PROMPT, temperature=0, max_tokens=10, logprobs=2)

    choice = response.choices[0]
    assert choice.text == reference.text
    assert response.usage.prompt_tokens == len(reference.prompt_token_ids)
    assert choice.logprobs.token_logprobs == pytest.approx([lp.logprob for lp in reference.logprobs], abs=1e-4)
    assert [len(top) for top in choice.logprobs.top_logprobs] == [2] * len(reference.token_ids)


def test_streamed_completion_adds_up_to_the_non_streamed_one(client):
    whole = client.completions.create(model="tiny", prompt=PROMPT, temperature=0, max_tokens=16)
    parts = list(client.completions.create(model="tiny", prompt=PROMPT, temperature=0, max_tokens=16,
                                           stream=True))

    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text
    assert parts[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_seeded_sampling_equals_the_engines_and_repeats(client, tiny_llm):
    params = dict(temperature=1.0, top_p=0.9, max_tokens=12, seed=1234)
    reference = tiny_llm.generate(PROMPT, SamplingParams(**params, top_k=50))[0]

    first, second = (client.completions.create(model="tiny", prompt=PROMPT, extra_body={"top_k": 50}, **params)
                     for _ in range(2))

    assert first.choices[0].text == second.choices[0].text == reference.text


def test_a_stop_string_ends_the_text_before_it(client, greedy_story):
    stop = greedy_story.text.split()[2]
    expected = greedy_story.text[:greedy_story.text.index(stop)]

    response = client.chat.completions.create(model="tiny", messages=STORY, temperature=0, max_tokens=12,
                                              stop=[stop])

    assert response.choices[0].message.content == expected
    assert response.choices[0].finish_reason == "stop"


def test_a_repeated_prompt_reports_its_prefix_cache_hits(client, embedded_site):
    messages = [{"role": "system", "content": "You are a lighthouse. " * 12}, STORY[0]]
    client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)

    again = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)

    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached >= 16 and cached % 16 == 0 and cached < again.usage.prompt_tokens
    assert embedded_site.usage(again.id)["cached_prompt_tokens"] == cached


def test_wrong_key_is_401_invalid_api_key(embedded_site):
    bad = openai.OpenAI(base_url=f"{embedded_site.url}/v1", api_key="pgd-nope", max_retries=0)

    with pytest.raises(openai.AuthenticationError) as caught:
        bad.chat.completions.create(model="tiny", messages=STORY)
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"


def test_model_outside_the_keys_scope_is_404_like_an_unknown_one(embedded_site):
    scoped = openai.OpenAI(base_url=f"{embedded_site.url}/v1", api_key=embedded_site.keys["tiny"], max_retries=0)

    with pytest.raises(openai.NotFoundError) as caught:
        scoped.chat.completions.create(model="smollm2", messages=STORY)
    assert caught.value.code == "model_not_found" and caught.value.param == "model"
    assert [m.id for m in scoped.models.list()] == ["tiny"]


def test_unknown_model_is_404_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-17", prompt="hi")
    assert caught.value.code == "model_not_found" and caught.value.param == "model"


@pytest.mark.parametrize("stream", [False, True])
def test_too_long_a_conversation_is_400_context_length_exceeded_on_messages(client, embedded_site, stream):
    messages = [{"role": "user", "content": "lighthouse " * 600}]

    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, stream=stream)
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "messages"


def test_too_many_requested_tokens_is_400_context_length_exceeded_on_prompt(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=600)
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "prompt"


def test_n_above_16_is_400_naming_n(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=STORY, n=17)
    assert caught.value.param == "n" and "from 1 to 16" in caught.value.message


def test_closing_a_stream_aborts_the_generation(embedded_site, disconnect_stream):
    body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 300, "ignore_eos": True}

    request_id = disconnect_stream(embedded_site, embedded_site.keys["all"], body)

    embedded_site.wait_until(
        lambda: embedded_site.metric("pagoda:num_requests_running", model_name="smollm2") == 0,
        "the worker dropping the abandoned request", timeout=ABORT_WITHIN_S)
    record = embedded_site.usage(request_id)
    assert record["status"] == "aborted" and 0 < record["completion_tokens"] < 300
    assert record["finish_reason"] == ""


def test_hanging_up_on_a_non_streamed_request_aborts_it(embedded_site, hang_up):
    body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 300, "ignore_eos": True}

    hang_up(embedded_site, embedded_site.keys["all"], body)

    embedded_site.wait_until(
        lambda: embedded_site.metric("pagoda:num_requests_running", model_name="smollm2") == 0,
        "the worker dropping the abandoned request", timeout=ABORT_WITHIN_S)
    record = embedded_site.last_usage()
    assert (record["status"], record["model_name"]) == ("aborted", "smollm2")
    assert record["completion_tokens"] < 300


def test_metrics_show_worker_state_and_api_requests(embedded_site, client):
    client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2)

    assert embedded_site.metric("pagoda:generation_tokens_total", model_name="tiny") > 0
    assert embedded_site.metric("pagoda:kv_cache_usage_perc", model_name="smollm2") == 0
    assert embedded_site.metric("pagoda:api_requests_total", model_name="tiny", endpoint="completions",
                                status="ok") >= 1
    assert embedded_site.metric("pagoda:time_to_first_token_seconds_count", model_name="tiny") >= 1


def test_bundled_smollm2_answers_a_question(client, embedded_site):
    # Not "the capital of France": there the 135M model's first token is a near-tie ("The" over
    # "L'" by 0.08 nats in transformers fp32) that int8-rounded activations flip, in our kernels
    # and in llama.cpp's alike ("L'Étoile, la Marseillaise, ...").
    messages = [{"role": "user", "content": "What is 2+2?"}]

    response = client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=12)
    streamed = list(client.chat.completions.create(model="smollm2", messages=messages, temperature=0,
                                                   max_tokens=12, stream=True))

    assert "4" in response.choices[0].message.content
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == response.choices[0].message.content
    assert response.usage.prompt_tokens == len(apply_chat_template(load_tokenizer("smollm2"), messages))
    assert embedded_site.usage(response.id)["prompt_tokens"] == response.usage.prompt_tokens
