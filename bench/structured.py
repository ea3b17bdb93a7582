"""Constrained decoding's cost: generated tokens/s with and without a JSON schema, 1 and 32 streams.

Usage: python bench/structured.py [--model smollm2] [--streams 1 32] [--tokens 64] [--repeats 2]

Offline, through the engine (no server). Both modes generate the same number of tokens per
stream: the free rows ignore EOS for ``--tokens``; the constrained rows follow a schema of a
fixed-length array of digits, which takes ``--tokens`` tokens to complete, so the difference is
the grammar's work per step (mask fill on the host, the bitmask in the sampler, the matcher's
advance). The first constrained request (the tokenizer's conversion for llguidance) is warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.machine import cpu_line  # noqa: E402
from engine import LLM, SamplingParams  # noqa: E402


def schema_of(tokens: int) -> dict:
    # "[1, 2, ...]": about 3 tokens per item ("1", ",", " ") with SmolLM2's tokenizer, plus the brackets
    n = max(1, (tokens - 2) // 3)
    return {"type": "array", "minItems": n, "maxItems": n, "items": {"type": "integer", "minimum": 0, "maximum": 9}}


def run(llm: LLM, streams: int, tokens: int, constrained: bool) -> tuple[float, int]:
    prompts = [[1, 504, 3303 + i, 314] for i in range(streams)]
    if constrained:
        params = SamplingParams(temperature=0.8, seed=0, max_tokens=tokens + 8,
                                structured_outputs={"json": schema_of(tokens)})
    else:
        params = SamplingParams(temperature=0.8, seed=0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, [params] * streams)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.token_ids) for o in outs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    llm = LLM(args.model, max_model_len=512, num_kv_blocks=(max(args.streams) * 8) + 8)
    run(llm, 1, 8, True)  # warm-up: kernels, and llguidance's tokenizer
    run(llm, 1, 8, False)
    print(f"{args.model}, {args.tokens} tokens per stream, median of {args.repeats}; {cpu_line()}")
    print(f"{'streams':>7} {'free tok/s':>11} {'schema tok/s':>13} {'ratio':>6}")
    for streams in args.streams:
        rates = {}
        for constrained in (False, True):
            samples = []
            for _ in range(args.repeats):
                elapsed, generated = run(llm, streams, args.tokens, constrained)
                samples.append(generated / elapsed)
            rates[constrained] = statistics.median(samples)
        print(f"{streams:>7} {rates[False]:>11.1f} {rates[True]:>13.1f} {rates[True] / rates[False]:>6.2f}")


if __name__ == "__main__":
    main()
