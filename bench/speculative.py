"""Speculative decoding (prompt lookup, or a draft model) against no speculation, one engine each, alternated in one process.

Each task is one chat request to the bundled SmolLM2 (or --model), greedy, answered twice per
repeat: by an engine with ``speculative_tokens`` set and by one with it 0, in alternating order.
Reports per task: output tokens, tokens/s of each, the speed-up, draft acceptance, tokens per
verification step, and whether the two answers are the same tokens (they must be: greedy output
does not depend on speculation).

    .venv/bin/python bench/speculative.py [--repeats 2] [--tokens 8] [--max-tokens 400]
        [--streams 1]  # --streams 32: the task's request 32 times at once (tokens/s summed)
        [--draft-model PATH.gguf]

``--draft-model PATH`` drafts by that model (``speculative_model``) instead of prompt lookup;
bench/draft_gguf.py cuts one from the bundled model (its first layers).

Tasks: correcting the spelling of a ~300-word passage, extracting the sentences that mention a
word, renaming a variable through a function (document-grounded: the answer copies its input),
and free-form chat (nothing to copy).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from grounded_tasks import TASKS  # noqa: E402
from machine import cpu_line, load_line  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402

def run(llm: LLM, prompt: str, max_tokens: int, streams: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    messages = [{"role": "user", "content": prompt}]
    start = time.perf_counter()
    outs = llm.chat([messages] * streams, [params] * streams)
    return time.perf_counter() - start, [list(o.token_ids) for o in outs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=8, help="speculative_tokens of the drafting engine")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--draft-model", default=None, help="speculative_model of the drafting engine")
    args = parser.parse_args()
    print(cpu_line())
    drafting = {"speculative_model": args.draft_model} if args.draft_model else {}
    engines = {"spec": LLM(args.model, speculative_tokens=args.tokens, max_num_seqs=max(32, args.streams),
                           **drafting),
               "plain": LLM(args.model, speculative_tokens=0, max_num_seqs=max(32, args.streams))}
    for llm in engines.values():  # warm-up: kernels, caches
        run(llm, "Say hello.", 8, 1)
    print(f"speculative_tokens={args.tokens} streams={args.streams} repeats={args.repeats}"
          f"{', draft model ' + args.draft_model if args.draft_model else ', prompt lookup'}, "
          f"medians; {load_line()}")
    print(f"{'task':10} {'tokens':>6} {'plain tok/s':>11} {'spec tok/s':>10} {'speed-up':>8} "
          f"{'accepted':>8} {'tok/step':>8} same")
    for task in args.tasks.split(","):
        times = {name: [] for name in engines}
        answers = {}
        spec = engines["spec"].engine.scheduler.speculator
        spec.num_drafts = spec.num_draft_tokens = spec.num_accepted_tokens = 0
        for r in range(args.repeats):
            for name in (("spec", "plain") if r % 2 == 0 else ("plain", "spec")):
                seconds, tokens = run(engines[name], TASKS[task], args.max_tokens, args.streams)
                times[name].append(seconds)
                answers[name] = tokens
        num_tokens = sum(len(t) for t in answers["plain"])
        rate = {name: num_tokens / statistics.median(t) for name, t in times.items()}
        accepted = spec.num_accepted_tokens / spec.num_draft_tokens if spec.num_draft_tokens else 0.0
        # tokens a drafting sequence's verification step emitted: accepted drafts + the model's own
        per_step = (spec.num_accepted_tokens + spec.num_drafts) / spec.num_drafts if spec.num_drafts else 1.0
        print(f"{task:10} {num_tokens:6d} {rate['plain']:11.1f} {rate['spec']:10.1f} "
              f"{rate['spec'] / rate['plain']:7.2f}x {accepted:8.0%} {per_step:8.2f} "
              f"{answers['spec'] == answers['plain']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
