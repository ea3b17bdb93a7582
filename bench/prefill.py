"""Long-prompt prefill: seconds for Pagoda's engine to read a document, beside transformers.

A deterministic document of numbered lines (the chat page's attach case), cut to each
``--tokens`` length, prefilled with max_tokens 1 (time to first token, offline), step by step
as the scheduler chunks it (``max_num_batched_tokens``). transformers (fp32, the same GGUF
dequantized) reads the same tokens in one forward, its best case.

    .venv/bin/python bench/prefill.py [--tokens 1024 2048 5000] [--repeats 2] [--skip-transformers]
        [--dense-rows N]
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

from engine import LLM, SamplingParams  # noqa: E402


def document_text() -> str:
    """A keeper's log of 4,000 numbered lines (about 100,000 tokens): the chat page's attach case."""
    return "\n".join(f"Line {i}: the keeper's log says the tide rose {i % 7} feet at dawn and the lamp "
                     f"burned {i % 13} hours." for i in range(4000))


def document_tokens(tokenizer, n: int) -> list[int]:
    ids = tokenizer.encode(document_text())
    if len(ids) < n:
        raise SystemExit(f"the document has only {len(ids)} tokens")
    return ids[:n]


def prefill_pagoda(llm: LLM, ids: list[int]) -> tuple[float, list[float]]:
    """(seconds to the first token, seconds of each engine step)."""
    engine = llm.engine
    engine.add_request(f"prefill-{time.monotonic_ns()}", ids,
                       SamplingParams(temperature=0.0, max_tokens=1))
    steps = []
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t)
    return time.perf_counter() - start, steps


def prefill_transformers(model, ids: list[int]) -> float:
    with torch.no_grad():
        start = time.perf_counter()
        model(torch.tensor([ids]), use_cache=False, logits_to_keep=1)
        return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 5000])
    ap.add_argument("--repeats", type=int, default=2, help="alternate the two this many times")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--dense-rows", type=int, default=None,
                    help="the engine's quantization_dense_rows (default: its own, off)")
    args = ap.parse_args()

    # no prefix cache across repeats: each run reads its document from the first token
    settings = {} if args.dense_rows is None else {"quantization_dense_rows": args.dense_rows}
    llm = LLM(args.model, enable_prefix_caching=False, **settings)
    runner = llm.engine.runner
    print(f"{llm.engine.config.max_num_batched_tokens} tokens a step at most, {runner.dtype}, "
          f"{torch.get_num_threads()} threads")
    hf = None
    if not args.skip_transformers:
        from transformers import AutoModelForCausalLM
        path = llm.engine.model_path
        kwargs = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
        hf = AutoModelForCausalLM.from_pretrained(path.parent if kwargs else path,
                                                  dtype=torch.float32, **kwargs).eval()
    print(f"{'prompt tokens':>13}{'pagoda s':>10}{'tok/s':>8}{'slowest step s':>16}"
          f"{'transformers s':>16}{'ratio':>7}")
    for n in args.tokens:
        ids = document_tokens(llm.tokenizer, n)
        ours, slowest, theirs = [], [], []
        for _ in range(args.repeats):
            total, steps = prefill_pagoda(llm, ids)
            ours.append(total)
            slowest.append(max(steps))
            if hf is not None:
                theirs.append(prefill_transformers(hf, ids))
        mine = statistics.median(ours)
        line = f"{n:>13}{mine:>10.2f}{n / mine:>8.0f}{statistics.median(slowest):>16.2f}"
        if theirs:
            ref = statistics.median(theirs)
            line += f"{ref:>16.2f}{ref / mine:>6.2f}x"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
