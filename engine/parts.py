"""A step that may stop part-way: a generator that yields where it lets other work run first, and
returns the step's result.

On a CPU, a step of the whole batch takes tens of milliseconds (32 decodes of SmolLM2 on 2 cores,
~40-60 ms), and a request that arrives while it runs waits for its end. The fused decode step runs
such a step in parts of its layers (engine/models/fused_decode.py); between two parts it asks a
``pause`` callable, and where that says yes the generator yields: the engine runs a newcomer's
short step, then resumes the paused one with next() (engine/llm_engine.py). Whatever does not
pause (every other path, a caller with no ``pause``) never yields, and ``run_to_end`` is its call.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")


def run_to_end(parts: Generator[None, None, T]) -> T:
    """The step's result, running every part (``parts`` was given no pause, or one to ignore)."""
    while True:
        try:
            next(parts)
        except StopIteration as done:
            return done.value
