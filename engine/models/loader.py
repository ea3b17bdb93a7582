"""Read any supported checkpoint as a ModelConfig plus a stream of HF-named tensors, and load
that stream into a model.

Both formats come out the same way, so model code only knows Hugging Face parameter names
("model.layers.0.self_attn.q_proj.weight", ...). "lm_head.weight" is absent when tied.
``load_weights`` routes each tensor to its parameter's ``weight_loader`` (engine/layers/linear.py),
through the model's ``packed_modules_mapping`` for fused layers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from engine.layers.linear import default_weight_loader
from engine.models.model_config import ModelConfig
from engine.models.registry import checkpoint_format, resolve_model_path


class WeightSource(Protocol):
    def __len__(self) -> int: ...  # number of tensors the iterator yields

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]: ...


def load_model_config(path: str | Path) -> ModelConfig:
    """The architecture of a checkpoint: an HF directory, a .gguf file or a bundled model's name."""
    path = resolve_model_path(str(path))
    if checkpoint_format(path) == "gguf":
        from engine.models.gguf_loader import load_gguf_config
        return load_gguf_config(path)
    from engine.models.hf_loader import load_hf_config
    return load_hf_config(path)


def iter_weights(path: str | Path, config: ModelConfig) -> WeightSource:
    """The checkpoint's tensors one at a time: safetensors as stored, GGUF dequantized to float32."""
    path = resolve_model_path(str(path))
    if checkpoint_format(path) == "gguf":
        from engine.models.gguf_loader import GGUFWeights
        return GGUFWeights(path, config)
    from engine.models.hf_loader import SafetensorsWeights
    return SafetensorsWeights(path, config)


@torch.no_grad()
def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy HF-named tensors into the model's (fused) parameters; every parameter must be filled."""
    packed = {f".{name}.": target for name, target in getattr(model, "packed_modules_mapping", {}).items()}
    params = dict(model.named_parameters())
    missing = set(params)
    for name, tensor in weights:
        if "rotary_emb.inv_freq" in name:
            continue
        if name == "lm_head.weight" and getattr(model, "lm_head", None) is None:
            continue  # tied: the embedding already holds it
        target, shard_id = name, None
        for fragment, (fused, shard) in packed.items():
            if fragment in name:
                target, shard_id = name.replace(fragment, f".{fused}."), shard
                break
        if target not in params:
            raise KeyError(f"checkpoint tensor {name!r} has no place in the model")
        param = params[target]
        try:
            getattr(param, "weight_loader", default_weight_loader)(param, tensor, shard_id)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from exc
        missing.discard(target)
    if missing:
        raise KeyError(f"checkpoint lacks tensors for: {sorted(missing)[:8]}")
