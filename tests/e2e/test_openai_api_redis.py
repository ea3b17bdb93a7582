"""Distributed mode: Daphne and a `manage.py run_engine_worker` process meet through a real Redis."""

import time

import httpx
import openai
import pytest

from engine.sampling_params import SamplingParams
from tests.e2e.sites import READYZ_TOKEN

pytestmark = pytest.mark.e2e

HEARTBEAT_S = 1.5  # a worker heartbeat (with its stats) is at most this old
STORY = [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def client(redis_site):
    return openai.OpenAI(base_url=f"{redis_site.url}/v1", api_key=redis_site.keys["all"], max_retries=0,
                         timeout=120)


def test_greedy_chat_over_redis_equals_the_engines_and_is_accounted(client, redis_site, tiny_llm):
    reference = tiny_llm.chat(STORY, SamplingParams(temperature=0, max_tokens=12))[0]

    response = client.chat.completions.create(model="tiny", messages=STORY, temperature=0, max_tokens=12)

    assert response.choices[0].message.content == reference.text
    record = redis_site.usage(response.id)
    assert (record["status"], record["prompt_tokens"], record["completion_tokens"]) == \
        ("ok", len(reference.prompt_token_ids), len(reference.token_ids))


def test_streamed_completion_over_redis_ends_with_the_usage_chunk(client):
    whole = client.completions.create(model="tiny", prompt="Once upon a time", temperature=0, max_tokens=20)
    chunks = list(client.completions.create(model="tiny", prompt="Once upon a time", temperature=0,
                                            max_tokens=20, stream=True, stream_options={"include_usage": True}))

    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_an_active_model_without_a_worker_is_503_no_worker(client, redis_site):
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="idle", messages=STORY)

    assert caught.value.status_code == 503 and caught.value.code == "no_worker"
    assert redis_site.last_usage()["error_code"] == "no_worker"


def test_readyz_names_the_model_no_worker_serves(redis_site):
    response = httpx.get(f"{redis_site.url}/readyz", headers={"X-Readyz-Token": READYZ_TOKEN})

    assert response.status_code == 503
    body = response.json()
    assert body["reasons"] == ["no live worker serves the model 'idle'"]
    assert body["checks"]["redis"] == "ok" and body["checks"]["database"] == "ok"


def test_closing_a_stream_aborts_the_request_in_the_worker_process(redis_site, disconnect_stream):
    # 8 choices of 480 tokens: one alone (about 1 s of the tiny model) finished before the abort
    # reached the worker in a CI run, and 480 is near the tiny model's whole context
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 480, "n": 8, "ignore_eos": True}
    time.sleep(HEARTBEAT_S)  # the counter below then includes every earlier request
    generated_before = redis_site.metric("pagoda:generation_tokens_total", model_name="tiny")

    # The tiny model may outrun a one-second heartbeat: judge by what the worker generated.
    request_id = disconnect_stream(redis_site, redis_site.keys["all"], body, wait_running=False)

    redis_site.wait_until(lambda: redis_site.metric("pagoda:num_requests_running", model_name="tiny") == 0,
                          "the worker dropping the abandoned request")
    time.sleep(HEARTBEAT_S)
    generated = redis_site.metric("pagoda:generation_tokens_total", model_name="tiny") - generated_before
    assert 0 < generated < 8 * 480
    assert redis_site.usage(request_id)["status"] == "aborted"
