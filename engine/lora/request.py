"""Which adapter a request runs under (no torch: sequences, the scheduler and the block manager
carry it)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidParameterError


@dataclass(frozen=True)
class LoRARequest:
    """A PEFT adapter folder (adapter_config.json + adapter_model.safetensors) by name and path.

    ``identity`` roots the prefix cache's hash chain (engine/scheduling/block_manager.py), so
    blocks computed under one adapter are never reused for another or for the base. It names the
    folder as well as the adapter: the serving layer gives each upload its own folder, so a
    replaced adapter never meets the blocks of the one it replaced.
    """

    name: str
    path: str

    def __post_init__(self):
        for field in ("name", "path"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise InvalidParameterError(f"adapter.{field}", f"must be a non-empty string, got {value!r}")

    @property
    def identity(self) -> str:
        return f"{self.name}\x00{self.path}"
