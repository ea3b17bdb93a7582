"""Read any supported checkpoint as a ModelConfig plus a stream of HF-named tensors, and load
that stream into a model.

Both formats come out the same way, so model code only knows Hugging Face parameter names
("model.layers.0.self_attn.q_proj.weight", ...). "lm_head.weight" is absent when tied.
``load_weights`` routes each tensor to its parameter's ``weight_loader`` (engine/layers/linear.py),
through the model's ``packed_modules_mapping`` for fused layers.

Quantized weights: ``plan_layouts`` decides which projections become int4 / int8 layers (from
the config's ``quantization`` and what the checkpoint stores natively), ``apply_layouts`` swaps
those layers in before loading, and ``weights_for`` asks the source to hand the tensors that
land in a layer of their own layout over as they are (GGUF Q4 blocks as Int4Weight codes,
never a float matrix).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

import logging

import torch
from torch import nn

from engine.layers.linear import Linear, default_weight_loader, quantized_like
from engine.layers.parallel import RowSplit
from engine.quantization.int4 import check_int4_shape
from engine.models.model_config import ModelConfig
from engine.models.registry import checkpoint_format, resolve_model_path


logger = logging.getLogger(__name__)


class WeightSource(Protocol):
    def __len__(self) -> int: ...  # number of tensors the iterator yields

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]: ...

    # Optional: HF weight name -> ("int4", group) | ("int8", None) for tensors stored quantized,
    # and an iterator yielding those named as Int4Weight / Int8Weight rather than float.
    # def native_layouts(self) -> dict[str, tuple]: ...
    # def iterate(self, keep_quantized: frozenset[str]) -> Iterator[...]: ...


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
    # A family whose tensors do not map by name fragment (MoE experts) routes them itself.
    route = getattr(model, "checkpoint_target", lambda name: None)
    params = dict(model.named_parameters())
    missing = set(params)
    # Tensor parallel: parameter name -> its layer, which slices each tensor (tp_split) first.
    splits = {f"{name}.{p}" if name else p: module for name, module in model.named_modules()
              if hasattr(module, "tp_split") for p, _ in module.named_parameters(recurse=False)}
    for name, tensor in weights:
        if "rotary_emb.inv_freq" in name:
            continue
        if name == "lm_head.weight" and name not in params:
            continue  # tied: the embedding already holds it
        target, shard_id = route(name) or (name, None)
        for fragment, (fused, shard) in packed.items() if target == name else ():
            if fragment in name:
                target, shard_id = name.replace(fragment, f".{fused}."), shard
                break
        if target not in params:
            raise KeyError(f"checkpoint tensor {name!r} has no place in the model")
        param = params[target]
        try:
            if target in splits:
                tensor = splits[target].tp_split(tensor, shard_id, splits[target])
            getattr(param, "weight_loader", default_weight_loader)(param, tensor, shard_id)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from exc
        missing.discard(target)
    if missing:
        raise KeyError(f"checkpoint lacks tensors for: {sorted(missing)[:8]}")


def _checkpoint_names(model: nn.Module, module_name: str) -> list[str]:
    """The HF weight names a (fused) layer of ``model`` loads: qkv_proj -> q/k/v_proj.weight."""
    prefix, _, leaf = module_name.rpartition(".")
    parts = [hf for hf, (fused, _) in getattr(model, "packed_modules_mapping", {}).items()
             if fused == leaf] or [leaf]
    return [f"{prefix}.{part}.weight" for part in parts]


def plan_layouts(model: nn.Module, native: dict[str, tuple], quantization: str | None,
                 group_size: int) -> dict[str, tuple]:
    """Layer name -> ("int4", group) | ("int8", None) for each projection to hold quantized.

    auto: a layer whose every shard the checkpoint stores in one native layout keeps it; int4:
    every projection, in the checkpoint's own groups where it has int4, else ``group_size``;
    int8: every projection; none/None: nothing. A shape the int4 kernel refuses stays float
    (logged). The LM head is not a Linear: LMHead.prepare decides its product.
    """
    if quantization in (None, "none"):
        return {}
    plan = {}
    for name, module in model.named_modules():
        if not isinstance(module, Linear):
            continue
        layouts = {native.get(n) for n in _checkpoint_names(model, name)}
        if quantization == "auto":
            if len(layouts) != 1 or None in layouts:
                continue
            layout = layouts.pop()
        elif quantization == "int4":
            (only,) = layouts if len(layouts) == 1 else (None,)
            layout = only if only is not None and only[0] == "int4" else ("int4", group_size)
        else:
            layout = ("int8", None)
        if layout[0] == "int4":
            try:
                check_int4_shape(module.out_features, module.in_features, layout[1])
            except ValueError as exc:
                _refuse_shard_shape(name, module, layout[1], exc)
                logger.warning("%s stays float: %s", name, exc)
                continue
        plan[name] = layout
    return plan


def _refuse_shard_shape(name: str, module: nn.Module, group_size: int, exc: ValueError) -> None:
    """ValueError naming the numbers when int4 fits the whole layer but not one rank's shard."""
    split = getattr(module, "tp_split", None)
    if split is None:
        return
    whole = ((module.out_features, module.in_features * split.size) if isinstance(split, RowSplit)
             else (module.out_features * split.size, module.in_features))
    try:
        check_int4_shape(*whole, group_size)
    except ValueError:
        return  # the whole layer does not fit either: it stays float, as without tensor parallel
    raise ValueError(f"{name}: int4 with group size {group_size} fits the whole layer "
                     f"{list(whole)} but not its shard [{module.out_features}, "
                     f"{module.in_features}] on each of {split.size} tensor-parallel ranks ({exc}); "
                     f"choose another quantization_group_size or tensor_parallel_size") from exc


@torch.no_grad()
def apply_layouts(model: nn.Module, plan: dict[str, tuple], dtype: torch.dtype, *,
                  keep_values: bool = False, dense_rows: int | None = None) -> None:
    """Swap each planned layer for its empty quantized counterpart (same shards), before loading;
    ``keep_values`` quantizes the values the float layer holds (a randomly initialised model);
    ``dense_rows``: each also keeps a bf16 copy for steps of that many rows (quantized_like)."""
    for name, (layout, group_size) in plan.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
        new = quantized_like(old, layout, group_size=group_size or 32, dtype=dtype,
                             dense_rows=dense_rows)
        if hasattr(old, "tp_split"):  # tensor parallel: the new layer slices the same way
            new.tp_split = old.tp_split
        if keep_values:
            if old.bias is not None:
                new.weight_loader(new.bias, old.bias.data)
            new.weight_loader(new.weight, old.weight.data)
        setattr(parent, child, new)


def weights_for(source, plan: dict[str, tuple], model: nn.Module):
    """The source's tensors, those landing in a layer of their own native layout as they are."""
    if not plan or not hasattr(source, "iterate"):
        return source
    native = source.native_layouts()
    keep = frozenset(n for layer, layout in plan.items() for n in _checkpoint_names(model, layer)
                     if native.get(n) == layout)
    keep |= {name for name, param in model.named_parameters()  # a GGUF's int8 token embedding
             if native.get(name) == ("int8", None)
             and getattr(getattr(param, "weight_loader", None), "takes_int8_blocks", False)}
    return source.iterate(keep)


@torch.no_grad()
def init_random_weights(model: torch.nn.Module, seed: int) -> None:
    """N(0, 0.02) everywhere except the norms' scales (1): a trained model's magnitudes."""
    generator = torch.Generator(next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, 0.02, generator=generator)


def with_progress(weights, progress, total: int = 0):
    """``weights`` unchanged, calling ``progress(i, total)`` after the i-th (a console's load bar)."""
    for i, item in enumerate(weights, 1):
        yield item
        if progress is not None:
            progress(i, total)
