"""A daemon thread that announces the worker every HEARTBEAT_INTERVAL_S.

It runs apart from the engine loop so that a long engine step (a big prefill on CPU) does not
make a live worker look dead. It still stops beating when the loop has not ticked for
``stall_limit_s``: a wedged loop must look dead to clients, or they would wait forever.

The limit must exceed the longest legitimate step: on a loaded two-core CPU one step of the
bundled SmolLM2 prefilling 2,048 tokens of a 6,500-token document (a 20 KB file) measured 75 and
79 s, and the former 60 s limit withheld the heartbeat, ending that chat turn with worker_lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from workers.protocol import HEARTBEAT_INTERVAL_S
from workers.transport import TransportUnreachable

logger = logging.getLogger(__name__)

# A loop silent this long is wedged. Above the slowest step measured (79 s, see above) with room
# for a longer context and more load; still well inside a request's overall deadline (600 s).
STALL_LIMIT_S = 300.0


class Heartbeat:
    def __init__(self, announce: Callable[[], None], last_tick: Callable[[], float], *,
                 interval_s: float = HEARTBEAT_INTERVAL_S, stall_limit_s: float = STALL_LIMIT_S):
        self._announce = announce  # publishes the worker's current WorkerInfo
        self._last_tick = last_tick  # time.monotonic() of the engine loop's latest iteration
        self.interval_s = interval_s
        self.stall_limit_s = stall_limit_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> bool:
        """Publish once now; False (and nothing published) when the loop looks wedged."""
        if time.monotonic() - self._last_tick() > self.stall_limit_s:
            return False
        self._announce()
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pagoda-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        was_stalled = was_down = False
        while not self._stop.wait(self.interval_s):
            try:
                stalled = not self.beat()
            except TransportUnreachable as exc:  # Redis restarting: beat again once it is back
                if not was_down:
                    logger.warning("heartbeat: %s", exc)
                was_down = True
                continue
            except Exception:  # a hiccup must not end the heartbeat for good
                logger.exception("heartbeat failed")
                continue
            if was_down:
                logger.warning("heartbeat: announced again")
            was_down = False
            if stalled and not was_stalled:
                logger.error("engine loop silent for over %.0f s: heartbeat withheld",
                             self.stall_limit_s)
            was_stalled = stalled
