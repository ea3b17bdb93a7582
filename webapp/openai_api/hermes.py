"""The Hermes tool-call format (NousResearch Hermes 2 Pro, also Qwen 2.5 and many fine-tunes): the
tools' system block, the ``<tool_call>`` markers, and a finished text's calls parsed back
(webapp/openai_api/tool_calls.py has the whole story)."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
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



def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that begins ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
