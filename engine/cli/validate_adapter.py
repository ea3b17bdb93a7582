"""Check a PEFT LoRA adapter folder against a base checkpoint, answering one JSON line on stdout.

    python -m engine.cli.validate_adapter ADAPTER_DIR --base MODEL_PATH [--max-lora-rank N]

The line is ``{"ok": true, "rank": r, "scale": s, "target_modules": [...], "num_modules": n}`` or
``{"ok": false, "error": "..."}`` (engine/lora/peft_adapter.py names the module and the shapes
that do not fit); the exit status is 0 exactly when the adapter fits. The web process runs this
as a child so that it never imports torch itself (reading the base's config does).
"""

from __future__ import annotations

import argparse
import json
import sys

from engine.config import SETTINGS_BY_NAME
from engine.errors import EngineError


def check(adapter_dir: str, base: str, max_lora_rank: int) -> dict:
    from engine.lora.peft_adapter import read_adapter
    from engine.models.loader import load_model_config

    try:
        spec = read_adapter(adapter_dir, load_model_config(base), max_lora_rank=max_lora_rank)
    except (EngineError, ValueError, OSError) as exc:
        return {"ok": False, "error": str(exc)}
    names = sorted({m.rsplit(".", 1)[1] for m in spec.modules})
    return {"ok": True, "rank": spec.rank, "scale": spec.scale, "target_modules": names,
            "num_modules": len(spec.modules)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.cli.validate_adapter")
    parser.add_argument("adapter_dir")
    parser.add_argument("--base", required=True, help="the base model's checkpoint path")
    parser.add_argument("--max-lora-rank", type=int,
                        default=SETTINGS_BY_NAME["max_lora_rank"].default)
    args = parser.parse_args(argv)
    report = check(args.adapter_dir, args.base, args.max_lora_rank)
    print(json.dumps(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
