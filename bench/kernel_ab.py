"""Two builds of the engine's CPU kernels, alternated step by step in one engine process.

The machine is shared and noisy (runs of the same build differ by 20-30%), so a kernel change is
timed against the build before it in one process, on the same sequences: ``--before`` names a git
revision whose ``engine/kernels/cpu/*.c`` are compiled beside the working tree's (same compiler,
same flags, both linked to torch's OpenMP runtime). The engine decodes ``--batch`` greedy
sequences from ``--context`` prompt tokens; each decode step runs on one build, the next on the
other, swapping both the fused decode step's library and the int4/int8 kernels' (the LM head).
Prints the medians of the fused call, the vocabulary projection and the whole step for each
build, their ratios, and the CPU's flags.

    .venv/bin/python bench/kernel_ab.py --before HEAD [--batch 64] [--context 100] [--steps 60]
"""

from __future__ import annotations

import argparse
import ctypes
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from engine.kernels.cpu import cpu_info  # noqa: E402
from engine.kernels.cpu import build, native  # noqa: E402

KERNELS = "engine/kernels/cpu"


def build_revision(revision: str, folder: pathlib.Path) -> tuple:
    """(the fused step's library, the products' library) compiled from ``revision``'s kernel
    sources and declared like the working tree's: one library for both where the revision has
    pagoda_kernels.h; before it, decode_step.c (which included qmatmul.c) and qmatmul.c apart."""
    files = subprocess.run(["git", "ls-tree", "--name-only", revision, f"{KERNELS}/"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    for path in files:
        if path.endswith((".c", ".h")):
            text = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=ROOT, check=True,
                                  capture_output=True, text=True).stdout
            (folder / pathlib.Path(path).name).write_text(text)
    compiler = shutil.which("gcc") or shutil.which("cc")
    arch = build.default_arch()
    if (folder / "pagoda_kernels.h").exists():
        build._compile(build.units(folder), folder / "kernels.so", compiler, arch)
        step = products = native.declare(ctypes.CDLL(str(folder / "kernels.so")))
    else:
        for name in ("decode_step", "qmatmul"):  # their symbols unmarked: every one exported
            build._compile([folder / f"{name}.c"], folder / f"{name}.so", compiler,
                           (*arch, "-fvisibility=default"))
        step = native.declare(ctypes.CDLL(str(folder / "decode_step.so")))
        products = native.declare(ctypes.CDLL(str(folder / "qmatmul.so")),
                                  [n for n in native.SIGNATURES if n.startswith(("pagoda_q4", "pagoda_q8"))])
    if not build.env_switch("PAGODA_AMX"):  # as native.library() sets the working tree's
        step.pagoda_q4_set_amx(0)
        products.pagoda_q4_set_amx(0)
    return step, products


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="HEAD", help="git revision of the other build")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=100, help="prompt tokens of each sequence")
    parser.add_argument("--steps", type=int, default=60, help="decode steps, alternated")
    args = parser.parse_args()
    print(f"CPU: {cpu_info.describe()}")

    # no drafts: prompt lookup on this repeated prompt would verify several tokens a step (other
    # products) and finish the sequences before the timed steps end
    llm = LLM(args.model, speculative_tokens=0)
    runner, engine = llm.engine.runner, llm.engine
    if runner.fused_decode is None:
        sys.exit("the fused decode step is off here: nothing to compare")
    with tempfile.TemporaryDirectory() as tmp:
        before_step, before_products = build_revision(args.before, pathlib.Path(tmp))
    builds = {args.before: (before_step, before_products),
              "working tree": (runner.fused_decode.lib, native.library())}
    times = {name: {"fused": [], "head": [], "step": []} for name in builds}
    current = {"name": None}

    def timed(part, inner):
        def call(*a, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                if current["name"]:
                    times[current["name"]][part].append(time.perf_counter() - t0)
        return call
    runner.fused_decode.run = timed("fused", runner.fused_decode.run)
    runner.model.compute_logits = timed("head", runner.model.compute_logits)

    words = engine.tokenizer.encode("The history of the printing press, told again. ")
    prompt = (words * (args.context // len(words) + 1))[:args.context]
    for i in range(args.batch):  # distinct first tokens: no prefix shared beyond the template
        engine.add_request(f"ab-{i}", [words[i % len(words)], *prompt], SamplingParams(
            temperature=0.0, max_tokens=args.steps + 8, ignore_eos=True))
    while any(s.num_output_tokens == 0 for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()  # prefills, untimed
    order = list(builds)
    for i in range(args.steps):
        name = order[i % 2]
        current["name"] = name
        runner.fused_decode.lib, native._state["lib"] = builds[name]
        t0 = time.perf_counter()
        engine.step()
        times[name]["step"].append(time.perf_counter() - t0)
    current["name"] = None
    runner.fused_decode.lib, native._state["lib"] = builds["working tree"]
    while engine.has_unfinished_requests():
        engine.step()

    print(f"batch {args.batch}, context {args.context}+, {args.steps} steps alternated, "
          f"{torch.get_num_threads()} threads; medians in ms")
    print(f"{'build':<14} {'fused call':>11} {'LM head':>9} {'step':>9}")
    med = {n: {p: statistics.median(v) * 1e3 for p, v in parts.items()} for n, parts in times.items()}
    for name in order:
        m = med[name]
        print(f"{name[:14]:<14} {m['fused']:>11.2f} {m['head']:>9.2f} {m['step']:>9.2f}")
    a, b = med[order[0]], med[order[1]]
    print(f"{'new / before':<14} {b['fused'] / a['fused']:>11.3f} {b['head'] / a['head']:>9.3f} "
          f"{b['step'] / a['step']:>9.3f}")


if __name__ == "__main__":
    main()
