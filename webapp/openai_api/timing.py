"""Where a generation request's time went before its response began: the ``Server-Timing``
header (W3C Server Timing; browsers' developer tools show it), in milliseconds:

    Server-Timing: django;dur=1.2, key;dur=2.9, admit;dur=0.3, prepare;dur=7.8, engine;dur=9.1

- ``django``: from the ASGI gate (webapp/config/gate.py stamps the arrival) to the view: the body and
  the middleware. Absent where no gate stamped it (the test clients).
- ``key``: the API key's check.
- ``admit``: the body parsed and the key's limits.
- ``prepare``: the model, the chat template, the tokens, the running usage record.
- ``engine``: from then until the response began: a stream's first chunk, or the whole answer.

A refusal lists the phases it passed. The phases are the caller's own request's (no other
tenant's load shows beyond what its own time to first token already tells). bench/fair_share.py
reads them to say where another user's time went under a flood.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

ARRIVED = "pagoda_arrived"  # the ASGI scope's key: time.monotonic() at the gate

_current: ContextVar[Phases | None] = ContextVar("pagoda_phases", default=None)


class Phases:
    def __init__(self, started: float, arrived: float | None = None):
        self.last = started
        self.parts: list[tuple[str, float]] = [] if arrived is None else [("django", max(0.0, started - arrived))]

    def mark(self, name: str) -> None:
        """The phase ``name`` ended now (it began where the last one ended)."""
        now = time.monotonic()
        self.parts.append((name, now - self.last))
        self.last = now

    def names(self) -> list[str]:
        return [name for name, _ in self.parts]

    def header(self) -> str:
        return ", ".join(f"{name};dur={1000 * seconds:.1f}" for name, seconds in self.parts)


def phases_begin(request, started: float) -> Phases:
    """The phases of the request being answered by this task (and the tasks it starts)."""
    scope = getattr(request, "scope", None) or {}
    phases = Phases(started, scope.get(ARRIVED))
    _current.set(phases)
    return phases


def phase_mark(name: str) -> None:
    """Mark ``name`` on the current request's phases, if it keeps any (the chat socket does not)."""
    if (phases := _current.get()) is not None:
        phases.mark(name)
