"""Tool calling: the request's tools shown to the model, its calls found in the output, and their
OpenAI shapes (``message.tool_calls``, streamed ``delta.tool_calls[i]``).

Format: Hermes (NousResearch Hermes 2 Pro, also Qwen 2.5 and many fine-tunes), the common
default. The tools are rendered as a system block listing their JSON signatures inside
``<tools></tools>``; the model answers each call as ``<tool_call>\\n{"name": ..., "arguments":
{...}}\\n</tool_call>``. SmolLM2's chat template (in the bundled GGUF) renders no tools, so this
block is what every template gets, prepended to (or as) the system message; history turns
become ``<tool_call>`` blocks (assistant) and ``<tool_response>`` blocks (role ``tool``).

``tool_choice``: ``none``: tools are not shown and nothing is parsed; ``auto``: the output is free
and every well-formed ``<tool_call>`` block naming a known tool is a call (the rest stays
content); ``required`` / a named function: the output is constrained by a grammar (a Lark
grammar whose JSON part is each function's parameter schema, engine/structured) to one call
(or, with ``parallel_tool_calls``, one or more), so its arguments always validate.
"""

from __future__ import annotations

import json
import re

from rest_framework import serializers

from webapp.openai_api.constraints import check
from webapp.openai_api.events import (TextDelta, ToolArgumentsDelta, ToolCallBegin, ToolCallParser, engine_reason,
                                      fold)
from webapp.openai_api.hermes import CLOSE, OPEN, ToolPlan

MAX_TOOLS = 128  # OpenAI's cap
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
__all__ = ["ToolPlan", "tool_plan", "template_messages"]


def tool_plan(data: dict) -> ToolPlan | None:
    """The plan of a chat body's ``tools`` / ``tool_choice`` / ``parallel_tool_calls``, checked;
    None when no tool may be called. ValidationError naming the field otherwise."""
    tools, choice = data.get("tools"), data.get("tool_choice")
    parallel = data.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise serializers.ValidationError({"parallel_tool_calls": "must be true or false"})
    if tools in (None, []):
        if choice not in (None, "none"):
            raise serializers.ValidationError({"tool_choice": "is only allowed when tools are given"})
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise serializers.ValidationError({"tools": f"must be a list of at most {MAX_TOOLS} tools"})
    functions = {}
    for i, tool in enumerate(tools):
        function = _function(tool, i)
        if function["name"] in functions:
            raise serializers.ValidationError({"tools": f"tools[{i}]: the name {function['name']!r} is used twice"})
        functions[function["name"]] = function
    named = None
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        named = fn.get("name") if isinstance(fn, dict) else None
        if named not in functions:
            raise serializers.ValidationError({"tool_choice": "must name one of the given tools: "
                                                              '{"type": "function", "function": {"name": ...}}'})
        choice = "named"
    elif choice is None:
        choice = "auto"
    elif choice not in ("none", "auto", "required"):
        raise serializers.ValidationError({"tool_choice": 'must be "none", "auto", "required" or a named function'})
    if choice == "none":
        return None
    plan = ToolPlan(functions, choice, named, parallel)
    if choice in ("required", "named"):
        plan.constraint = {"grammar": _calls_grammar([functions[named]] if named else list(functions.values()),
                                                     parallel and not named)}
        check(plan.constraint, "tools")
    return plan


def _function(tool: object, i: int) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise serializers.ValidationError({"tools": f'{where}: must be {{"type": "function", "function": {{...}}}}'})
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise serializers.ValidationError({"tools": f"{where}.function.name: 1 to 64 letters, digits, underscores "
                                                    "or dashes"})
    description = fn.get("description")
    if description is not None and not isinstance(description, str):
        raise serializers.ValidationError({"tools": f"{where}.function.description: must be a string"})
    parameters = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise serializers.ValidationError({"tools": f"{where}.function.parameters: must be a JSON Schema object"})
    check({"json": parameters}, "tools")  # an unsupported keyword is named here, for this tool
    out = {"name": name, "parameters": parameters}
    if description:
        out["description"] = description
    return out


def _calls_grammar(functions: list[dict], many: bool) -> str:
    """Lark: one ``<tool_call>`` block (or several) whose JSON is a call of one of ``functions``."""
    alternatives = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                     "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]}}
                    for f in functions]
    schema = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    schema = {**schema, "x-guidance": _COMPACT}
    start = 'start: call ("\\n" call)*' if many else "start: call"
    return f'{start}\ncall: "{OPEN}\\n" obj "\\n{CLOSE}"\nobj: %json {json.dumps(schema)}\n'


def template_messages(messages: list[dict], plan: ToolPlan | None) -> list[dict]:
    """Messages as the chat template renders them: tool calls and results as Hermes blocks, and
    the tools' system block first when tools may be called."""
    rendered = []
    for message in messages:
        role = "system" if message["role"] == "developer" else message["role"]
        content = message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            blocks = [f'{OPEN}\n{json.dumps(_history_call(c), ensure_ascii=False)}\n{CLOSE}'
                      for c in message["tool_calls"]]
            content = "\n".join(([content] if content else []) + blocks)
        elif role == "tool":
            content = f"<tool_response>\n{content}\n</tool_response>"
        entry = {"role": role, "content": content}
        if message.get("name"):
            entry["name"] = message["name"]
        rendered.append(entry)
    if plan is not None:
        block = plan.system_block()
        if rendered and rendered[0]["role"] == "system":
            rendered[0] = {**rendered[0], "content": rendered[0]["content"] + "\n\n" + block}
        else:
            rendered.insert(0, {"role": "system", "content": block})
    return rendered


def _history_call(call: dict) -> dict:
    fn = call["function"]
    try:
        arguments = json.loads(fn["arguments"])
    except ValueError:
        arguments = fn["arguments"]
    return {"name": fn["name"], "arguments": arguments}


def openai_delta(event) -> dict | None:
    """A chat ``choices[i].delta`` of one internal event (webapp/openai_api/events.py); None: nothing to send."""
    if isinstance(event, TextDelta):
        return {"content": event.text}
    if isinstance(event, ToolCallBegin):
        return {"tool_calls": [{"index": event.call_index, "id": event.id, "type": "function",
                                "function": {"name": event.name, "arguments": ""}}]}
    if isinstance(event, ToolArgumentsDelta):
        return {"tool_calls": [{"index": event.call_index, "function": {"arguments": event.text}}]}
    return None


class ToolCallStream:
    """One chat choice's stream with tools as OpenAI streams it: content deltas, then per call a
    delta with ``index``, ``id``, ``type`` and ``function.name`` (arguments ""), then its
    ``function.arguments`` in as many deltas as they arrived in."""

    def __init__(self, plan: ToolPlan):
        self.parser = ToolCallParser(plan)
        self.reason: str | None = None

    def feed(self, text: str) -> list[dict]:
        return [d for e in self.parser.feed(text) if (d := openai_delta(e)) is not None]

    def finish(self, reason: str = "stop") -> list[dict]:
        events = self.parser.finish(reason)
        self.reason = events[-1].reason
        return [d for e in events if (d := openai_delta(e)) is not None]


def apply_tool_calls(plan: ToolPlan, choice: dict) -> dict:
    """A finished chat choice with the calls in its text moved to ``message.tool_calls``."""
    text = choice["message"]["content"] or ""
    parser = ToolCallParser(plan)
    folded = fold(parser.feed(text) + parser.finish(engine_reason(choice["finish_reason"])))
    if folded.calls:
        choice["message"].update(content=folded.text.strip() or None, tool_calls=[
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in folded.calls])
        choice["finish_reason"] = folded.finish.reason
    return choice
