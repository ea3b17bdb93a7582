"""How many of a batch's lines may be in the engine now: its share of the model's workers.

PAGODA_BATCH_MAX_IN_FLIGHT while the workers hold only this batch's lines; while they hold other
requests too (interactive ones), PAGODA_BATCH_MAX_IN_FLIGHT_BUSY (default 0: the batch steps
aside), held for BUSY_HOLD_S after the others were last seen. A batch kept waiting so with no line
in the engine for PAGODA_BATCH_MAX_STARVATION_S gets one line in anyway (its minimum share: that
line is not preempted), then steps aside again until it has waited that long once more.

A worker's count of requests is as of its last heartbeat (and its stats, refreshed a little before),
so it is compared with the most lines this runner had in flight over the HEARTBEAT_SLACK_S before
that beat: the runner's count changes are kept as a timeline, each start written before the line
is sent, so the runner's count is never below what the worker can have seen of its lines.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from workers.protocol import HEARTBEAT_INTERVAL_S, WorkerInfo

OWN_WINDOW_S = 3 * HEARTBEAT_INTERVAL_S  # how stale a worker's announced counts may be
HEARTBEAT_SLACK_S = 0.5  # lines sent or ended this close before a beat may or may not be in its count
# Busy once, busy for this long: one user's requests one after another leave gaps shorter than a
# heartbeat, which must not let the lines back in between them.
BUSY_HOLD_S = 3 * HEARTBEAT_INTERVAL_S


@dataclass(frozen=True)
class Allowance:
    """Lines that may be in flight now; ``is_minimum_share``: the one line let in although others run."""

    max_lines: int
    is_minimum_share: bool = False


class Share:
    """One runner's view of its share: its own in-flight counts over time, and the workers' counts."""

    def __init__(self, *, max_in_flight: int, max_in_flight_busy: int, max_starvation_s: float):
        self.max_in_flight, self.max_in_flight_busy = max_in_flight, max_in_flight_busy
        self.max_starvation_s = max_starvation_s
        self.timeline: deque[tuple[float, int]] = deque([(time.time(), 0)])  # (wall-clock time, lines from then on)
        self.busy_until = 0.0  # monotonic
        self.last_in_flight = time.monotonic()  # the last time a line of this runner was in the engine

    @property
    def num_in_flight(self) -> int:
        return self.timeline[-1][1]

    def record(self, num_in_flight: int) -> None:
        """The runner's lines in flight from now on (called before a line is sent, after one ended)."""
        now = time.time()
        if num_in_flight or self.num_in_flight:
            self.last_in_flight = time.monotonic()
        self.timeline.append((now, num_in_flight))
        while len(self.timeline) > 1 and self.timeline[1][0] < now - OWN_WINDOW_S:  # keep the one in effect then
            self.timeline.popleft()

    def own_before(self, beat: float) -> int:
        """The most lines this runner had in flight over the HEARTBEAT_SLACK_S before ``beat``."""
        start = beat - HEARTBEAT_SLACK_S
        if start < self.timeline[0][0]:  # older than what is remembered: the most remembered
            return max(n for _, n in self.timeline)
        in_effect = [n for t, n in self.timeline if t <= start][-1:]
        return max(in_effect + [n for t, n in self.timeline if start < t <= beat])

    def is_busy(self, workers: list[WorkerInfo]) -> bool:
        """Whether any worker holds requests other than this runner's lines."""
        return any(w.stats.get("num_inflight", 0) > self.own_before(w.last_heartbeat) for w in workers)

    def allowance(self, workers: list[WorkerInfo]) -> Allowance:
        """How many lines may be in flight, given the model's serving workers (none: wait for one)."""
        if not workers:
            return Allowance(0)
        if self.is_busy(workers):
            self.busy_until = time.monotonic() + BUSY_HOLD_S
        if time.monotonic() >= self.busy_until:
            return Allowance(self.max_in_flight)
        held = min(self.max_in_flight, self.max_in_flight_busy)
        starved = time.monotonic() - self.last_in_flight >= self.max_starvation_s
        if held == 0 and self.num_in_flight == 0 and starved:
            return Allowance(1, is_minimum_share=True)
        return Allowance(held)
