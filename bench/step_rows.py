"""What the step's one-row ends in C give (engine/kernels/cpu/step_rows.c): the engine's decode
steps alternated, one with the tied embedding's rows and the greedy argmax as native calls, the
next with the torch code they replace (Int8Embedding.reference, the sampler's chunked argmax), in
one process, on the same sequences.

    .venv/bin/python bench/step_rows.py [--model smollm2] [--batch 1] [--context 100] [--steps 300]

Prints the medians of the fused call (the embedding is its first part), the LM head and the whole
step each way and their ratios, with the CPU's flags.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import timing  # noqa: E402
from bench.machine import cpu_line  # noqa: E402
from engine import LLM  # noqa: E402
from engine.kernels.cpu import native  # noqa: E402
from engine.layers.int8_embedding import Int8Embedding  # noqa: E402
from engine.sampling import sampler  # noqa: E402

NATIVE_FORWARD = Int8Embedding.forward
NO_LIBRARY = types.SimpleNamespace(library=lambda: None)  # the sampler's torch argmax


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    timing.step_arguments(parser, batch=1, steps=300)
    args = parser.parse_args()
    print(f"CPU: {cpu_line()}")

    llm = LLM(args.model, speculative_tokens=0)  # no drafts: every timed step one token a row
    engine, runner = llm.engine, llm.engine.runner
    if runner.fused_decode is None or not isinstance(runner.model.model.embed_tokens, Int8Embedding):
        sys.exit("no fused CPU step over a tied int8 embedding here: nothing to compare")

    def torch_ends() -> None:
        Int8Embedding.forward = Int8Embedding.reference
        sampler.native = NO_LIBRARY

    def native_ends() -> None:
        Int8Embedding.forward = NATIVE_FORWARD
        sampler.native = native

    timing.start_decodes(engine, args.batch, args.context, args.steps + 8, "rows")
    times = timing.alternate(engine, [runner.fused_decode], {"torch": torch_ends, "native": native_ends},
                             args.steps)
    timing.print_medians(times, "step's ends", args)


if __name__ == "__main__":
    main()
