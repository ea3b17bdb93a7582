"""Anthropic's Messages API through the official anthropic client against a real server (embedded
workers, the bundled SmolLM2): answers are the chat completion's own (the same engine request),
streamed or not; stop_reason values; a tool round trip with the tool input streamed in several
input_json_delta events; refusals in Anthropic's error shape."""

import json

import anthropic
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.e2e

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}}}
TOOLS = [{"name": "get_weather", "description": "The current weather in a city", "input_schema": WEATHER}]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
GREEDY = {"temperature": 0}  # anthropic 2.x dropped temperature from create()'s arguments; the API takes it
STORY = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def client(embedded_site):
    return anthropic.Anthropic(base_url=embedded_site.url, api_key=embedded_site.keys["all"], max_retries=0,
                               timeout=600)


@pytest.fixture(scope="module")
def chat(embedded_site):
    return openai.OpenAI(base_url=f"{embedded_site.url}/v1", api_key=embedded_site.keys["all"], max_retries=0,
                         timeout=600)


def test_a_message_is_the_chat_completions_answer_with_anthropics_usage(client, chat, embedded_site):
    message = client.messages.create(model="smollm2", max_tokens=24, system="You are terse.", messages=STORY,
                                     extra_body=GREEDY)
    reference = chat.chat.completions.create(model="smollm2", max_tokens=24, extra_body=GREEDY, messages=[
        {"role": "system", "content": "You are terse."}, *STORY])

    assert isinstance(message, anthropic.types.Message) and message.id.startswith("msg_")
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == reference.choices[0].message.content
    assert message.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[reference.choices[0].finish_reason]
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == reference.usage.prompt_tokens
    assert usage.output_tokens == reference.usage.completion_tokens
    record = embedded_site.usage(message.id)
    assert record["endpoint"] == "messages" and record["completion_tokens"] == usage.output_tokens

    counted = client.messages.count_tokens(model="smollm2", system="You are terse.", messages=STORY)
    assert counted.input_tokens == reference.usage.prompt_tokens


def test_a_stop_sequence_ends_with_stop_sequence_and_names_it(client):
    free = client.messages.create(model="smollm2", max_tokens=30, messages=STORY, extra_body=GREEDY).content[0].text
    words = free.split()
    stop = words[len(words) // 2]
    message = client.messages.create(model="smollm2", max_tokens=30, messages=STORY, extra_body=GREEDY,
                                     stop_sequences=[stop])

    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert free.startswith(message.content[0].text) and stop not in message.content[0].text


def test_a_streamed_message_adds_up_to_the_unstreamed_one(client):
    message = client.messages.create(model="smollm2", max_tokens=20, messages=STORY, extra_body=GREEDY)
    with client.messages.stream(model="smollm2", max_tokens=20, messages=STORY, extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()

    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert {"content_block_start", "content_block_delta", "content_block_stop"} <= set(kinds)
    assert final.content[0].text == message.content[0].text and final.stop_reason == message.stop_reason
    assert final.usage.output_tokens == message.usage.output_tokens


def test_a_tool_round_trip_streams_the_input_in_several_deltas(client):
    with client.messages.stream(model="smollm2", max_tokens=60, messages=ASK, tools=TOOLS, extra_body=GREEDY,
                                tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        partials = [e.delta.partial_json for e in stream
                    if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        call = stream.get_final_message()

    assert call.stop_reason == "tool_use" and len(partials) > 1
    (block,) = [b for b in call.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.id.startswith("toolu_")
    jsonschema.validate(block.input, WEATHER)
    assert json.loads("".join(partials)) == block.input

    answer = client.messages.create(model="smollm2", max_tokens=30, tools=TOOLS, extra_body=GREEDY, messages=[
        *ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in call.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id,
                                      "content": '{"celsius": 21, "sky": "sunny"}'}]}])
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.content


def test_refusals_are_anthropic_error_objects(client, embedded_site):
    with pytest.raises(anthropic.BadRequestError) as missing:
        client.messages.create(model="smollm2", messages=STORY, max_tokens=None)  # type: ignore[arg-type]
    assert missing.value.body["type"] == "error"
    assert missing.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in missing.value.body["error"]["message"]

    with pytest.raises(anthropic.BadRequestError) as extra:
        client.messages.create(model="smollm2", messages=STORY, max_tokens=5, extra_body={"colour": "blue"})
    assert "colour" in extra.value.body["error"]["message"]

    with pytest.raises(anthropic.BadRequestError) as unknown:
        client.messages.create(model="smollm2", max_tokens=5, messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "4"}]}])
    assert "toolu_nope" in unknown.value.body["error"]["message"]

    with pytest.raises(anthropic.NotFoundError) as model:
        client.messages.create(model="nope", max_tokens=5, messages=STORY)
    assert model.value.body["error"]["type"] == "not_found_error"

    stranger = anthropic.Anthropic(base_url=embedded_site.url, api_key="pk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as key:
        stranger.messages.create(model="smollm2", max_tokens=5, messages=STORY)
    assert key.value.body["error"]["type"] == "authentication_error"
