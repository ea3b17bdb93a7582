"""Structured outputs through the official openai client against a real server (embedded workers):
every json_schema answer of the bundled SmolLM2 parses and validates, streamed or not, while
unconstrained requests share its batch; those neighbours' answers are what they are alone."""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.e2e

# Short strings and bounded arrays: a 135M model on a busy CPU must finish within max_tokens.
SCHEMAS = {
    "person": {"type": "object", "additionalProperties": False, "required": ["name", "age", "hobbies"],
               "properties": {"name": {"type": "string", "maxLength": 20},
                              "age": {"type": "integer", "minimum": 0, "maximum": 120},
                              "hobbies": {"type": "array", "maxItems": 2,
                                          "items": {"type": "string", "maxLength": 16}}}},
    "order": {"type": "object", "additionalProperties": False, "required": ["status", "items", "customer"],
              "properties": {
                  "status": {"enum": ["open", "paid", "shipped"]},
                  "items": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
                      "type": "object", "additionalProperties": False, "required": ["sku", "qty"],
                      "properties": {"sku": {"type": "string", "maxLength": 8},
                                     "qty": {"type": "integer", "minimum": 1, "maximum": 9}}}},
                  "customer": {"type": "object", "additionalProperties": False, "required": ["city"],
                               "properties": {"city": {"type": "string", "maxLength": 16}}}}},
    "weather": {"type": "object", "additionalProperties": False, "required": ["sky", "celsius"],
                "properties": {"sky": {"enum": ["sunny", "cloudy", "rain"]},
                               "celsius": {"type": "integer", "minimum": -40, "maximum": 50}}},
}
PLAIN = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def client(embedded_site):
    return openai.OpenAI(base_url=f"{embedded_site.url}/v1", api_key=embedded_site.keys["all"], max_retries=0,
                         timeout=600)


def _ask(client, name, stream=False):
    kwargs = dict(model="smollm2", temperature=0.7, seed=3, max_tokens=120,
                  messages=[{"role": "user", "content": f"Describe a {name} as JSON."}],
                  response_format={"type": "json_schema",
                                   "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}})
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        return choice.message.content, choice.finish_reason
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][0]


def test_json_schema_answers_parse_and_validate_streamed_or_not_beside_unconstrained_requests(client):
    with ThreadPoolExecutor(6) as pool:
        constrained = {name: pool.submit(_ask, client, name) for name in SCHEMAS}
        streamed = pool.submit(_ask, client, "order", stream=True)
        plain = [pool.submit(client.chat.completions.create, model="smollm2", messages=PLAIN, max_tokens=24,
                             temperature=0) for _ in range(2)]
        results = {name: f.result() for name, f in constrained.items()} | {"order (streamed)": streamed.result()}
        plain_texts = [f.result().choices[0].message.content for f in plain]
    for name, (text, finish) in results.items():
        assert finish == "stop", (name, text)
        jsonschema.validate(json.loads(text), SCHEMAS[name.split()[0]])
    assert all(t and not t.lstrip().startswith("{") for t in plain_texts), plain_texts  # not constrained


def test_a_neighbours_answer_is_unchanged_by_constrained_requests_in_its_batch(client):
    def greedy():
        return client.chat.completions.create(model="tiny", messages=PLAIN, max_tokens=24, temperature=0,
                                              extra_body={"ignore_eos": True}).choices[0].message.content

    alone = greedy()
    with ThreadPoolExecutor(4) as pool:
        neighbours = [pool.submit(client.chat.completions.create, model="tiny", messages=PLAIN, max_tokens=60,
                                  temperature=1.0, seed=s, response_format={"type": "json_object"})
                      for s in range(3)]
        beside = pool.submit(greedy)
        assert beside.result() == alone
        for f in neighbours:
            assert f.result().choices[0].message.content.startswith("{")


def test_completions_take_vllms_structured_outputs_regex_and_choice(client):
    regex = client.completions.create(model="smollm2", prompt="The date today is", max_tokens=20,
                                      extra_body={"structured_outputs": {"regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"}})
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", regex.choices[0].text)
    choice = client.completions.create(model="smollm2", prompt="Is the sky blue? Answer:", max_tokens=5,
                                       extra_body={"structured_outputs": {"choice": [" yes", " no"]}})
    assert choice.choices[0].text in (" yes", " no") and choice.choices[0].finish_reason == "stop"


def test_an_unsupported_schema_is_a_400_from_the_server(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="smollm2", messages=PLAIN, response_format={
            "type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "array", "uniqueItems": True}}})
    assert info.value.body["param"] == "response_format" and "uniqueItems" in info.value.body["message"]


def test_logit_bias_min_tokens_and_stop_token_ids_reach_the_engine(client, tiny_llm):
    from engine import SamplingParams

    prompt = [9, 8, 7]
    free = tiny_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0].token_ids
    stop = free[2]

    def ids(**extra):
        out = client.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0, logprobs=0,
                                        extra_body={"ignore_eos": True, **extra})
        return out.choices[0].logprobs.tokens, out.choices[0].finish_reason  # one string per token

    forced, _ = ids(logit_bias={"1234": 100})
    assert len(forced) == 10 and len(set(forced)) == 1  # one token, ten times
    stopped, reason = ids(stop_token_ids=[stop])
    assert len(stopped) == free.index(stop) + 1 and reason == "stop"
    held, _ = ids(stop_token_ids=[stop], min_tokens=6)
    assert len(held) >= 6
