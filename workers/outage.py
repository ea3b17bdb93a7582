"""A worker's transport outage (Redis restarting): since when, and when to try again.

The worker keeps stepping its engine through an outage; each failed try doubles the wait before
the next one, from MIN_BACKOFF_S up to MAX_BACKOFF_S.
"""

from __future__ import annotations

MIN_BACKOFF_S, MAX_BACKOFF_S = 0.1, 2.0


class Outage:
    def __init__(self) -> None:
        self.since: float | None = None  # monotonic time the outage began; None: no outage
        self.retry_at = 0.0  # monotonic time of the next try
        self._backoff = MIN_BACKOFF_S

    @property
    def active(self) -> bool:
        return self.since is not None

    def failed(self, now: float) -> bool:
        """A use or a try of the transport failed at ``now``; True when this begins the outage."""
        began = self.since is None
        if began:
            self.since, self._backoff = now, MIN_BACKOFF_S
        else:
            self._backoff = min(MAX_BACKOFF_S, self._backoff * 2)
        self.retry_at = now + self._backoff
        return began

    def over(self, now: float) -> float:
        """The transport is back; returns how long it was away."""
        lasted = now - self.since
        self.since, self._backoff = None, MIN_BACKOFF_S
        return lasted
