"""The engine's command line: one sub-command per file, sharing the engine options."""

from __future__ import annotations

import argparse
import logging
import sys

from engine.cli import bench, chat, generate
from engine.errors import EngineError

COMMANDS = {"generate": generate, "chat": chat, "bench": bench}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default="smollm2",
                   help="a Hugging Face directory, a .gguf file, or 'smollm2' (the bundled model)")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    g.add_argument("--device", default="auto")
    g.add_argument("--max-model-len", type=int)
    g.add_argument("--max-num-seqs", type=int, default=128)
    g.add_argument("--max-num-batched-tokens", type=int, default=2048)
    g.add_argument("--kv-cache-memory-mib", type=int, help="KV pool size (default 1024 on CPU)")
    g.add_argument("--no-prefix-caching", action="store_true")


def engine_kwargs(args: argparse.Namespace) -> dict:
    kwargs = dict(dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
                  max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                  enable_prefix_caching=not args.no_prefix_caching)
    if args.kv_cache_memory_mib:
        kwargs["kv_cache_memory"] = args.kv_cache_memory_mib * 2**20
    return kwargs


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
