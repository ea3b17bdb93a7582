"""What running a step in parts costs (engine/parts.py): the fused CPU step of a batch of
decodes whole, and in its parts with a pause asked between them (never taken), alternated step by
step in one engine so that each pair of neighbouring steps has the same rows.

    .venv/bin/python bench/step_parts.py [--model smollm2] [--streams 32] [--max-tokens 128] [--rounds 4]

Prints the median step time each way and the median of the paired ratios (parts / whole), over
the steps where every stream decodes (``--streams`` rows, at least fused_decode.PAUSABLE_ROWS so
that the parts run). The machine is shared and noisy: only the paired ratio means much.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.machine import cpu_line, load_line  # noqa: E402
from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from engine.models import fused_decode  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    if args.streams < fused_decode.PAUSABLE_ROWS:
        ap.error(f"--streams below {fused_decode.PAUSABLE_ROWS}: such a step runs whole")
    print(cpu_line())
    engine = LLMEngine(EngineConfig(model=args.model))
    if engine.runner.fused_decode is None:
        sys.exit("the fused CPU step does not run here: nothing runs in parts")
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    whole, parts, ratios = [], [], []
    for r in range(args.rounds):
        for i in range(args.streams):
            engine.add_request(f"{r}-{i}", f"Tell me a story, number {i} of round {r}.", params)
        k, last = 0, None
        while engine.has_unfinished_requests():
            in_parts = k % 2 == 1
            engine.arrivals = (lambda: None) if in_parts else None  # asked between parts; never pauses
            start = time.perf_counter()
            engine.step()
            took = time.perf_counter() - start
            full = engine.scheduler.num_running == args.streams
            if k >= 4 and full:
                (parts if in_parts else whole).append(took)
                if in_parts and last is not None:
                    ratios.append(took / last)
            last = took if not in_parts and full else None
            k += 1
    engine.arrivals = None
    print(load_line())
    print(f"{args.streams} streams: whole step median {statistics.median(whole) * 1e3:.2f} ms ({len(whole)} steps), "
          f"in {fused_decode.PARTS} parts {statistics.median(parts) * 1e3:.2f} ms ({len(parts)} steps); "
          f"paired ratio parts / whole, median {statistics.median(ratios):.4f}")


if __name__ == "__main__":
    main()
