"""What batch invariance costs (engine.config ``batch_invariant``): the bundled SmolLM2 (or
``--model``) with the
mode on (prompt rows through the fused C step, as decodes) and off (prompt chunks on the torch
path), speculative decoding off in both (it runs only where the mode holds), two engines in one process, alternated ``--repeats`` times so a shared machine's drifting
load hits both alike (each repeat in the other order). Prefix caching is off: every run computes its prompt.

- time to first token of one document of ``--tokens`` lengths (max_tokens 1, offline, chunked as
  the scheduler does);
- one stream: time per output token of a greedy chat answer (``--max-tokens``, EOS ignored);
- ``--streams`` streams at once: output tokens per second, prompts and decodes of one batch;
- whether the greedy answers of both modes are the same (they need not be: the two modes round
  prompts differently; the mode's promise is that each gives itself the same answer).

Prints medians, the on/off ratios (target: the mode costs at most 5% at 1 and 32 streams) and
the CPU's model and flags.

    .venv/bin/python bench/batch_invariance.py [--tokens 512 2048 6000] [--repeats 2]
        [--max-tokens 64] [--streams 32] [--model smollm2 | PATH.gguf]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import LLM, SamplingParams  # noqa: E402
from bench.machine import cpu_line  # noqa: E402
from bench.prefill import document_tokens, prefill_pagoda  # noqa: E402

QUESTIONS = ["Say hello.", "Name three rivers.", "Explain a prefix cache in a sentence.",
             "Write a haiku about tides.", "What is 17 times 3?", "Give me a packing list for a hike.",
             "Why is the sky blue?", "Summarise the plot of Hamlet."]


def one_stream(llm: LLM, max_tokens: int) -> tuple[float, list[int]]:
    """Seconds per output token after the first chunk, and the tokens. A chunk may hold several
    tokens (a speculative draft's accepted ones): the time is divided by tokens, not chunks."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    times, ids, first = [], [], 0
    for out in llm.stream(llm.engine.encode_prompt(_chat(llm, QUESTIONS[0])), params):
        times.append(time.perf_counter())
        ids.extend(out.token_ids_delta)
        first = first or len(ids)
    return (times[-1] - times[0]) / max(1, len(ids) - first), ids


def many_streams(llm: LLM, streams: int, max_tokens: int) -> float:
    """Output tokens per second of ``streams`` greedy answers run as one batch."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    prompts = [_chat(llm, f"{QUESTIONS[i % len(QUESTIONS)]} (#{i})") for i in range(streams)]
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)


def _chat(llm: LLM, question: str) -> str:
    """The question in the model's chat template; as plain text for a base model without one."""
    from engine.text.tokenizer import apply_chat_template
    if not getattr(llm.tokenizer, "chat_template", None):
        return question
    return apply_chat_template(llm.tokenizer, [{"role": "user", "content": question}])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 6000])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--model", default="smollm2", help="a name or a path (a GGUF: e.g. Gemma 3 270M's)")
    args = ap.parse_args()

    # speculation off in both: it runs only where the mode holds, and would count as the mode's gain
    engines = {mode: LLM(args.model, enable_prefix_caching=False, batch_invariant=mode == "on",
                         speculative_tokens=0)
               for mode in ("off", "on")}
    assert engines["on"].engine.runner.batch_invariant, "the mode does not apply here (see the log)"
    print(f"CPU: {cpu_line()}; {torch.get_num_threads()} threads; {engines['on'].engine.runner.dtype}")
    doc = {n: document_tokens(engines["on"].tokenizer, n) for n in args.tokens}
    results: dict[tuple[str, str], list[float]] = {}
    answers: dict[str, list[int]] = {}
    for repeat in range(args.repeats):
        for mode in ("off", "on") if repeat % 2 == 0 else ("on", "off"):  # neither always second
            llm = engines[mode]
            for n in args.tokens:
                results.setdefault((mode, f"TTFT {n} tokens (s)"), []).append(prefill_pagoda(llm, doc[n])[0])
            tpot, answers[mode] = one_stream(llm, args.max_tokens)
            results.setdefault((mode, "1 stream, ms per token"), []).append(1000 * tpot)
            results.setdefault((mode, f"{args.streams} streams, tok/s"), []).append(
                many_streams(llm, args.streams, args.max_tokens))
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {args.repeats}")
    print(f"{'measure':<28}{'off':>10}{'on':>10}{'on/off':>9}")
    for measure in dict.fromkeys(m for _, m in results):
        off, on = (statistics.median(results[mode, measure]) for mode in ("off", "on"))
        print(f"{measure:<28}{off:>10.3f}{on:>10.3f}{on / off:>9.3f}")
    print("greedy answers of the two modes", "the same" if answers["on"] == answers["off"] else "differ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
