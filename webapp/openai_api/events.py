"""The one internal event stream every API renders: an engine choice's text turned into text
deltas, tool calls (begun, their arguments growing token by token, ended) and its finish.

Each API (chat and legacy completions, Anthropic Messages, OpenAI Responses) renders these same
events into its own shape, streamed or folded into one body (``fold``), so tool calls are parsed
once, the same way, for all of them.

Tool calls are the Hermes blocks of webapp/openai_api/tool_calls.py. A block whose JSON opens with
``{"name": <a known tool>, "arguments": {`` (the order the required / named grammar writes, and
the one models trained on Hermes write) streams its arguments as they arrive, the JSON object's
own text up to its closing brace; any other block is read whole at ``</tool_call>`` (an unknown
tool or broken JSON stays content, as before). A call is complete when its arguments' object
closes, whether or not ``</tool_call>`` followed before the token limit: its choice then finishes
with ``tool_calls`` (a required call of max_tokens=60 used to end ``length`` that way).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from webapp.openai_api.hermes import CLOSE, OPEN, ToolPlan, partial_suffix
from workers.protocol import Chunk

_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')


@dataclass
class TextDelta:
    text: str
    logprobs: list[dict] | None = None


@dataclass
class ToolCallBegin:
    call_index: int  # 0, 1, ... within the choice
    id: str
    name: str


@dataclass
class ToolArgumentsDelta:
    call_index: int
    text: str


@dataclass
class ToolCallEnd:
    call_index: int
    arguments: str  # the whole arguments text (the deltas joined)
    is_complete: bool  # False: cut by the token limit


@dataclass
class Finish:
    reason: str  # "stop" | "length" | "tool_calls"
    stop_sequence: str | None = None  # the stop string that ended it, if one did


Event = TextDelta | ToolCallBegin | ToolArgumentsDelta | ToolCallEnd | Finish


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class _Arguments:
    """A JSON object's text arriving piece by piece: where it closes."""

    def __init__(self):
        self.depth, self.in_string, self.escaped = 0, False, False
        self.text = ""

    def take(self, text: str) -> int:
        """How much of ``text`` belongs to the object (all of it unless it closes inside)."""
        for i, char in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.text += text[:i + 1]
                    return i + 1
        self.text += text
        return len(text)

    @property
    def is_closed(self) -> bool:
        return self.depth == 0 and bool(self.text)


class ToolCallParser:
    """One choice's text with tools as events: content passes until a ``<tool_call>`` may be
    starting (that text is held back); whitespace between calls is held too."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.pending = ""
        self.num_calls = 0
        self.num_complete = 0
        self._call: tuple[int, _Arguments] | None = None  # the call whose arguments are streaming
        self._in_block = False  # inside <tool_call> (header, arguments or their tail)

    def feed(self, text: str) -> list[Event]:
        self.pending += text
        events: list[Event] = []
        while self._step(events):
            pass
        return events

    def _step(self, events: list[Event]) -> bool:
        """One move of the state machine; False when it must wait for more text."""
        if self._call is not None:
            index, args = self._call
            used = args.take(self.pending)
            if used:
                events.append(ToolArgumentsDelta(index, self.pending[:used]))
                self.pending = self.pending[used:]
            if not args.is_closed:
                return False
            events.append(ToolCallEnd(index, args.text, True))
            self.num_complete += 1
            self._call = None
            return True
        if self._in_block:
            return self._block(events)
        start = self.pending.find(OPEN)
        if start < 0:
            keep = partial_suffix(self.pending, OPEN)
            head = self.pending[:len(self.pending) - keep]
            if head.strip():
                events.append(TextDelta(head))
                self.pending = self.pending[len(head):]
            return False
        if self.pending[:start].strip():
            events.append(TextDelta(self.pending[:start]))
        self.pending = self.pending[start:]
        self._in_block = True
        return True

    def _block(self, events: list[Event]) -> bool:
        """Inside a block: ``pending`` starts with OPEN, or is what follows a streamed call's arguments."""
        if self.pending.startswith(OPEN):
            body = self.pending[len(OPEN):]
            header = _HEADER.match(body)
            if header is not None and self._known(header.group(1)):
                index = self.num_calls
                self.num_calls += 1
                events.append(ToolCallBegin(index, new_call_id(), json.loads(f'"{header.group(1)}"')))
                self._call = (index, _Arguments())
                self.pending = body[header.end():]
                return True
            end = self.pending.find(CLOSE)
            if end < 0:
                return False  # a header still arriving, or a block read whole at its end
            block = self.pending[:end + len(CLOSE)]
            self.pending = self.pending[end + len(CLOSE):]
            self._in_block = False
            content, calls = self.plan.parse(block)
            for call in calls:
                index = self.num_calls
                self.num_calls += 1
                self.num_complete += 1
                arguments = call["function"]["arguments"]
                events += [ToolCallBegin(index, call["id"], call["function"]["name"]),
                           ToolArgumentsDelta(index, arguments), ToolCallEnd(index, arguments, True)]
            if content:
                events.append(TextDelta(content))
            return True
        end = self.pending.find(CLOSE)  # the tail of a streamed call: '}\n</tool_call>'
        if end < 0:
            return False
        self.pending = self.pending[end + len(CLOSE):]
        self._in_block = False
        return True

    def _known(self, escaped_name: str) -> bool:
        try:
            return json.loads(f'"{escaped_name}"') in self.plan.functions
        except ValueError:
            return False

    def finish(self, reason: str) -> list[Event]:
        """The events the end of the text completes, ``Finish`` last: ``tool_calls`` once a call is
        complete, even if the token limit then cut a later one (which ends incomplete)."""
        events: list[Event] = []
        if self._call is not None:
            index, args = self._call
            events.append(ToolCallEnd(index, args.text, False))
            self._call = None
        elif self.pending.strip() and not (self._in_block and (self.num_complete
                                                               or not self.pending.startswith(OPEN))):
            events.append(TextDelta(self.pending))  # a block cut before its header stays text, alone
        self.pending = ""
        if self.num_complete and reason in ("stop", "length"):
            reason = "tool_calls"  # a later call cut by the limit is dropped; the complete ones stand
        events.append(Finish(reason))
        return events


def engine_reason(reason: str | None) -> str:
    return "stop" if reason in (None, "abort") else reason


@dataclass
class ChoiceEvents:
    """One choice's engine deltas as events (text passes straight through without tools)."""

    parser: ToolCallParser | None = None
    is_finished: bool = False

    def feed(self, text: str, logprobs: list[dict] | None, reason: str | None,
             stop_reason: object = None) -> list[Event]:
        if self.is_finished:
            return []
        if self.parser is not None:
            events = self.parser.feed(text)
        else:
            events = [TextDelta(text, logprobs)] if text or logprobs else []
        if reason is not None:
            self.is_finished = True
            tail = self.parser.finish(engine_reason(reason)) if self.parser else [Finish(engine_reason(reason))]
            if isinstance(stop_reason, str):
                tail[-1].stop_sequence = stop_reason
            events += tail
        return events


@dataclass
class Folded:
    """A finished choice, its events added up."""

    text: str = ""
    logprobs: list[dict] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)  # {"id", "name", "arguments"}, complete calls only
    items: list[tuple[str, object]] = field(default_factory=list)  # ("text", str) / ("call", dict), in order
    finish: Finish | None = None


def fold(events: list[Event]) -> Folded:
    out = Folded()
    open_calls: dict[int, dict] = {}
    for event in events:
        if isinstance(event, TextDelta):
            out.text += event.text
            out.logprobs += event.logprobs or []
            if out.items and out.items[-1][0] == "text":
                out.items[-1] = ("text", out.items[-1][1] + event.text)
            elif event.text:
                out.items.append(("text", event.text))
        elif isinstance(event, ToolCallBegin):
            open_calls[event.call_index] = {"id": event.id, "name": event.name, "arguments": ""}
        elif isinstance(event, ToolCallEnd):
            call = open_calls.pop(event.call_index)
            if event.is_complete:
                call["arguments"] = event.arguments
                out.calls.append(call)
                out.items.append(("call", call))
        elif isinstance(event, Finish):
            out.finish = event
    return out


def choice_events(plan: ToolPlan | None) -> ChoiceEvents:
    return ChoiceEvents(ToolCallParser(plan) if plan is not None else None)


class ChunkEvents:
    """A request's worker chunks as each choice's events: ``feed`` gives (choice index, events)."""

    def __init__(self, n: int, plan: ToolPlan | None):
        self.choices = [choice_events(plan) for _ in range(n)]

    def feed(self, chunk: Chunk) -> list[tuple[int, list[Event]]]:
        if chunk.samples is None:
            reason = chunk.finish_reason if chunk.finished else None
            return [(0, self.choices[0].feed(chunk.text, chunk.logprobs, reason, chunk.stop_reason))]
        return [(s["index"], self.choices[s["index"]].feed(s["text"], s.get("logprobs"), s.get("finish_reason"),
                                                           s.get("stop_reason")))
                for s in chunk.samples]


def outcome_folded(plan: ToolPlan | None, text: str, reason: str | None, stop_reason: object = None) -> Folded:
    """A finished (non-streamed) choice as the events a stream of it gives, added up."""
    return fold(choice_events(plan).feed(text, None, reason or "stop", stop_reason))
