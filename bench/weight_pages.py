"""What the weights' huge pages give (engine/memory/weight_arena.py): the engine's decode steps
alternated, one on the arena the engine loads its kernel weights into (2 MiB pages), the next on
copies of the same tensors as torch allocates them (4 KiB pages, unless transparent huge pages are
"always"), in one process, on the same sequences.

    .venv/bin/python bench/weight_pages.py [--model smollm2] [--batch 1] [--context 100] [--steps 300]

Prints the medians of the fused call, the LM head and the whole step each way and their ratios,
the bytes of the arena on huge pages, the THP mode and the CPU's flags.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import timing  # noqa: E402
from bench.machine import cpu_line  # noqa: E402
from engine import LLM  # noqa: E402
from engine.memory.weight_arena import holders  # noqa: E402
from engine.models.fused_decode import FusedDecode  # noqa: E402


def thp_mode() -> str:
    try:
        text = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "?"
    return text.split("[")[1].split("]")[0] if "[" in text else text.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    timing.step_arguments(parser, batch=1, steps=300)
    args = parser.parse_args()
    print(f"CPU: {cpu_line()}; transparent huge pages: {thp_mode()}")

    llm = LLM(args.model, speculative_tokens=0)  # no drafts: every timed step one token a row
    engine, runner = llm.engine, llm.engine.runner
    arena = runner.weight_arena
    if runner.fused_decode is None or arena is None:
        sys.exit("no fused CPU step or no weight arena here: nothing to compare")
    print(f"arena: {arena.nbytes / 2**20:.1f} MiB, {arena.huge_bytes() / 2**20:.1f} MiB on huge pages")
    movers = holders(runner.model)
    in_arena = [t for h in movers for t in h.kernel_weights()]
    copies = {t.data_ptr(): t.clone() for t in in_arena}
    back = {c.data_ptr(): t for t, c in zip(in_arena, copies.values())}

    def use(table: dict) -> None:
        for holder in movers:
            holder.move_kernel_weights(lambda t: table.get(t.data_ptr(), t))
    use(copies)  # a second fused step on the copies' addresses
    fused = {"small pages": FusedDecode.build(runner.model, runner.kv_caches, runner.block_size,
                                              use_triton=False, tensor_parallel=False,
                                              dense_rows=runner.fused_decode.dense_rows),
             "arena": runner.fused_decode}
    use(back)
    def switch(name: str):
        def to() -> None:
            runner.fused_decode = fused[name]
            use(copies if name == "small pages" else back)  # the LM head's table too
        return to
    timing.start_decodes(engine, args.batch, args.context, args.steps + 8, "pages")
    times = timing.alternate(engine, fused.values(), {name: switch(name) for name in fused}, args.steps)

    timing.print_medians(times, "weights", args)


if __name__ == "__main__":
    main()
