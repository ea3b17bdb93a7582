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
import uuid
from dataclasses import dataclass, field

from rest_framework import serializers

from webapp.openai_api.constraints import check

MAX_TOOLS = 128  # OpenAI's cap
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
SYSTEM_BLOCK = (
    "You are a function calling AI model. You are provided with function signatures within <tools></tools> "
    "XML tags. You may call one or more functions to assist with the user query. Don't make assumptions "
    "about what values to plug into functions. Here are the available tools: <tools>\n{tools}\n</tools>\n"
    "For each function call return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-dict>}}\n</tool_call>')


@dataclass
class ToolPlan:
    """A request's tools and how they may be called."""

    functions: dict[str, dict]  # name -> {"name", "description", "parameters"}
    choice: str  # "auto" | "required" | "named"
    named: str | None = None
    parallel: bool = True
    constraint: dict | None = field(default=None)  # engine structured_outputs, required / named

    def system_block(self) -> str:
        signatures = [json.dumps({"type": "function", "function": f}, ensure_ascii=False)
                      for f in self.functions.values()]
        return SYSTEM_BLOCK.format(tools="\n".join(signatures))

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(content outside the calls, or None; the calls in OpenAI's shape)."""
        calls, kept, last = [], [], 0
        for match in _BLOCK.finditer(text):
            call = self._call(match.group(1))
            if call is not None:
                kept.append(text[last:match.start()])
                last = match.end()
                calls.append(call)
        if not calls:
            return text, []
        content = ("".join(kept) + text[last:]).strip()
        return content or None, calls

    def _call(self, body: str) -> dict | None:
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in self.functions:
            return None
        arguments = obj.get("arguments", obj.get("parameters", {}))
        if not isinstance(arguments, dict):
            return None
        return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                "function": {"name": obj["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}}


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


class ToolCallStream:
    """One chat choice's stream with tools: content deltas pass until a ``<tool_call>`` may be
    starting (that text is held back); each complete call leaves as OpenAI streams it: a delta
    with ``index``, ``id``, ``type`` and ``function.name`` (arguments ""), then one with the
    ``function.arguments``."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.pending = ""
        self.num_calls = 0

    def feed(self, text: str) -> list[dict]:
        """The deltas (``choices[i].delta`` objects) that ``text`` completes."""
        self.pending += text
        deltas = []
        while True:
            start = self.pending.find(OPEN)
            if start < 0:
                keep = _partial_suffix(self.pending, OPEN)
                if not self.pending[:len(self.pending) - keep].strip():
                    return deltas  # whitespace waits: it may only separate two calls
                if len(self.pending) > keep:
                    deltas.append({"content": self.pending[:len(self.pending) - keep]})
                    self.pending = self.pending[len(self.pending) - keep:]
                return deltas
            end = self.pending.find(CLOSE, start)
            if end < 0:
                if self.pending[:start].strip():
                    deltas.append({"content": self.pending[:start]})
                    self.pending = self.pending[start:]
                return deltas
            if self.pending[:start].strip():
                deltas.append({"content": self.pending[:start]})
            block = self.pending[start:end + len(CLOSE)]
            self.pending = self.pending[end + len(CLOSE):]
            content, calls = self.plan.parse(block)
            if calls:
                deltas.extend(self._call_deltas(calls[0]))
            elif content:
                deltas.append({"content": content})

    def finish(self) -> list[dict]:
        deltas = [{"content": self.pending}] if self.pending.strip() else []
        self.pending = ""
        return deltas

    def _call_deltas(self, call: dict) -> list[dict]:
        index, self.num_calls = self.num_calls, self.num_calls + 1
        fn = call["function"]
        return [{"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                 "function": {"name": fn["name"], "arguments": ""}}]},
                {"tool_calls": [{"index": index, "function": {"arguments": fn["arguments"]}}]}]


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that begins ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def _reason(reason: str | None, num_calls: int) -> str | None:
    reason = "stop" if reason == "abort" else reason
    return "tool_calls" if reason == "stop" and num_calls else reason


def apply_tool_calls(plan: ToolPlan, choice: dict) -> dict:
    """A finished chat choice with the calls in its text moved to ``message.tool_calls``."""
    content, calls = plan.parse(choice["message"]["content"] or "")
    if calls:
        choice["message"].update(content=content, tool_calls=calls)
        choice["finish_reason"] = _reason(choice["finish_reason"], len(calls))
    return choice


def stream_choices(stream: ToolCallStream, text: str, reason: str | None) -> list[dict]:
    """The streamed choice objects (without ``index``) of one delta of text and its end."""
    out = [{"delta": d, "logprobs": None, "finish_reason": None} for d in stream.feed(text)]
    if reason is not None:
        out += [{"delta": d, "logprobs": None, "finish_reason": None} for d in stream.finish()]
        out.append({"delta": {}, "logprobs": None, "finish_reason": _reason(reason, stream.num_calls)})
    return out
