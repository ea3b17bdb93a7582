"""Decode-step projections of SmolLM2-135M on this CPU: fp32, bf16, int8 and int4 weight-only.

One "step" runs the four projections of each of the 30 layers (fused qkv 960x576, o 576x576,
fused gate/up 3072x576, down 576x1536), every layer with its own weights so the step streams the
whole model from memory as a real decode step does; the LM head (49152x576) is timed on its own.
Variants alternate inside each repeat and the table prints medians, so a noisy shared machine
moves all columns together. Last, the crossover: the fewest rows at which bf16 GEMM beats each
weight-only variant.

    .venv/bin/python bench/linear_kernels.py [--repeats 5] [--rows 1,2,4,8,16,32,64]
    .venv/bin/python bench/linear_kernels.py --smollm2 [--repeats 5]

--smollm2 instead loads the bundled GGUF: its Q4_1 blocks straight into int4 modules, timed
against the fp32 (dequantized) nn.Linear of transformers' own load at rows 1 and 32, then the
greedy fidelity of that int4 model against the fp32 one on a few chat prompts.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_line  # noqa: E402
from engine.quantization.int4 import Int4WeightOnlyLinear, check_int4_shape  # noqa: E402
from engine.quantization.int8 import Int8WeightOnlyLinear  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS, VOCAB = 576, 9, 3, 64, 1536, 30, 49152
LAYER_SHAPES = [((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), (HIDDEN, HEADS * HEAD_DIM),
                (2 * INTER, HIDDEN), (HIDDEN, INTER)]  # [out, in]
LM_HEAD = (VOCAB, HIDDEN)


def make_variant(kind: str, out_features: int, in_features: int):
    """A callable x -> y for one projection, plus the activation dtype it is fed."""
    gen = torch.Generator().manual_seed(out_features * 7 + in_features)
    if kind in ("fp32", "bf16"):
        dtype = torch.float32 if kind == "fp32" else torch.bfloat16
        weight = (torch.randn(out_features, in_features, generator=gen) * 0.02).to(dtype)
        return (lambda x: F.linear(x, weight)), dtype
    if kind.startswith("int8"):
        dtype = torch.float32 if kind.endswith("fp32") else torch.bfloat16
        q = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8, generator=gen)
        return Int8WeightOnlyLinear(q, torch.rand(out_features, generator=gen) * 1e-3, dtype=dtype), dtype
    group = int(kind.split("g")[1])
    check_int4_shape(out_features, in_features, group)
    codes = torch.randint(0, 16, (out_features, in_features), dtype=torch.uint8, generator=gen)
    groups = (out_features, in_features // group)
    return Int4WeightOnlyLinear(codes, torch.rand(groups, generator=gen) * 1e-2,
                                torch.randn(groups, generator=gen) * 1e-2, group), torch.bfloat16


def build(kind: str):
    """(step callable over all layers, LM head callable, dtype), or None where a shape is refused."""
    try:
        layers = [[make_variant(kind, o, i)[0] for o, i in LAYER_SHAPES] for _ in range(LAYERS)]
    except ValueError:
        layers = None
    try:
        head, dtype = make_variant(kind, *LM_HEAD)
    except ValueError:
        head, dtype = None, make_variant(kind, 16, 256)[1]
    return layers, head, dtype


def time_once(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


SMOLLM2_PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
                   "Explain what a hash table is.", "List three uses of copper."]
HF_PROJECTIONS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                  "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                  "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def smollm2(repeats: int, max_new_tokens: int = 64) -> None:
    import copy

    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM

    from engine.models.gguf_loader import unpermute_qk
    from engine.models.registry import resolve_model_path
    from engine.quantization.fidelity import teacher_forced_fidelity, Fidelity
    from engine.quantization.gguf import q4_to_int4
    from engine.text.tokenizer import apply_chat_template, load_tokenizer

    path = resolve_model_path("smollm2")
    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=torch.float32).eval()
    quantized = copy.deepcopy(reference)
    cfg = reference.config
    for tensor in GGUFReader(path).tensors:
        parts = tensor.name.split(".")
        if parts[0] != "blk" or parts[2] not in HF_PROJECTIONS:
            continue
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        codes, scales, zeros = q4_to_int4(tensor.data, shape, tensor.tensor_type.name)
        heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}.get(parts[2])
        if heads:  # llama.cpp's Q/K row order -> HF's; whole rows move
            codes, scales, zeros = (unpermute_qk(t, heads) for t in (codes, scales, zeros))
        parent, _, child = f"model.layers.{parts[1]}.{HF_PROJECTIONS[parts[2]]}".rpartition(".")
        setattr(quantized.get_submodule(parent), child, Int4WeightOnlyLinear(codes, scales, zeros, 32))

    def projections(model):
        return [model.get_submodule(f"model.layers.{i}.{n}")
                for i in range(cfg.num_hidden_layers) for n in HF_PROJECTIONS.values()]

    variants = {"fp32 nn.Linear": (projections(reference), torch.float32),
                "int4 from Q4_1, fp32 in/out": (projections(quantized), torch.float32),
                "int4 from Q4_1, bf16 in/out": (projections(quantized), torch.bfloat16)}
    times = {(k, r): [] for k in variants for r in (1, 32)}
    with torch.no_grad():
        for rep in range(repeats + 1):
            for r in (1, 32):
                for kind, (mods, dtype) in variants.items():
                    xs = [torch.randn(r, m.in_features).to(dtype) for m in mods]
                    elapsed = time_once(lambda: [m(x) for m, x in zip(mods, xs)])
                    if rep:  # the first round is warm-up
                        times[kind, r].append(elapsed)
    print(f"# CPU: {cpu_line()}; {torch.get_num_threads()} threads; torch {torch.__version__}; median of {repeats}")
    print(f"\nSmolLM2 30 layers x 7 projections (unfused, as transformers holds them), ms")
    for kind in variants:
        print(f"{kind:>30} " + " ".join(
            f"rows {r}: {statistics.median(times[kind, r]) * 1e3:7.2f}" for r in (1, 32)))

    tokenizer = load_tokenizer("smollm2")
    total = Fidelity(0, 0, 0)
    with torch.no_grad():
        for text in SMOLLM2_PROMPTS:
            prompt = apply_chat_template(tokenizer, [{"role": "user", "content": text}])
            out = quantized.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                                     do_sample=False, min_new_tokens=max_new_tokens)
            generated = out[0, len(prompt):].tolist()
            one = teacher_forced_fidelity(lambda ids: reference(torch.tensor([ids])).logits[0],
                                          prompt, generated)
            total = total + one
            print(f"{text[:40]!r:44} top-1 {one.top1:6.1%}  top-5 {one.top5:6.1%}  "
                  f"{tokenizer.decode(generated)[:60]!r}")
    print(f"int4 from Q4_1 (bf16 d, m + 8d) vs fp32 dequantized, {total.num_tokens} tokens: "
          f"top-1 {total.top1:.1%}, top-5 {total.top5:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", default="1,2,4,8,16,32,64")
    parser.add_argument("--smollm2", action="store_true")
    parser.add_argument("--variants", default="fp32,bf16,int8-fp32,int8-bf16,int4-g32,int4-g64,int4-g128")
    args = parser.parse_args()
    if args.smollm2:
        torch.set_grad_enabled(False)
        return smollm2(args.repeats)
    rows_list = [int(r) for r in args.rows.split(",")]
    kinds = args.variants.split(",")
    torch.set_grad_enabled(False)
    built = {kind: build(kind) for kind in kinds}
    inputs = {(r, d): [torch.randn(r, i).to(d) for _, i in LAYER_SHAPES]
              for r in rows_list for d in (torch.float32, torch.bfloat16)}
    step_times = {(k, r): [] for k in kinds for r in rows_list}
    head_times = {(k, r): [] for k in kinds for r in rows_list}

    def step(layers, xs):
        for layer in layers:
            for proj, x in zip(layer, xs):
                proj(x)

    for kind, (layers, head, dtype) in built.items():  # warm-up: first calls pick and pack kernels
        for r in rows_list:
            if layers:
                step(layers, inputs[r, dtype])
            if head:
                head(inputs[r, dtype][0])
    for _ in range(args.repeats):
        for r in rows_list:
            for kind, (layers, head, dtype) in built.items():
                xs = inputs[r, dtype]
                if layers:
                    step_times[kind, r].append(time_once(lambda: step(layers, xs)))
                if head:
                    head_times[kind, r].append(time_once(lambda: head(xs[0])))

    def ms(samples):
        return f"{statistics.median(samples) * 1e3:8.2f}" if samples else "     n/a"

    print(f"# CPU: {cpu_line()}; {torch.get_num_threads()} threads; torch {torch.__version__}; median of {args.repeats}")
    for title, table in (("30 layers x 4 projections (one decode step), ms", step_times),
                         (f"LM head {LM_HEAD[0]}x{LM_HEAD[1]}, ms", head_times)):
        print(f"\n{title}\n{'rows':>5} " + " ".join(f"{k:>9}" for k in kinds))
        for r in rows_list:
            print(f"{r:>5} " + " ".join(f"{ms(table[k, r]):>9}" for k in kinds))
        if "bf16" in kinds:
            print("crossover (fewest rows where bf16 beats it): " + ", ".join(
                f"{k} {next((r for r in rows_list if table[k, r] and statistics.median(table['bf16', r]) < statistics.median(table[k, r])), '>' + str(rows_list[-1]))}"
                for k in kinds if k.startswith("int") and table[k, rows_list[0]]))
    print("\nint4-g128 is n/a where in_features (576) is not a multiple of 128.")


if __name__ == "__main__":
    main()
