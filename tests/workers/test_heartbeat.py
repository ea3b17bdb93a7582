"""The heartbeat thread: a loop busy in one long engine step still looks alive; a wedged one does not."""

from __future__ import annotations

import threading
import time

from workers.heartbeat import STALL_LIMIT_S, Heartbeat

SLOWEST_STEP_MEASURED_S = 79.0  # a 2,048-token prefill chunk at 6,500 tokens of context, loaded 2-core CPU


def test_a_worker_inside_the_slowest_measured_cpu_step_keeps_announcing_itself():
    announced = threading.Event()
    step_began = time.monotonic() - SLOWEST_STEP_MEASURED_S - 5
    heartbeat = Heartbeat(announced.set, lambda: step_began, interval_s=0.01)
    heartbeat.start()
    try:
        assert announced.wait(5)
    finally:
        heartbeat.stop()


def test_a_wedged_loop_stops_announcing_and_starts_again_once_it_ticks():
    announcements = []
    last_tick = [time.monotonic() - STALL_LIMIT_S - 1]
    heartbeat = Heartbeat(lambda: announcements.append(1), lambda: last_tick[0])
    assert not heartbeat.beat() and announcements == []
    last_tick[0] = time.monotonic()
    assert heartbeat.beat() and announcements == [1]
