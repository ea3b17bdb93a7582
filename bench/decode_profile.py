"""Where one decode step of the engine goes: ms per step and torch.profiler's op counts.

    .venv/bin/python bench/decode_profile.py [--model smollm2] [--steps 40] [--dtype float32] [--context N]
        [--batch B] [--quantization int8] [--kv-cache-dtype bfloat16] [--split]

Prints the median step time over ``--steps`` decode steps, then the ops of ``--profile-steps``
profiled steps (calls per step and self CPU ms per step, the top rows by time and by count).
``--split`` also times the parts of each step: the fused decode (or the model's forward), the
vocabulary projection and the sampler, medians in ms; the rest is scheduling, inputs and outputs.
The CPU's flags (and a PAGODA_MAX_CPU_ISA cap) are printed first.

The step is set beside its memory floor: the bytes of the model's tensors a decode step reads
whole (every weight, the int8 vocabulary table; not the rotary table, read a row a position),
and the time this process takes to read that many bytes once, STREAM-like (a sum over one buffer
of that size with torch's threads, the median of 30 after 3 warm-ups, right after the decode
steps, beside the loaded model), so "1.5x the floor" says how far one stream is from
bandwidth-bound. A large shared L3 (300 MiB on this project's Xeon) makes the floor noisy: the
same 92 MiB read took 2.2 ms in a process without the model, 2.4-5.3 ms beside it, run to run.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from collections import Counter

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from engine import LLM, SamplingParams  # noqa: E402
from bench import timing  # noqa: E402
from bench.machine import cpu_line  # noqa: E402
from engine.kernels.cpu import cpu_info  # noqa: E402
from engine.memory.weight_arena import WeightArena  # noqa: E402


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's tensors (parameters, buffers and plain tensor attributes, each once:
    a tied table, or the kernels' weights that lie in one arena, engine/memory/weight_arena.py)
    that a decode step reads whole: all but the rotary tables."""
    tensors: dict[int, int] = {}

    def add(name: str, tensor: torch.Tensor) -> None:
        if "cos_sin" not in name and tensor.device.type == "cpu":
            tensors.setdefault(tensor.data_ptr(), tensor.nbytes)

    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        add(name, tensor)
    for module_name, module in model.named_modules():
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor):
                add(f"{module_name}.{name}", value)
    return sum(tensors.values())


def read_seconds(nbytes: int, repeats: int = 30) -> float:
    """Median seconds to read ``nbytes`` once: a sum over one buffer of that size (torch's threads;
    per-tensor sums measured torch's per-call cost instead: ~300 small tensors), on 2 MiB pages
    as the engine's weights are (on 4 KiB pages the same read took 1.2-1.4x as long)."""
    arena = WeightArena(nbytes)
    buffer = arena.place(torch.ones(nbytes // 4, dtype=torch.float32))
    for _ in range(3):
        buffer.sum()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        buffer.sum()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class _Split:
    """Wall time of each call of the step's parts, by wrapping them on the live engine (the fused
    step as the runner drives it: its ``parts`` generator)."""

    def __init__(self, runner):
        self.times: dict[str, list[float]] = {}
        if runner.fused_decode is not None:
            timing.wrap_generator(runner.fused_decode, "parts", self._sink("fused decode"))
        timing.wrap(runner.model, "forward", self._sink("forward"))
        timing.wrap(runner.model, "compute_logits", self._sink("vocabulary projection"))
        timing.wrap(runner, "sampler", self._sink("sampler"))

    def _sink(self, name: str):
        return self.times.setdefault(name, []).append

    def reset(self) -> None:
        for times in self.times.values():
            times.clear()

    def report(self, steps: int) -> str:
        return "; ".join(f"{name} {statistics.median(t) * 1e3:.2f} ms ({len(t) / steps:.1f}/step)"
                         for name, t in self.times.items() if t)


def _decode_steps(llm: LLM, num_steps: int, profiler=None, context: int = 0,
                  batch: int = 1, split: _Split | None = None) -> list[float]:
    """Seconds per engine step of ``batch`` greedy requests decoding together, after their
    prefills (not profiled); ``context``: each prompt is that many tokens of a repeated text
    instead of a short one."""
    engine = llm.engine
    prompt = "The history of the printing press"
    if context:
        prompt = (engine.tokenizer.encode("The history of the printing press, told again. ")
                  * context)[:context]
    for i in range(batch):
        engine.add_request(f"p{time.monotonic_ns()}-{i}", prompt, SamplingParams(
            temperature=0.0, max_tokens=num_steps + 1, ignore_eos=True))
    while any(s.num_output_tokens == 0 for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()  # prefills
    if split is not None:
        split.reset()
    if profiler is not None:
        profiler.start()
    times = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    if profiler is not None:
        profiler.stop()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--profile-steps", type=int, default=10, help="0: time only")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--quantization", default=None, help="the engine's setting (default: auto)")
    parser.add_argument("--kv-cache-dtype", default=None, help="the engine's setting (default: auto)")
    parser.add_argument("--top", type=int, default=18)
    parser.add_argument("--context", type=int, default=0, help="prompt tokens (0: a short prompt)")
    parser.add_argument("--batch", type=int, default=1, help="requests decoding together")
    parser.add_argument("--split", action="store_true", help="time the step's parts too")
    args = parser.parse_args()
    print(f"CPU: {cpu_line()}\nkernels: {cpu_info.describe()}")
    settings = {k: v for k, v in (("dtype", args.dtype), ("quantization", args.quantization),
                                  ("kv_cache_dtype", args.kv_cache_dtype)) if v is not None}
    # no drafts: greedy output that repeats itself would draft by prompt lookup, and a step that
    # verifies drafts is no decode step (60 steps asked for had come back as 57)
    llm = LLM(args.model, speculative_tokens=0, **settings)
    split = _Split(llm.engine.runner) if args.split else None
    _decode_steps(llm, 8, context=args.context, batch=args.batch)  # warm-up
    times = _decode_steps(llm, args.steps, context=args.context, batch=args.batch, split=split)
    print(f"decode, batch {args.batch}{f' at {args.context} tokens' if args.context else ''}: median {statistics.median(times) * 1e3:.1f} ms/step over {len(times)} steps "
          f"(min {min(times) * 1e3:.1f}), torch threads {torch.get_num_threads()}")
    nbytes = weight_bytes(llm.engine.runner.model)
    floor = read_seconds(nbytes)
    print(f"memory floor: {nbytes / 2**20:.1f} MiB read whole a step, read once in {floor * 1e3:.2f} ms "
          f"({nbytes / floor / 1e9:.1f} GB/s); the step is {statistics.median(times) / floor:.2f}x the floor")
    if split:
        print(f"parts (median per call): {split.report(len(times))}")
    if args.profile_steps <= 0:
        return

    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    ptimes = _decode_steps(llm, args.profile_steps, prof, context=args.context, batch=args.batch)
    n = len(ptimes)
    events = prof.key_averages()
    counts = Counter()
    total_ops = 0
    rows = []
    for e in events:
        if e.key.startswith("ProfilerStep"):
            continue
        rows.append((e.key, e.count / n, e.self_cpu_time_total / 1e3 / n))
        if e.key.startswith("aten::"):
            total_ops += e.count
            counts[e.key] = e.count
    print(f"profiled: {statistics.median(ptimes) * 1e3:.1f} ms/step (profiler on), "
          f"{total_ops / n:.0f} aten ops per step, self CPU of aten ops "
          f"{sum(r[2] for r in rows if r[0].startswith('aten::')):.1f} ms/step")
    print(f"{'op':<40} {'calls/step':>10} {'self ms/step':>13}")
    for key, calls, ms in sorted(rows, key=lambda r: -r[2])[:args.top]:
        print(f"{key[:40]:<40} {calls:>10.0f} {ms:>13.2f}")
    print("most frequent:", ", ".join(f"{k.removeprefix('aten::')} {c / n:.0f}"
                                      for k, c in counts.most_common(10)))


if __name__ == "__main__":
    main()
