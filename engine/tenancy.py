"""Who a request belongs to: the scope of its prefix-cache blocks and its share of the scheduler.

The serving layer sets the tenant from who authenticated (an API key's owner, the logged-in
user), never from the request body. The block manager roots each tenant's hash chain in a salt
derived from its id (engine/scheduling/block_manager.py), so two tenants never share a block and
neither can read the other's prompts from ``num_cached_tokens`` or time to first token. Only the
blocks inside a request's ``shared_prefix_len`` (a prefix staff marked as shared) chain from the
public root instead. The scheduler shares the engine between tenants by ``weight``
(engine/scheduling/fair_share.py); the engine used alone has one tenant, ``Tenant()``, and is first
come, first served.
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

    def __post_init__(self):
        if not isinstance(self.id, str):
            raise InvalidParameterError("tenant.id", f"must be a string, got {type(self.id).__name__}")
        weight = self.weight
        if (isinstance(weight, bool) or not isinstance(weight, (int, float))
                or not math.isfinite(weight) or weight <= 0):
            raise InvalidParameterError("tenant.weight", f"must be a finite number > 0, got {weight!r}")
