"""The engine's command line: one sub-command per file, sharing the engine options."""

from __future__ import annotations

import argparse
import logging
import sys

from engine.cli import bench, chat, convert, estimate, generate
from engine.cli.args import add_engine_args, engine_kwargs
from engine.errors import EngineError

COMMANDS = {"generate": generate, "chat": chat, "bench": bench, "convert": convert, "estimate": estimate}


def load_llm(args: argparse.Namespace):
    """Build the LLM with a progress bar on stderr while weights load."""
    from engine.llm import LLM

    def progress(done: int, total: int) -> None:
        if total and (done == total or done % max(total // 50, 1) == 0):
            width = 30
            filled = width * done // total
            print(f"\rloading {args.model}: [{'#' * filled}{'.' * (width - filled)}] {done}/{total}",
                  end="\n" if done == total else "", file=sys.stderr, flush=True)

    print(f"loading {args.model} ...", file=sys.stderr, flush=True)
    return LLM(args.model, progress=progress, **engine_kwargs(args))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__)
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        if getattr(module, "ENGINE_ARGS", True):
            add_engine_args(p)
        module.add_args(p)
    args = parser.parse_args(argv)
    # Start-up facts (KV cache blocks, tokens and bytes) are logged at INFO.
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return COMMANDS[args.command].run(args, load_llm)
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
