"""Tool calls: parsed from the Hermes format as the real chat template renders it, streamed in
OpenAI's delta shape, and refused with the field named when the request is malformed."""

import json
import random

import pytest
from rest_framework import serializers

from webapp.openai_api.tool_calls import ToolCallStream, apply_tool_calls, template_messages, tool_plan
from webapp.registry.tokenizers import load_tokenizer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}
HISTORY = [
    {"role": "user", "content": "Weather in Oslo and the time in Tokyo?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Oslo", "unit": "c"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "JST"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 4}'},
]


@pytest.fixture
def rendered(smollm2_tokenizer_dir):
    """SmolLM2's own template (from the GGUF) rendering the history with the tools' block."""
    plan = tool_plan({"tools": [WEATHER, TIME]})
    text = load_tokenizer(str(smollm2_tokenizer_dir)).render_chat(template_messages(HISTORY, plan))
    return plan, text


def test_the_template_shows_the_tools_and_the_history_as_hermes_blocks(rendered):
    plan, text = rendered
    assert text.startswith("<|im_start|>system\nYou are a function calling AI model.")
    tools = text.split("Here are the available tools: <tools>\n")[1].split("\n</tools>")[0]
    assert [json.loads(line)["function"]["name"] for line in tools.splitlines()] == ["get_weather", "get_time"]
    assert "<|im_start|>tool\n<tool_response>\n{\"celsius\": 4}\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_calls_are_parsed_back_from_the_rendered_assistant_turn(rendered):
    plan, text = rendered
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    content, calls = plan.parse(turn)
    assert content == "Let me check."
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("function", "get_weather", {"city": "Oslo", "unit": "c"}), ("function", "get_time", {"zone": "JST"})]
    assert len({c["id"] for c in calls}) == 2 and all(c["id"].startswith("call_") for c in calls)
    # an unknown tool or broken JSON stays content, as the model wrote it
    assert plan.parse('<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>')[1] == []
    assert plan.parse("<tool_call>\n{not json\n</tool_call>") == ("<tool_call>\n{not json\n</tool_call>", [])


def test_streamed_deltas_add_up_to_the_non_streamed_message(rendered):
    plan, text = rendered
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0] + "\nDone."
    expected = apply_tool_calls(plan, {"message": {"content": turn}, "finish_reason": "stop"})
    rng = random.Random(0)
    stream, pieces, i = ToolCallStream(plan), [], 0
    while i < len(turn):
        n = rng.randint(1, 7)
        pieces.append(turn[i:i + n])
        i += n
    deltas = [d for p in pieces for d in stream.feed(p)] + stream.finish()
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            entry = calls.setdefault(tc["index"], {"id": tc.get("id"), "name": "", "arguments": ""})
            entry["name"] += tc.get("function", {}).get("name", "")
            entry["arguments"] += tc["function"].get("arguments", "")
    assert content.replace("\n", "") == expected["message"]["content"].replace("\n", "")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in expected["message"]["tool_calls"]]
    assert expected["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(("body", "field"), [
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}}]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_malformed_tools_are_refused_naming_the_field(body, field):
    with pytest.raises(serializers.ValidationError) as info:
        tool_plan(body)
    assert field in info.value.detail


def test_required_and_named_choices_carry_a_grammar_and_none_shows_no_tools():
    assert tool_plan({"tools": [WEATHER], "tool_choice": "none"}) is None
    assert tool_plan({"tools": [WEATHER]}).constraint is None  # auto: free output
    named = tool_plan({"tools": [WEATHER, TIME], "tool_choice": {"type": "function",
                                                                 "function": {"name": "get_time"}}})
    assert "get_time" in named.constraint["grammar"] and "get_weather" not in named.constraint["grammar"]
    assert 'call ("\\n" call)*' in tool_plan({"tools": [WEATHER], "tool_choice": "required"}).constraint["grammar"]
    assert 'call ("\\n" call)*' not in tool_plan({"tools": [WEATHER], "tool_choice": "required",
                                                  "parallel_tool_calls": False}).constraint["grammar"]
