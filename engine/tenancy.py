"""Who a request belongs to: the tenant whose prefix cache it may read and whose fair share of
the engine's steps it draws on (engine/scheduling/fair_share.py).

The engine used alone has one tenant, ``Tenant()``, and schedules first come, first served; the
server names one per user (``user:<id>``) with the weight staff gave the key or the chat user.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.errors import InvalidParameterError


@dataclass(frozen=True)
class Tenant:
    """Who a request belongs to, for the prefix cache's scope and the scheduler's fair share."""
    id: str = ""          # "" is the engine used alone: one tenant, everyone's
    weight: float = 1.0   # fair-share weight (> 0)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str):
            raise InvalidParameterError("tenant", f"id must be a string, got {self.id!r}")
        weight = self.weight
        if (isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight)
                or weight <= 0):
            raise InvalidParameterError("tenant_weight", f"must be a finite number > 0, got {weight!r}")
