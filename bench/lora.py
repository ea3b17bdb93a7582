"""Decode step time of a batch of 32 under LoRA adapters, against the base model alone, in one run.

    .venv/bin/python bench/lora.py [--model smollm2] [--batch 32] [--steps 16] [--repeats 3]
        [--rank 16] [--prompt-tokens 32]

The adapters are random PEFT folders (every projection targeted, rank --rank, B non-zero) written
for the model's shapes. Each configuration fills the batch, prefills it, then times --steps decode
steps (engine.step(), sampling included); configurations alternate within each repeat and the
table gives each one's median step time and its ratio to the base model on its default path:

- base: an engine that never saw an adapter (the fused CPU decode step where it applies);
- base, torch path: the same with the fused step off (the path adapter rows run on);
- base, torch path, LoRA installed: a second engine whose projections are wrapped, no adapter row;
- 1 adapter / 4 adapters: every row under an adapter (spread evenly over 4), on that engine;
- half base, 1 adapter: half the rows base (fused) and half under an adapter (torch path).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_line  # noqa: E402
from engine import LLM, LoRARequest, SamplingParams  # noqa: E402
from engine.kernels.cpu.cpu_info import describe  # noqa: E402
from engine.lora.peft_adapter import targets  # noqa: E402


def write_adapter(directory: pathlib.Path, cfg, rank: int, seed: int) -> str:
    """A PEFT folder with every projection of every layer targeted, A and B drawn at random."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    table = targets(cfg)
    tensors = {}
    for layer in range(cfg.num_hidden_layers):
        for name, t in table.items():
            key = f"base_model.model.model.layers.{layer}.{t.module.split('.')[0]}.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, t.in_features, generator=g) * 0.02
            tensors[f"{key}.lora_B.weight"] = torch.randn(t.out_features, rank, generator=g) * 0.02
    directory.mkdir(parents=True)
    save_file(tensors, directory / "adapter_model.safetensors")
    (directory / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": sorted(table)}))
    return str(directory)


def median_step_s(llm: LLM, adapters: list, steps: int, prompt_tokens: int, tag: str) -> float:
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=steps + 4, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(len(adapters))]
    for i, (rid, adapter) in enumerate(zip(ids, adapters)):
        prompt = [1 + (i * 37 + j * 11) % 4000 for j in range(prompt_tokens)]
        engine.add_request(rid, prompt, params, adapter=adapter)
    sched = engine.scheduler
    while sched.waiting or any(s.num_uncomputed_tokens > 1 for s in sched.running):
        engine.step()  # prefill
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    for rid in ids:
        if engine.has_request(rid):
            engine.abort_request(rid)
    engine.step()
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    args = ap.parse_args()
    plain, llm = (LLM(args.model, max_model_len=512, max_num_seqs=args.batch, max_lora_rank=args.rank)
                  for _ in range(2))
    runner = llm.engine.runner
    print(f"# {args.model}: dtype {runner.dtype}, fused CPU decode step {'on' if runner.fused_decode else 'off'}; "
          f"CPU: {cpu_line()}; {describe()}; {torch.get_num_threads()} threads; torch {torch.__version__}")
    b = args.batch
    with tempfile.TemporaryDirectory() as tmp:
        loras = [LoRARequest(f"a{i}", write_adapter(pathlib.Path(tmp) / f"a{i}", runner.model_config,
                                                    args.rank, i)) for i in range(4)]
        runner.lora.check(loras[0])  # installs the LoRA layers
        configs = {  # name: (engine, fused step on, each row's adapter)
            "base": (plain, True, [None] * b),
            "base, torch path": (plain, False, [None] * b),
            "base, torch path, LoRA installed": (llm, False, [None] * b),
            "1 adapter": (llm, True, [loras[0]] * b),
            "4 adapters": (llm, True, [loras[i % 4] for i in range(b)]),
            "half base, 1 adapter": (llm, True, [None if i % 2 else loras[0] for i in range(b)]),
        }
        times: dict[str, list[float]] = {k: [] for k in configs}
        for rep in range(args.repeats + 1):  # round 0 warms up
            for name, (engine, is_fused, adapters) in configs.items():
                r = engine.engine.runner
                fused, r.fused_decode = r.fused_decode, r.fused_decode if is_fused else None
                try:
                    t = median_step_s(engine, adapters, args.steps, args.prompt_tokens, f"{rep}-{name}")
                finally:
                    r.fused_decode = fused
                if rep:
                    times[name].append(t)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    base = statistics.median(times["base"])
    print(f"# batch {b}, {args.steps} decode steps x {args.repeats} repeats (medians), adapters rank "
          f"{args.rank} on every projection; load average {load}")
    print(f"| configuration | step ms | vs base |\n|---|---:|---:|")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"| {name} | {m * 1e3:.1f} | {m / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
