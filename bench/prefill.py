"""Long-prompt prefill: seconds for Pagoda's engine to read a document, beside transformers.

A deterministic document of numbered lines (the chat page's attach case), cut to each
``--tokens`` length, prefilled with max_tokens 1 (time to first token, offline), step by step
as the scheduler chunks it (``max_num_batched_tokens``). transformers (fp32, the same GGUF
dequantized) reads the same tokens in one forward, its best case.

    .venv/bin/python bench/prefill.py [--tokens 1024 2048 5000] [--repeats 2] [--skip-transformers]
        [--dense-rows N] [--attention-ab [--streams N]]

``--attention-ab`` times the fused step's attention in float32 products against bf16 products
(AVX512-BF16, a bf16 model and cache: engine/kernels/cpu/attention.c) in the same process,
alternated per repeat, in place of transformers: ``--streams`` prompts of each length prefilled,
then 32 decode steps.
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


def attention_ab(args) -> int:
    """Each length with the fused step's attention in float32 and in bf16 products, alternated:
    ``--streams`` prompts of that length prefilled (seconds to every first token), then 32 decode
    steps (ms a step); medians, their ratio, and whether the tokens agreed."""
    llm = LLM(args.model, enable_prefix_caching=False, speculative_tokens=0)
    engine = llm.engine
    fused = engine.runner.fused_decode
    if fused is None or not fused.lib.pagoda_attention_bf16_products() or not fused.shape.bf16_products:
        raise SystemExit("bf16 products do not run here: an AVX512-BF16 CPU, the fused step and a bf16 "
                         "model and cache are needed")
    print(f"{engine.config.max_num_batched_tokens} tokens a step at most, {engine.runner.dtype}, "
          f"{torch.get_num_threads()} threads, {args.streams} stream(s), speculation off")
    print(f"{'prompt tokens':>13}{'prefill f32 s':>15}{'bf16 s':>8}{'ratio':>7}"
          f"{'decode f32 ms':>15}{'bf16 ms':>9}{'ratio':>7}{'same tokens':>13}")
    for n in args.tokens:
        ids = document_tokens(llm.tokenizer, n)
        prefill: dict[int, list[float]] = {0: [], 1: []}
        decode: dict[int, list[float]] = {0: [], 1: []}
        tokens: dict[int, list] = {}
        for _ in range(args.repeats):
            for mode in (0, 1):
                fused.shape.bf16_products = mode
                params = SamplingParams(temperature=0.0, max_tokens=33, ignore_eos=True)
                for i in range(args.streams):
                    engine.add_request(f"ab-{mode}-{i}-{time.monotonic_ns()}", [ids[0] + i] + ids[1:], params)
                outs: dict[str, list[int]] = {}
                start = time.perf_counter()
                while len(outs) < args.streams:
                    for o in engine.step():
                        outs.setdefault(o.request_id, []).extend(o.token_ids_delta)
                prefill[mode].append(time.perf_counter() - start)
                start, steps = time.perf_counter(), 0
                while engine.has_unfinished_requests():
                    for o in engine.step():
                        outs.setdefault(o.request_id, []).extend(o.token_ids_delta)
                    steps += 1
                decode[mode].append((time.perf_counter() - start) / max(steps, 1) * 1e3)
                tokens[mode] = [outs[k] for k in sorted(outs, key=lambda k: int(k.split("-")[2]))]
        fused.shape.bf16_products = 1
        p32, p16 = statistics.median(prefill[0]), statistics.median(prefill[1])
        d32, d16 = statistics.median(decode[0]), statistics.median(decode[1])
        print(f"{n:>13}{p32:>15.2f}{p16:>8.2f}{p32 / p16:>6.2f}x{d32:>15.2f}{d16:>9.2f}{d32 / d16:>6.2f}x"
              f"{str(tokens[0] == tokens[1]):>13}", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 5000])
    ap.add_argument("--repeats", type=int, default=2, help="alternate the two this many times")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--dense-rows", type=int, default=None,
                    help="the engine's quantization_dense_rows (default: its own, off)")
    ap.add_argument("--attention-ab", action="store_true",
                    help="float32 against bf16 products in the fused step's attention")
    ap.add_argument("--streams", type=int, default=1, help="--attention-ab's prompts at once")
    args = ap.parse_args()
    if args.attention_ab:
        return attention_ab(args)

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
