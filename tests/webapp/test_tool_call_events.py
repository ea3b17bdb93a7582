"""The internal event stream's tool calls (webapp/openai_api/events.py): arguments stream as they
arrive, token by token, and add up to the call the whole text holds; a call whose arguments closed
finishes the choice with tool_calls even when the token limit cut what followed."""

import json

from webapp.openai_api.events import (Finish, TextDelta, ToolArgumentsDelta, ToolCallBegin, ToolCallEnd,
                                      ToolCallParser, fold)
from webapp.openai_api.tool_calls import tool_plan

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}ris \\"x\\"", "n": [1, {"a": 2}]}}\n</tool_call>'


def feed_in_pieces(parser, text, size):
    return [e for i in range(0, len(text), size) for e in parser.feed(text[i:i + size])]


def test_arguments_stream_in_many_deltas_and_add_up_to_the_call():
    plan = tool_plan({"tools": [WEATHER]})
    parser = ToolCallParser(plan)
    events = feed_in_pieces(parser, "Let me look." + CALL + "\nDone.", 3) + parser.finish("stop")

    deltas = [e.text for e in events if isinstance(e, ToolArgumentsDelta)]
    (end,) = [e for e in events if isinstance(e, ToolCallEnd)]
    assert len(deltas) > 5 and "".join(deltas) == end.arguments and end.is_complete
    assert json.loads(end.arguments) == {"city": 'Pa}ris "x"', "n": [1, {"a": 2}]}
    # the arguments leave before the block closes: the call began and streamed ahead of '</tool_call>'
    begin = next(i for i, e in enumerate(events) if isinstance(e, ToolCallBegin))
    assert events[begin].name == "get_weather" and isinstance(events[begin + 1], ToolArgumentsDelta)
    folded = fold(events)
    assert folded.text == "Let me look.\nDone." and folded.finish == Finish("tool_calls")
    assert [c["arguments"] for c in folded.calls] == [end.arguments]


def test_complete_arguments_cut_before_the_block_closes_still_finish_with_tool_calls():
    plan = tool_plan({"tools": [WEATHER], "tool_choice": "required"})
    parser = ToolCallParser(plan)
    cut = CALL[:CALL.index("}}\n</tool_call>") + 1]  # the arguments' object closed, the rest never came
    events = parser.feed(cut) + parser.finish("length")
    assert fold(events).finish.reason == "tool_calls" and len(fold(events).calls) == 1

    parser = ToolCallParser(plan)
    second = CALL[:CALL.index('"city"') + 4]  # a second call cut inside its arguments
    events = parser.feed(CALL + "\n" + second) + parser.finish("length")
    assert fold(events).finish.reason == "tool_calls" and len(fold(events).calls) == 1
    assert fold(events).text == ""
    assert [e.is_complete for e in events if isinstance(e, ToolCallEnd)] == [True, False]


def test_unknown_tools_and_broken_blocks_stay_text():
    parser = ToolCallParser(tool_plan({"tools": [WEATHER]}))
    text = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    events = feed_in_pieces(parser, text, 2) + parser.finish("stop")
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == text
    assert events[-1] == Finish("stop")
