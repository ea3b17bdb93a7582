"""Decode step time and KV pool capacity of kv_cache_dtype "auto" against "int8" (fp8_e4m3: CUDA).

    OMP_NUM_THREADS=1 .venv/bin/python bench/kv_cache_dtype.py [--model smollm2] [--repeats 3]

One engine per cache dtype in one process, same settings; each repeat runs every case on every
engine in turn (alternated), and the table gives the median ms per decode step: 1 sequence with
a short prompt and with a ~1,000-token one, and 32 sequences with ~200-token prompts.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from engine import LLM, SamplingParams  # noqa: E402

TEXT = "The history of the printing press, told again. "


def decode_ms(llm: LLM, num_seqs: int, context: int, steps: int) -> float:
    """Median ms per engine step once every sequence is decoding."""
    engine = llm.engine
    ids = (engine.tokenizer.encode(TEXT) * (context // 8 + 2))[:max(context, 8)]
    for i in range(num_seqs):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", [ids[0] + i % 7] + ids[1:], SamplingParams(
            temperature=0.0, max_tokens=steps + 8, ignore_eos=True))
    times = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[-steps:]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--dtypes", default="auto,int8")
    args = parser.parse_args()
    kinds = args.dtypes.split(",")
    llms = {k: LLM(args.model, kv_cache_dtype=k, max_model_len=2048, max_num_seqs=32,
                   kv_cache_memory=256 << 20) for k in kinds}
    for k, llm in llms.items():
        r = llm.engine.runner
        print(f"{k}: {r.num_blocks * r.block_size} tokens in {r.kv_cache_bytes / 2**20:.0f} MiB "
              f"(activations {str(r.dtype).removeprefix('torch.')})", flush=True)
    cases = [(1, 16), (1, 1000), (32, 200)]
    results = {(k, c): [] for k in kinds for c in cases}
    for _ in range(args.repeats):
        for case in cases:
            for k in kinds:
                results[k, case].append(decode_ms(llms[k], *case, args.steps))
    print("| sequences x context | " + " | ".join(f"{k} ms/step" for k in kinds) + " | ratio |")
    for case in cases:
        med = [statistics.median(results[k, case]) for k in kinds]
        print(f"| {case[0]} x {case[1]} | " + " | ".join(f"{m:.1f}" for m in med)
              + f" | {med[-1] / med[0]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
