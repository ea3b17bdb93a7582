"""The engine options every sub-command shares: one flag per engine setting, read back as EngineConfig kwargs."""

from __future__ import annotations

import argparse

from engine.config import SETTINGS

# Settings whose flag is not just --name-with-dashes: the sub-commands' own --seed is the
# sampling seed, the KV budget is given in MiB.
FLAGS = {"seed": "--engine-seed", "enable_prefix_caching": "--prefix-caching",
         "kv_cache_memory": "--kv-cache-memory-mib"}
SCALES = {"kv_cache_memory": 2**20}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """One option per engine setting (engine.config.SETTINGS); unset ones keep the engine's default."""
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default="smollm2",
                   help="a Hugging Face directory, a .gguf file, or 'smollm2' (the bundled model)")
    for s in SETTINGS:
        flag = FLAGS.get(s.name, "--" + s.name.replace("_", "-"))
        if s.type is bool:
            g.add_argument(flag, dest=s.name, action=argparse.BooleanOptionalAction, default=None,
                           help=f"{s.help} (default: {s.default})")
            continue
        note = " (given here in MiB)" if s.name in SCALES else "" if s.nullable else f" (default: {s.default})"
        g.add_argument(flag, dest=s.name, type=s.type, default=None,
                       choices=s.choices if s.choices and not s.pattern else None, help=s.help + note)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The settings given on the command line, in EngineConfig's units."""
    return {s.name: getattr(args, s.name) * SCALES.get(s.name, 1) for s in SETTINGS
            if getattr(args, s.name) is not None}
