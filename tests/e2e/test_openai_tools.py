"""Tool calling through the official openai client against a real server on the bundled SmolLM2:
with tool_choice required or named every answer is a valid call (streamed too), and a full round
trip (call, tool message, answer) works."""

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.e2e

WEATHER_PARAMS = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                  "properties": {"city": {"type": "string", "maxLength": 24},
                                 "unit": {"enum": ["celsius", "fahrenheit"]}}}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "The local time in a timezone",
                                      "parameters": {"type": "object", "additionalProperties": False,
                                                     "required": ["timezone"],
                                                     "properties": {"timezone": {"type": "string",
                                                                                 "maxLength": 24}}}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def client(embedded_site):
    return openai.OpenAI(base_url=f"{embedded_site.url}/v1", api_key=embedded_site.keys["all"], max_retries=0,
                         timeout=600)


def _assert_valid_calls(calls, names):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_required_and_named_tool_choices_always_give_a_valid_call(client):
    def ask(seed, choice):
        return client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, tool_choice=choice,
                                              temperature=0.8, seed=seed, max_tokens=80).choices[0]
    named = {"type": "function", "function": {"name": "get_time"}}
    with ThreadPoolExecutor(5) as pool:
        required = [pool.submit(ask, s, "required") for s in range(3)]
        forced = [pool.submit(ask, s, named) for s in range(2)]
        for future in required:
            choice = future.result()
            assert choice.finish_reason == "tool_calls"
            _assert_valid_calls(choice.message.tool_calls, {"get_weather", "get_time"})
        for future in forced:
            choice = future.result()
            assert choice.finish_reason == "tool_calls"
            _assert_valid_calls(choice.message.tool_calls, {"get_time"})


def test_a_streamed_tool_call_arrives_in_openais_delta_shape(client):
    stream = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, stream=True,
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                            temperature=0, max_tokens=80)
    calls: dict[int, dict] = {}
    reasons = []
    for chunk in stream:
        delta = chunk.choices[0].delta
        reasons += [chunk.choices[0].finish_reason] if chunk.choices[0].finish_reason else []
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"id": tc.id, "name": tc.function.name, "arguments": ""})
            entry["arguments"] += tc.function.arguments or ""
    assert reasons == ["tool_calls"]
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER_PARAMS)


def test_a_full_round_trip_call_tool_message_answer(client):
    first = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=80).choices[0].message
    _assert_valid_calls(first.tool_calls, {"get_weather", "get_time"})
    call = first.tool_calls[0]
    history = ASK + [first.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"celsius": 18, "sky": "sunny"})}]
    answer = client.chat.completions.create(model="smollm2", messages=history, tools=TOOLS, temperature=0,
                                            max_tokens=40).choices[0]
    assert answer.finish_reason in ("stop", "length", "tool_calls")
    assert answer.message.content or answer.message.tool_calls
    with pytest.raises(openai.BadRequestError) as info:  # a tool message answering no call
        client.chat.completions.create(model="smollm2", messages=ASK + [
            {"role": "tool", "tool_call_id": "call_nope", "content": "{}"}], tools=TOOLS, max_tokens=4)
    assert info.value.body["param"] == "messages[1].tool_call_id"


def test_streamed_arguments_grow_delta_by_delta_and_a_complete_call_finishes_tool_calls(client):
    """#32: arguments arrive as generated (not in one delta when the call closes), and a required
    call whose arguments closed ends "tool_calls", not "length", under a tight max_tokens."""
    stream = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, stream=True,
                                            tool_choice="required", temperature=0, max_tokens=60)
    arguments, reasons, names = [], [], []
    for chunk in stream:
        reasons += [chunk.choices[0].finish_reason] if chunk.choices[0].finish_reason else []
        for tc in chunk.choices[0].delta.tool_calls or []:
            names += [tc.function.name] if tc.index == 0 and tc.function.name else []
            arguments += [tc.function.arguments] if tc.index == 0 and tc.function.arguments else []
    assert len(arguments) > 1 and reasons == ["tool_calls"]
    jsonschema.validate(json.loads("".join(arguments)), PARAMS[names[0]])

    choice = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, tool_choice="required",
                                            temperature=0, max_tokens=60).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
