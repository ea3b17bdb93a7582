"""Weight-only quantization as a pass over a built model (gpt-fast's replace_linear_* style).

``quantize_model`` swaps every linear-like projection for its quantized module in place, so the
model file never changes. Linear-like: a module whose class name ends in "Linear" (torch's
nn.Linear, engine Linear layers, transformers' projections) with a 2-D ``weight`` [out, in] used
as x @ W.T and an optional 1-D bias; embeddings and norms are never touched.

The LM head is skipped unless asked (a transformers model's ``lm_head`` is an nn.Linear):
the vocabulary projection is the layer whose error reaches the sampled token most directly.
Pagoda's own LMHead is not linear-like: it picks its product per step shape itself
(engine/layers/linear.LMHead.prepare). The engine's loader swaps layers before loading rather
than after (engine/models/loader.plan_layouts), so a quantized checkpoint never passes through
float; this pass is for a model already in memory.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.quantization.int4 import Int4WeightOnlyLinear
from engine.quantization.int8 import Int8WeightOnlyLinear

MODES = ("int8", "int4")


def is_linear_like(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    bias = getattr(module, "bias", None)
    return (type(module).__name__.endswith("Linear") and not isinstance(module, nn.Embedding)
            and isinstance(weight, torch.Tensor) and weight.dim() == 2
            and (bias is None or (isinstance(bias, torch.Tensor) and bias.shape == weight.shape[:1])))


def quantized_linear(module: nn.Module, mode: str, group_size: int = 32) -> nn.Module:
    """The quantized replacement of one linear-like module (ValueError on shapes the kernel refuses)."""
    weight, bias = module.weight.detach(), getattr(module, "bias", None)
    bias = None if bias is None else bias.detach()
    if mode == "int8":
        return Int8WeightOnlyLinear.from_float(weight, bias)
    if mode == "int4":
        return Int4WeightOnlyLinear.from_float(weight, group_size, bias)
    raise ValueError(f"quantization mode must be one of {MODES}, got {mode!r}")


@torch.no_grad()
def quantize_model(model: nn.Module, mode: str, *, group_size: int = 32,
                   include_lm_head: bool = False,
                   filter_fn: Callable[[str, nn.Module], bool] | None = None) -> list[str]:
    """Replace the model's projections in place; returns the qualified names replaced.

    filter_fn(name, module) -> False keeps a module as it is. A projection whose shape the
    kernel refuses raises ValueError naming it, before anything is replaced.
    """
    if mode not in MODES:
        raise ValueError(f"quantization mode must be one of {MODES}, got {mode!r}")
    targets = []
    for name, module in model.named_modules():
        if not name or not is_linear_like(module):
            continue
        if name.rsplit(".", 1)[-1] == "lm_head" and not include_lm_head:
            continue
        if filter_fn is not None and not filter_fn(name, module):
            continue
        targets.append((name, module))
    replacements = []
    for name, module in targets:  # quantize all first: a refused shape leaves the model intact
        try:
            replacements.append((name, quantized_linear(module, mode, group_size)))
        except ValueError as exc:
            raise ValueError(f"cannot quantize {name} ({mode}): {exc}") from exc
    for name, replacement in replacements:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, replacement)
    return [name for name, _ in replacements]
