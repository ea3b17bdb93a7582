"""The runner's side of LoRA: wraps the model's projections (a pass over the built model, so the
model files never change), loads adapters into the slots the scheduler assigned, and tells the
wrapped projections which rows of a step run under which slot.

The wrappers are installed at the first adapter the engine is asked for, so a model served
without adapters pays neither their memory nor their per-layer check. The fused CPU decode step
(engine/models/fused_decode.py) was built over the unwrapped layers and has no LoRA product: the
runner sends a step with any adapter row down the torch path, and a base-only step keeps it.
"""

from __future__ import annotations

import logging

import torch

from engine.errors import InvalidParameterError
from engine.lora.layers import LoRALinear, LoRAStep
from engine.lora.peft_adapter import AdapterSpec, load_tensors, read_adapter, targets
from engine.lora.request import LoRARequest

logger = logging.getLogger(__name__)


class LoRARuntime:
    def __init__(self, model: torch.nn.Module, *, num_slots: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device, tensor_parallel: bool = False):
        self.model, self.cfg = model, model.config
        self.num_slots, self.max_rank = num_slots, max_rank
        self.dtype, self.device, self.tensor_parallel = dtype, device, tensor_parallel
        self.step = LoRAStep()
        self.wrappers: dict[tuple[int, str], LoRALinear] = {}  # (layer, our module) -> wrapper
        self._shard_ids: dict[str, list] = {}  # our module -> the shard ids adapters address
        self._specs: dict[str, AdapterSpec] = {}  # identity -> checked adapter
        self.loaded: list[str | None] = [None] * num_slots  # identity in each slot

    def check(self, adapter: LoRARequest) -> AdapterSpec:
        """The adapter's folder checked against the base (once per identity); installs the
        wrappers on first use. InvalidParameterError("adapter", ...) when it cannot be served."""
        if not isinstance(adapter, LoRARequest):
            raise InvalidParameterError("adapter", f"must be an engine LoRARequest, got {type(adapter).__name__}")
        if self.num_slots == 0:
            raise InvalidParameterError("adapter", "this engine serves no adapters (max_loras is 0)")
        if self.tensor_parallel:
            raise InvalidParameterError("adapter", "LoRA adapters do not run tensor parallel yet")
        spec = self._specs.get(adapter.identity)
        if spec is None:
            spec = read_adapter(adapter.path, self.cfg, max_lora_rank=self.max_rank)
            self._specs[adapter.identity] = spec
        if not self.wrappers:
            self._install()
        return spec

    def prepare(self, ordered: list) -> bool:
        """Before a forward: the scheduled entries in the flat batch's row order; loads any adapter
        not yet in its slot and maps the rows. Returns whether any row runs under an adapter."""
        rows: dict[int, list[int]] = {}
        row = 0
        for e in ordered:
            adapter = e.seq.adapter
            if adapter is not None:
                slot = e.seq.lora_slot
                if self.loaded[slot] != adapter.identity:
                    self._load(slot, adapter)
                rows.setdefault(slot, []).extend(range(row, row + e.num_new_tokens))
            row += e.num_new_tokens
        if len(rows) > 1:  # several adapters: one product over every slot, masked per row
            mask = torch.zeros(row, self.num_slots, dtype=self.dtype)
            for slot, r in rows.items():
                mask[r, slot] = 1
            self.step.mask = mask.to(self.device)
        elif rows:
            slot, r = next(iter(rows.items()))
            self.step.groups = [(slot, None if len(r) == row else torch.tensor(r, device=self.device))]
        return bool(rows)

    def clear(self) -> None:
        self.step.groups, self.step.mask = [], None

    def _load(self, slot: int, adapter: LoRARequest) -> None:
        spec = self.check(adapter)
        tensors = load_tensors(spec)
        per_wrapper: dict[tuple[int, str], dict] = {}
        for module, (layer, target, _, _) in spec.modules.items():
            shard = self._shard_ids[target.module].index(target.shard)
            a, b = tensors[module]
            per_wrapper.setdefault((layer, target.module), {})[shard] = (a.to(self.dtype), b)
        for key, wrapper in self.wrappers.items():
            wrapper.set_slot(slot, per_wrapper.get(key, {}), spec.scale)
        self.loaded[slot] = adapter.identity
        logger.info("LoRA adapter %r (r=%d, %d modules) loaded into slot %d of %d", adapter.name,
                    spec.rank, len(spec.modules), slot, self.num_slots)

    def _install(self) -> None:
        """Wrap every projection an adapter may target, in every decoder layer."""
        for target in targets(self.cfg).values():
            self._shard_ids.setdefault(target.module, []).append(target.shard)
        for i, layer in enumerate(self.model.model.layers):
            for module, shard_ids in self._shard_ids.items():
                parent_name, name = module.split(".")
                parent = getattr(layer, parent_name)
                base = getattr(parent, name)
                table = getattr(base, "shard_table", None) or base.shards
                shards = [table[s] if s is not None else (0, base.out_features) for s in shard_ids]
                if sum(n for _, n in shards) != base.out_features:
                    raise InvalidParameterError("adapter", f"{module}'s shards do not tile its rows")
                wrapper = LoRALinear(base, shards, num_slots=self.num_slots, max_rank=self.max_rank,
                                     step=self.step, dtype=self.dtype, device=self.device)
                setattr(parent, name, wrapper)
                self.wrappers[i, module] = wrapper
        num_bytes = sum(w.lora_a.nbytes + w.lora_b.nbytes for w in self.wrappers.values())
        logger.info("LoRA: %d projections wrapped, %d slots of rank <= %d, %.1f MiB",
                    len(self.wrappers), self.num_slots, self.max_rank, num_bytes / 2**20)
