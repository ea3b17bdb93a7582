"""Wall time of each call of a live engine's methods, for the bench scripts that split a step.

``wrap(owner, "compute_logits", times.append)`` replaces the method with one that passes each
call's seconds to the sink; ``wrap_generator`` does the same for a generator method (the fused
step's ``parts``, which the model runner drives with ``yield from``): from the first ``next`` to
its return, whatever the generator waited on between its parts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable


def wrap(owner, attr: str, sink: Callable[[float], None]) -> None:
    inner = getattr(owner, attr)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            sink(time.perf_counter() - t0)
    setattr(owner, attr, timed)


def wrap_generator(owner, attr: str, sink: Callable[[float], None]) -> None:
    inner = getattr(owner, attr)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return (yield from inner(*args, **kwargs))
        finally:
            sink(time.perf_counter() - t0)
    setattr(owner, attr, timed)


def start_decodes(engine, batch: int, context: int, max_tokens: int, tag: str) -> None:
    """``batch`` greedy sequences of ``context`` prompt tokens (a repeated sentence, each after a
    distinct first token: no prefix shared beyond it), their prefills run, untimed."""
    from engine import SamplingParams

    words = engine.tokenizer.encode("The history of the printing press, told again. ")
    prompt = (words * (context // len(words) + 1))[:context]
    for i in range(batch):
        engine.add_request(f"{tag}-{i}", [words[i % len(words)], *prompt], SamplingParams(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    while any(s.num_output_tokens == 0 for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()


def print_medians(times: dict[str, dict[str, list[float]]], label: str, args) -> None:
    """The run's shape (``args`` of step_arguments), then the medians (ms) of each way's fused
    call, LM head and step, then the second way's over the first's."""
    import statistics

    import torch

    print(f"batch {args.batch}, context {args.context}+, {args.steps} steps alternated, "
          f"{torch.get_num_threads()} threads; medians in ms")
    order = list(times)
    print(f"{label:<14} {'fused call':>11} {'LM head':>9} {'step':>9}")
    med = {n: {p: statistics.median(v) * 1e3 for p, v in parts.items()} for n, parts in times.items()}
    for name in order:
        m = med[name]
        print(f"{name[:14]:<14} {m['fused']:>11.2f} {m['head']:>9.2f} {m['step']:>9.2f}")
    a, b = med[order[0]], med[order[1]]
    print(f"{'second / first':<14} {b['fused'] / a['fused']:>11.3f} {b['head'] / a['head']:>9.3f} "
          f"{b['step'] / a['step']:>9.3f}")


def alternate(engine, fused_steps: Iterable, ways: dict[str, Callable[[], None]], steps: int
              ) -> dict[str, dict[str, list[float]]]:
    """``steps`` engine steps, each on the next of ``ways`` in turn (its function switches the
    engine to it), timing each one's fused call (``fused_steps``: the FusedDecode objects the ways
    use), LM head and whole step (seconds by way and part); then the sequences run to their end
    on the last way."""
    times = {name: {"fused": [], "head": [], "step": []} for name in ways}
    current = {"name": None}

    def sink(part):
        def record(seconds: float) -> None:
            if current["name"]:
                times[current["name"]][part].append(seconds)
        return record
    for fused in fused_steps:  # the runner drives a fused step as its parts generator
        wrap_generator(fused, "parts", sink("fused"))
    wrap(engine.runner.model, "compute_logits", sink("head"))
    order = list(ways)
    for i in range(steps):
        name = current["name"] = order[i % len(order)]
        ways[name]()
        t0 = time.perf_counter()
        engine.step()
        times[name]["step"].append(time.perf_counter() - t0)
    current["name"] = None
    ways[order[-1]]()
    while engine.has_unfinished_requests():
        engine.step()
    return times


def step_arguments(parser, batch: int, steps: int) -> None:
    """The options of a script that alternates decode steps: --model, --batch, --context, --steps."""
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--context", type=int, default=100, help="prompt tokens of each sequence")
    parser.add_argument("--steps", type=int, default=steps, help="decode steps, alternated")
