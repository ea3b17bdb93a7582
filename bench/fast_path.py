"""fp32 vs bf16 vs the default fast path (quantization auto: GGUF Q4 -> int4, bf16, a dense bf16
copy for steps of >= quantization_dense_rows rows) vs the same without the dense copy, side by
side, with transformers fp32 batch 64 as the offline reference; runs alternate, medians reported.

    .venv/bin/python bench/fast_path.py [--num-prompts 64] [--max-tokens 64] [--repeats 2]
        [--configs fp32,bf16,auto,int4-only] [--skip-transformers]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_line, load_line  # noqa: E402
from bench.throughput import load_prompts, run_pagoda, run_transformers  # noqa: E402
from engine import LLM, SamplingParams  # noqa: E402
from engine.kernels.cpu.cpu_info import describe  # noqa: E402

CONFIGS = {"fp32": ("fp32 float weights", dict(dtype="float32", quantization=None)),
           "bf16": ("bf16 float weights", dict(dtype="bfloat16", quantization=None)),
           "auto": ("auto (int4|dense, bf16)", {}),
           "int4-only": ("int4 + bf16, no dense", dict(quantization_dense_rows=None))}


def batch1_tokens_per_s(llm: LLM, prompt: list[int], max_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate([prompt], params)
    return max_tokens / (time.perf_counter() - start)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch1-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"of {', '.join(CONFIGS)}")
    args = ap.parse_args()
    print(f"# CPU: {cpu_line()}; {describe()}; {torch.get_num_threads()} threads; torch {torch.__version__}; "
          f"{load_line()}")
    llms = {CONFIGS[key][0]: LLM("smollm2", max_model_len=2048, **CONFIGS[key][1])
            for key in args.configs.split(",")}
    first = next(iter(llms.values()))
    prompts = load_prompts(first.tokenizer, args.num_prompts)
    hf = None
    if not args.skip_transformers:
        from transformers import AutoModelForCausalLM
        path = first.engine.model_path
        hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
        run_transformers(hf, prompts[:2], 2, first.tokenizer.pad_token_id or 0)
    for llm in llms.values():
        llm.generate(prompts[:4], SamplingParams(max_tokens=4))  # warm-up
    offline = {name: [] for name in [*llms, *(["transformers fp32"] if hf else [])]}
    single = {name: [] for name in llms}
    for _ in range(args.repeats):
        for name, llm in llms.items():
            single[name].append(batch1_tokens_per_s(llm, prompts[0], args.batch1_tokens))
            print(f"  batch 1, {name}: {single[name][-1]:.1f} tok/s", flush=True)
        for name, llm in llms.items():
            offline[name].append(run_pagoda(llm, prompts, args.max_tokens))
            print(f"  offline, {name}: {offline[name][-1]:.1f} tok/s", flush=True)
        if hf is not None:
            offline["transformers fp32"].append(run_transformers(
                hf, prompts, args.max_tokens, first.tokenizer.pad_token_id or 0))
            print(f"  offline, transformers fp32: {offline['transformers fp32'][-1]:.1f} tok/s", flush=True)
    base = statistics.median(offline["transformers fp32"]) if hf else None
    print(f"# {load_line()}")
    print(f"\n{'system':<24}{'batch-1 tok/s':>14}{'offline ' + str(len(prompts)) + ' tok/s':>18}"
          f"{'vs transformers':>16}   runs: {args.repeats}, {args.max_tokens} tokens a request")
    for name in offline:
        b1 = f"{statistics.median(single[name]):.1f}" if name in single else "-"
        off = statistics.median(offline[name])
        ratio = f"{off / base:.2f}x" if base else "-"
        print(f"{name:<24}{b1:>14}{off:>18.1f}{ratio:>16}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
