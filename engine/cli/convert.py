"""Rewrite a Hugging Face checkpoint: its shards in another floating-point dtype (in place), or
its projections quantized into a new directory.

    from engine.cli.convert import convert_checkpoint
    convert_checkpoint(path, "bfloat16", report)

    python -m engine convert SRC DST --quantization int4|int8 [--group-size N]

The quantized checkpoint (layout in engine/quantization/checkpoints.py) holds every
``*_proj.weight`` of the decoder layers as plain codes with scales (and zeros), the other tensors
as they were, config.json with a ``quantization_config`` naming the layout, and the tokenizer and
generation files copied; the engine loads it without quantizing again (quantization "auto").

Run by ``python -m engine.cli.validate PATH --convert-dtype DTYPE`` before the checks, in the
validation child process (the web process never imports torch). Each shard is converted in
memory and written next to itself, then renamed over the original, so a crash leaves every
shard either old or new, never half written; config.json's ``torch_dtype`` (and ``dtype``)
then records the new dtype. Integer and boolean tensors are left as they are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from engine.config import CONVERT_DTYPES as DTYPES
from engine.config import CONVERT_QUANTIZATIONS, INT4_GROUP_SIZES
from engine.errors import EngineError

Report = Callable[[str, float], None]
HELP = "write a Hugging Face checkpoint's projections quantized (int4 / int8) into a new directory"
ENGINE_ARGS = False  # a file-to-file tool: no engine is started
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
OUTPUT_SHARD = "model.safetensors"


def convert_checkpoint(path: str | Path, dtype: str, report: Report) -> int:
    """Convert every floating tensor of the checkpoint at ``path`` to ``dtype``; returns how many.

    EngineError for a GGUF file (its tensors are quantised blocks, not plain floats), a
    directory without safetensors shards, or an unknown dtype.
    """
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = Path(path)
    if dtype not in DTYPES:
        raise EngineError(f"cannot convert to {dtype!r}; choose one of {', '.join(DTYPES)}")
    if path.is_file() and path.suffix.lower() == ".gguf":
        raise EngineError("dtype conversion applies to Hugging Face safetensors checkpoints; a GGUF "
                          "file keeps the quantisation it was made with")
    shards = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not shards:
        raise EngineError(f"{path} has no .safetensors shards to convert")
    target = getattr(torch, dtype)
    converted = 0
    for done, shard in enumerate(shards):
        report(f"converting {shard.name} to {dtype}", done / len(shards))
        tensors = {}
        with safe_open(shard, framework="pt") as handle:
            metadata = handle.metadata() or {}
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                if tensor.is_floating_point() and tensor.dtype != target:
                    tensor = tensor.to(target)
                    converted += 1
                tensors[name] = tensor.contiguous()
        partial = shard.with_name(shard.name + ".converting")
        save_file(tensors, partial, metadata={**metadata, "format": "pt"})
        os.replace(partial, shard)
        del tensors
    _record_dtype(path / "config.json", dtype)
    report(f"converted to {dtype}", 1.0)
    return converted


def _record_dtype(config_path: Path, dtype: str) -> None:
    config = json.loads(config_path.read_text())
    config["torch_dtype"] = dtype
    if "dtype" in config:  # newer transformers write this name instead
        config["dtype"] = dtype
    partial = config_path.with_name(config_path.name + ".converting")
    partial.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(partial, config_path)


def is_projection(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in PROJECTIONS and ".layers." in name


def convert_quantized(src: str | Path, dst: str | Path, quantization: str, group_size: int,
                      report: Report) -> int:
    """Write ``src`` (a Hugging Face directory) to ``dst`` with its projections quantized;
    returns how many. A projection whose in_features the int4 groups do not divide stays float."""
    import shutil

    from safetensors.torch import save_file

    from engine.models.hf_loader import SafetensorsWeights, load_hf_config
    from engine.quantization.checkpoints import PAGODA, to_pagoda
    from engine.quantization.int4 import Int4Weight, quantize_int4
    from engine.quantization.int8 import Int8Weight, quantize_int8

    src, dst = Path(src), Path(dst)
    if quantization not in CONVERT_QUANTIZATIONS:
        raise EngineError(f"cannot quantize to {quantization!r}; choose one of {', '.join(CONVERT_QUANTIZATIONS)}")
    if quantization == "int4" and group_size not in INT4_GROUP_SIZES:
        raise EngineError(f"int4 group size must be one of {INT4_GROUP_SIZES}, got {group_size}")
    if not src.is_dir():
        raise EngineError(f"{src} is not a Hugging Face checkpoint directory (a GGUF file loads "
                          f"quantized as it is: quantization auto)")
    config_json = json.loads((src / "config.json").read_text())
    if config_json.get("quantization_config"):
        raise EngineError(f"{src} is already quantized ({config_json['quantization_config'].get('quant_method')})")
    if dst.exists() and any(dst.iterdir()):
        raise EngineError(f"{dst} exists and is not empty")
    dst.mkdir(parents=True, exist_ok=True)
    weights = SafetensorsWeights(src, load_hf_config(src))
    tensors, converted = {}, 0
    for done, (name, tensor) in enumerate(weights):
        report(f"quantizing {name}", done / max(len(weights), 1))
        if is_projection(name) and (quantization == "int8" or tensor.shape[1] % group_size == 0):
            prefix = name.removesuffix(".weight")
            weight = (Int8Weight(*quantize_int8(tensor)) if quantization == "int8"
                      else Int4Weight(*quantize_int4_rows(tensor, group_size, quantize_int4), group_size))
            tensors.update({f"{prefix}.{k}": v for k, v in to_pagoda(weight).items()})
            converted += 1
        else:
            tensors[name] = tensor.contiguous()
    save_file(tensors, dst / OUTPUT_SHARD, metadata={"format": "pt"})
    for extra in src.iterdir():
        if extra.is_file() and extra.suffix != ".safetensors" and extra.name not in (
                "config.json", "model.safetensors.index.json"):
            shutil.copy2(extra, dst / extra.name)
    bits = 4 if quantization == "int4" else 8
    config_json["quantization_config"] = {"quant_method": PAGODA, "bits": bits,
                                          **({"group_size": group_size} if bits == 4 else {})}
    (dst / "config.json").write_text(json.dumps(config_json, indent=2, sort_keys=True) + "\n")
    report(f"wrote {converted} projections as {quantization}", 1.0)
    return converted


def quantize_int4_rows(weight, group_size: int, quantize_int4):
    """quantize_int4 without its out_features % 16 rule (that applies to the fused layer at load)."""
    rows = weight.shape[0]
    pad = -rows % 16
    if pad:
        import torch
        weight = torch.cat([weight, weight.new_zeros(pad, weight.shape[1])])
    codes, scales, zeros = quantize_int4(weight, group_size)
    return codes[:rows], scales[:rows], zeros[:rows]


def add_args(p) -> None:
    p.add_argument("src", help="a Hugging Face checkpoint directory")
    p.add_argument("dst", help="the directory to write (new or empty)")
    p.add_argument("--quantization", required=True, choices=CONVERT_QUANTIZATIONS)
    p.add_argument("--group-size", type=int, default=32, choices=INT4_GROUP_SIZES,
                   help="int4: input columns per scale and zero (default 32)")


def run(args, load_llm=None) -> int:
    import sys

    def report(step: str, fraction: float) -> None:
        print(f"\r[{fraction:4.0%}] {step[:70]:70}", end="", file=sys.stderr, flush=True)

    count = convert_quantized(args.src, args.dst, args.quantization, args.group_size, report)
    print(f"\n{args.dst}: {count} projections {args.quantization}", file=sys.stderr)
    return 0
