"""A PEFT LoRA folder (adapter_config.json + adapter_model.safetensors), read and checked against
the base model's config before any of it is used (no torch: the webapp's upload validation and the
engine's admission both run it; ``load_tensors`` reads the weights for the runner).

Checked: a LoRA adapter (not DoRA, no trained biases, no saved whole modules, no per-module rank
or alpha patterns), its rank within ``max_lora_rank``, every tensor a lora_A/lora_B pair of a
decoder layer's projection that the base has and the config's ``target_modules`` names, with the
shapes that projection takes (A: [r, in_features], B: [out_features, r]). A refusal names the
module and both shapes. Scale: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

from engine.errors import InvalidParameterError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# Families built from engine/models/llama.py's attention and MLP blocks.
LORA_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3")
_KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])"
                  r"(?:\.[\w-]+)?\.weight$")


@dataclass(frozen=True)
class Target:
    """Where an HF projection's LoRA product lands: our layer (under a decoder layer), the shard
    of its fused rows (None: all of them), and the product's in and out features."""
    module: str
    shard: str | int | None
    in_features: int
    out_features: int


@dataclass(frozen=True)
class AdapterSpec:
    """A checked adapter: its rank and scale, and per decoder-layer projection
    ("model.layers.0.self_attn.q_proj") the Target and the tensors' names in the file."""
    path: str
    rank: int
    scale: float
    modules: dict  # HF module path -> (layer index, Target, lora_A key, lora_B key)


def targets(cfg) -> dict[str, Target]:
    """The projections of a layer an adapter may target, by their HF name, for ``cfg``'s family."""
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    table = {"o_proj": Target("self_attn.o_proj", None, q, hidden),
             "down_proj": Target("mlp.down_proj", None, inter, hidden)}
    if cfg.architecture == "phi3":  # its checkpoint's projections are already fused
        table["qkv_proj"] = Target("self_attn.qkv_proj", None, hidden, q + 2 * kv)
        table["gate_up_proj"] = Target("mlp.gate_up_proj", None, hidden, 2 * inter)
    else:
        for name, shard, rows in (("q_proj", "q", q), ("k_proj", "k", kv), ("v_proj", "v", kv)):
            table[name] = Target("self_attn.qkv_proj", shard, hidden, rows)
        table["gate_proj"] = Target("mlp.gate_up_proj", 0, hidden, inter)
        table["up_proj"] = Target("mlp.gate_up_proj", 1, hidden, inter)
    return table


def read_adapter(path: str, cfg, *, max_lora_rank: int) -> AdapterSpec:
    """The adapter folder at ``path`` checked against the base model's ``cfg``; raises
    InvalidParameterError("adapter", ...) naming what does not fit."""
    config = _read_config(path)
    if cfg.architecture not in LORA_FAMILIES:
        _refuse(f"the base's architecture {cfg.architecture!r} takes no LoRA adapters "
                f"(supported: {', '.join(LORA_FAMILIES)})")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, (int, float)):
        _refuse(f"{CONFIG_FILE} needs an integer r >= 1 and a number lora_alpha, got r={rank!r}, "
                f"lora_alpha={alpha!r}")
    if rank > max_lora_rank:
        _refuse(f"rank r={rank} exceeds the engine's max_lora_rank {max_lora_rank}")
    for key, bad in (("use_dora", bool(config.get("use_dora"))),
                     ("bias", config.get("bias", "none") != "none"),
                     ("lora_bias", bool(config.get("lora_bias"))),
                     ("fan_in_fan_out", bool(config.get("fan_in_fan_out"))),
                     ("modules_to_save", bool(config.get("modules_to_save"))),
                     ("rank_pattern", bool(config.get("rank_pattern"))),
                     ("alpha_pattern", bool(config.get("alpha_pattern")))):
        if bad:
            _refuse(f"{CONFIG_FILE} sets {key}={config.get(key)!r}, which the engine does not serve")
    table = targets(cfg)
    wanted = _target_names(config.get("target_modules"), table)
    shapes = _read_header(os.path.join(path, WEIGHTS_FILE))
    pairs: dict[str, dict[str, tuple[str, list[int]]]] = {}
    for key, shape in shapes.items():
        m = _KEY.match(key)
        if m is None:
            _refuse(f"tensor {key!r} is not a lora_A/lora_B weight of a decoder layer's projection")
        layer, parent, name, ab = int(m[1]), m[2], m[3], m[4]
        module = f"model.layers.{layer}.{parent}.{name}"
        target = table.get(name)
        if target is None or not target.module.startswith(parent + "."):
            _refuse(f"{module}: the base ({cfg.architecture}) has no projection {parent}.{name}; "
                    f"an adapter may target {', '.join(sorted(table))}")
        if layer >= cfg.num_hidden_layers:
            _refuse(f"{module}: the base has {cfg.num_hidden_layers} layers")
        if wanted is not None and name not in wanted:
            _refuse(f"{module}: not among target_modules {sorted(wanted)}")
        expected = [rank, target.in_features] if ab == "A" else [target.out_features, rank]
        if list(shape) != expected:
            _refuse(f"{module}: lora_{ab} is {list(shape)}, the base's {name} takes {expected} "
                    f"({'[r, in_features]' if ab == 'A' else '[out_features, r]'}, r={rank})")
        pairs.setdefault(module, {})[ab] = (key, shape)
    if not pairs:
        _refuse(f"{WEIGHTS_FILE} holds no LoRA weights")
    modules = {}
    for module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            _refuse(f"{module}: lora_{'B' if 'A' in ab else 'A'} is missing")
        layer = int(module.split(".")[2])
        modules[module] = (layer, table[module.rsplit(".", 1)[1]], ab["A"][0], ab["B"][0])
    scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    return AdapterSpec(path=path, rank=rank, scale=float(scale), modules=modules)


def load_tensors(spec: AdapterSpec) -> dict:
    """HF module path -> (lora_A [r, in], lora_B [out, r]) float32 tensors (torch)."""
    from safetensors import safe_open

    out = {}
    with safe_open(os.path.join(spec.path, WEIGHTS_FILE), framework="pt") as f:
        for module, (_, _, key_a, key_b) in spec.modules.items():
            out[module] = (f.get_tensor(key_a).float(), f.get_tensor(key_b).float())
    return out


def _read_config(path: str) -> dict:
    file = os.path.join(path, CONFIG_FILE)
    try:
        with open(file, encoding="utf-8") as fh:
            config = json.load(fh)
    except FileNotFoundError:
        _refuse(f"no {CONFIG_FILE} in {path}")
    except (OSError, ValueError) as exc:
        _refuse(f"{CONFIG_FILE} is not readable JSON: {exc}")
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        _refuse(f"{CONFIG_FILE} is not a LoRA adapter's (peft_type "
                f"{config.get('peft_type') if isinstance(config, dict) else None!r})")
    return config


def _target_names(value, table: dict) -> set[str] | None:
    """target_modules as names of projections; None when it is a regex (the keys then decide)."""
    if isinstance(value, str):
        return None
    if not isinstance(value, list) or not value:
        _refuse(f"target_modules must be a non-empty list or a regex, got {value!r}")
    names = {v.rsplit(".", 1)[-1] for v in value}
    unknown = sorted(names - table.keys())
    if unknown:
        _refuse(f"target module {unknown[0]!r} is not a projection of the base; an adapter may "
                f"target {', '.join(sorted(table))}")
    return names


def _read_header(file: str) -> dict[str, list[int]]:
    """Tensor name -> shape from a safetensors header, each tensor's bytes checked to lie in the file."""
    try:
        size = os.path.getsize(file)
        with open(file, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if n <= 0 or 8 + n > size:
                _refuse(f"{WEIGHTS_FILE} is truncated or not safetensors (header of {n} bytes, "
                        f"file of {size})")
            header = json.loads(fh.read(n))
    except FileNotFoundError:
        _refuse(f"no {WEIGHTS_FILE} in {os.path.dirname(file)}")
    except ValueError as exc:
        _refuse(f"{WEIGHTS_FILE}'s header is not JSON: {exc}")
    shapes = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        if 8 + n + end > size:
            _refuse(f"{WEIGHTS_FILE} is truncated at tensor {key!r} (its bytes end at "
                    f"{8 + n + end}, the file at {size})")
        shapes[key] = entry["shape"]
    return shapes


def _refuse(message: str):
    raise InvalidParameterError("adapter", message)
