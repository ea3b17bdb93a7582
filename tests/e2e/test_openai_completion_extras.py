"""/v1/completions' echo, best_of and suffix through the official openai client against a real
server (embedded workers, the bundled SmolLM2)."""

import httpx
import openai
import pytest

pytestmark = pytest.mark.e2e

PROMPT = "The lighthouse keeper opened the door and"


@pytest.fixture(scope="module")
def client(embedded_site):
    return openai.OpenAI(base_url=f"{embedded_site.url}/v1", api_key=embedded_site.keys["all"], max_retries=0,
                         timeout=600)


def test_echo_prefixes_the_prompt_streamed_or_not(client):
    plain = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0)
    echoed = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0, echo=True)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0, echo=True, stream=True) if c.choices)

    assert echoed.choices[0].text == PROMPT + plain.choices[0].text == streamed
    assert echoed.usage == plain.usage


def test_best_of_answers_the_samples_of_highest_total_logprob(client):
    samples = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=7,
                                        n=3, logprobs=0)
    ranked = sorted(samples.choices, key=lambda c: -sum(c.logprobs.token_logprobs))
    best = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=7,
                                     n=2, best_of=3)

    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert [c.index for c in best.choices] == [0, 1] and best.choices[0].logprobs is None
    assert best.usage.completion_tokens == samples.usage.completion_tokens  # every sample is billed


def test_suffix_without_fill_in_the_middle_tokens_and_streamed_best_of_are_refused(client):
    with pytest.raises(openai.BadRequestError) as suffix:
        client.completions.create(model="smollm2", prompt="def add(a, b):", suffix="    return c", max_tokens=4)
    assert suffix.value.body["param"] == "suffix" and "fill-in-the-middle" in suffix.value.body["message"]

    with pytest.raises(openai.BadRequestError) as streamed:
        client.completions.create(model="smollm2", prompt=PROMPT, best_of=2, stream=True)
    assert streamed.value.body["param"] == "best_of"


PROMPTS = [PROMPT, "Once upon a time, in a small village,", "The recipe for bread is simple:"]


def test_a_list_of_prompts_answers_each_as_alone_indexed_prompt_by_prompt(client):
    alone = [client.completions.create(model="smollm2", prompt=p, max_tokens=6, temperature=0) for p in PROMPTS]

    listed = client.completions.create(model="smollm2", prompt=PROMPTS, max_tokens=6, temperature=0, n=2)

    assert [c.index for c in listed.choices] == list(range(6))
    assert [c.text for c in listed.choices] == [a.choices[0].text for a in alone for _ in range(2)]
    assert listed.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert listed.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)


def test_a_streamed_list_of_token_prompts_interleaves_its_choices_by_index(client, embedded_site):
    tokens = [httpx.post(f"{embedded_site.url}/tokenize", json={"model": "smollm2", "prompt": p}, timeout=60,
                         headers={"Authorization": f"Bearer {embedded_site.keys['all']}"}).json()["tokens"]
              for p in PROMPTS[:2]]
    alone = [client.completions.create(model="smollm2", prompt=p, max_tokens=6, temperature=0) for p in PROMPTS[:2]]

    texts, usage = {0: "", 1: ""}, None
    for chunk in client.completions.create(model="smollm2", prompt=tokens, max_tokens=6, temperature=0, echo=True,
                                           stream=True, stream_options={"include_usage": True}):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
        usage = chunk.usage or usage

    assert [texts[0], texts[1]] == [p + a.choices[0].text for p, a in zip(PROMPTS, alone)]
    assert usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
