"""Offline throughput: Pagoda's engine vs Hugging Face transformers' generate, side by side.

The same chat requests (bench/prompts.json through the model's chat template),
greedy, max_tokens 128 with EOS ignored so every request yields exactly 128 tokens.
transformers gets its best case: every request in one left-padded batch.

    .venv/bin/python bench/throughput.py [--num-prompts 64] [--max-tokens 128] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import LLM, SamplingParams  # noqa: E402
from engine.kernels.cpu import cpu_info  # noqa: E402
from engine.text.tokenizer import apply_chat_template  # noqa: E402


def load_prompts(tokenizer, n: int) -> list[list[int]]:
    texts = json.loads((ROOT / "bench" / "prompts.json").read_text())
    texts = (texts * (n // len(texts) + 1))[:n]
    return [apply_chat_template(tokenizer, [{"role": "user", "content": t}]) for t in texts]


def run_pagoda(llm: LLM, prompts, max_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    # every run from a cold prefix cache: a repeat would otherwise find its whole prompts cached
    # by the run before (only what the requests of one run share, the template, is fair game)
    llm.engine.block_manager.reset_prefix_cache()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == max_tokens for o in outputs)
    return sum(len(o.token_ids) for o in outputs) / elapsed


def run_transformers(model, prompts, max_tokens: int, pad_id: int) -> float:
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids, attention_mask=mask, do_sample=False,
                             max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             pad_token_id=pad_id)
    elapsed = time.perf_counter() - start
    num_out = (out.shape[1] - width) * len(prompts)
    return num_out / elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1, help="alternate the two this many times")
    ap.add_argument("--skip-transformers", action="store_true")
    args = ap.parse_args()

    llm = LLM(args.model)
    prompts = load_prompts(llm.tokenizer, args.num_prompts)
    print(f"{len(prompts)} requests, prompt tokens {sum(map(len, prompts))} "
          f"(min {min(map(len, prompts))}, max {max(map(len, prompts))}), "
          f"{args.max_tokens} output tokens each, {torch.get_num_threads()} threads; pagoda's defaults "
          f"({str(llm.engine.runner.dtype).removeprefix('torch.')}, quantization "
          f"{llm.engine.config.quantization}), transformers fp32; {cpu_info.describe()}")
    hf = None
    if not args.skip_transformers:
        from transformers import AutoModelForCausalLM
        path = llm.engine.model_path
        kwargs = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
        hf = AutoModelForCausalLM.from_pretrained(path.parent if kwargs else path,
                                                  dtype=torch.float32, **kwargs).eval()
    llm.generate(prompts[:4], SamplingParams(max_tokens=4))  # warm-up both
    if hf is not None:
        run_transformers(hf, prompts[:4], 4, llm.tokenizer.pad_token_id or 0)

    ours, theirs = [], []
    for _ in range(args.repeats):
        ours.append(run_pagoda(llm, prompts, args.max_tokens))
        if hf is not None:
            theirs.append(run_transformers(hf, prompts, args.max_tokens,
                                           llm.tokenizer.pad_token_id or 0))
    stats = llm.engine.stats()
    print(f"{'system':<34}{'output tokens/s (median)':>26}  runs")
    print(f"{'pagoda engine':<34}{statistics.median(ours):>26.1f}  {', '.join(f'{r:.1f}' for r in ours)}")
    if theirs:
        print(f"{'transformers generate, batch ' + str(len(prompts)):<34}"
              f"{statistics.median(theirs):>26.1f}  {', '.join(f'{r:.1f}' for r in theirs)}")
        print(f"ratio pagoda / transformers: {statistics.median(ours) / statistics.median(theirs):.2f}x")
    print(f"prefix cache: {stats.prefix_cache_hit_tokens} of {stats.prefix_cache_queried_tokens} "
          f"prompt tokens hit; preemptions {stats.num_preemptions}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
