"""Read any supported checkpoint as a ModelConfig plus a stream of HF-named tensors.

Both formats come out the same way, so model code only knows Hugging Face parameter names
("model.layers.0.self_attn.q_proj.weight", ...). "lm_head.weight" is absent when tied.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch

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
