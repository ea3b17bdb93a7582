"""Rewrite a Hugging Face checkpoint's safetensors shards in another floating-point dtype.

    from engine.cli.convert import convert_checkpoint
    convert_checkpoint(path, "bfloat16", report)

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
from engine.errors import EngineError

Report = Callable[[str, float], None]


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
