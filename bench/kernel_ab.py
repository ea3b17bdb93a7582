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
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import timing  # noqa: E402
from engine import LLM  # noqa: E402
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
    timing.step_arguments(parser, batch=64, steps=60)
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
    def use(name: str):
        def switch() -> None:
            runner.fused_decode.lib, native._state["lib"] = builds[name]
        return switch
    timing.start_decodes(engine, args.batch, args.context, args.steps + 8, "ab")
    times = timing.alternate(engine, [runner.fused_decode], {name: use(name) for name in builds},
                             args.steps)
    timing.print_medians(times, "build", args)


if __name__ == "__main__":
    main()
