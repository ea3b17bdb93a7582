"""The resident adapters: at most ``num_slots`` at once, least recently used evicted first, never
one a running sequence uses (no torch: the scheduler asks before admitting a sequence).

A slot is an index into the stacked LoRA weights of every wrapped projection
(engine/lora/layers.py); the runner loads an adapter into its slot at the first step that needs
it (engine/lora/runtime.py). A waiting sequence whose adapter cannot get a slot (every slot held
by adapters of running sequences) waits; sequences behind it may still be admitted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from engine.lora.request import LoRARequest


class AdapterSlots:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._lru: OrderedDict[str, int] = OrderedDict()  # identity -> slot, least recent first
        self.num_loads = 0  # adapters made resident (first loads and reloads after eviction)
        self.num_evictions = 0

    @property
    def resident(self) -> list[str]:
        """Identities of the resident adapters, least recently used first."""
        return list(self._lru)

    def acquire(self, adapter: LoRARequest, running: Iterable) -> int | None:
        """The slot ``adapter`` runs in, made resident if it is not (evicting the least recently
        used adapter no sequence in ``running`` uses); None when every slot is in use."""
        key = adapter.identity
        slot = self._lru.get(key)
        if slot is not None:
            self._lru.move_to_end(key)
            return slot
        if len(self._lru) < self.num_slots:
            slot = len(self._lru)
        else:
            in_use = {s.adapter.identity for s in running if s.adapter is not None}
            victim = next((k for k in self._lru if k not in in_use), None)
            if victim is None:
                return None
            slot = self._lru.pop(victim)
            self.num_evictions += 1
        self._lru[key] = slot
        self.num_loads += 1
        return slot
