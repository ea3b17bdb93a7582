"""python -m engine estimate MODEL [engine options] — the memory MODEL needs, before loading it.

Reads only the checkpoint's headers (engine/memory/estimate.py); prints weights, KV cache, checkpoint
metadata and activation workspace per tensor-parallel rank, or all of it as JSON with --json.
"""

from __future__ import annotations

import json

from engine.cli.args import engine_kwargs
from engine.config import EngineConfig
from engine.memory.estimate import MiB, estimate_memory
from engine.memory.model_facts import model_facts

HELP = "estimate the memory a model needs with the given settings, without loading it"


def add_args(p) -> None:
    p.add_argument("model_path", nargs="?", default=None, metavar="MODEL",
                   help="a Hugging Face directory, a .gguf file or 'smollm2' (default: --model)")
    p.add_argument("--target", choices=("cpu", "cuda"), default=None,
                   help="the device to estimate for (default: --device, auto meaning cpu)")
    p.add_argument("--device-memory-gib", type=float, default=None,
                   help="the GPU's memory, for the KV pool gpu_memory_utilization leaves")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")


def run(args, load_llm=None) -> int:
    model = args.model_path or args.model
    memory = None if args.device_memory_gib is None else int(args.device_memory_gib * 2**30)
    settings = engine_kwargs(args)
    estimate = estimate_memory(model, settings, device=args.target, device_memory_bytes=memory)
    facts = model_facts(model)
    config = EngineConfig.from_settings(model, dict(settings))
    max_model_len = min(config.max_model_len or facts.context_length, facts.context_length)
    split = facts.window_capacity(kv_tokens=estimate.kv_tokens, max_model_len=max_model_len,
                                  block_size=config.block_size, max_num_seqs=config.max_num_seqs,
                                  max_num_batched_tokens=config.max_num_batched_tokens)
    if args.json:
        capacity = None if split is None else {
            "max_model_len": max_model_len, "num_seqs": split.num_seqs,
            "num_seqs_without_freeing": split.num_seqs_without_freeing(),
            "num_window_seqs": split.num_window_seqs}
        print(json.dumps({"model": model, **estimate.as_dict(), "facts": facts.as_dict(),
                          "window_capacity": capacity}))
        return 0
    print(f"{model}: {facts.describe()}")
    print(f"  memory: {estimate.describe()}")
    if split is not None:
        print(f"  KV capacity: {split.describe(max_model_len)}")
    print(f"  resident with every KV block in use: {estimate.resident_bytes / MiB:.1f} MiB; "
          f"at the largest step's peak: {estimate.total_bytes / MiB:.1f} MiB")
    return 0
