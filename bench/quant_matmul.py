"""GPU quantized projections: the Triton int4/int8 kernels against dequantize-then-matmul and bf16.

One "step" runs the four projections of each layer of SmolLM2-135M (fused qkv 960x576, o 576x576,
fused gate/up 3072x576, down 576x1536; 30 layers) or, with --model llama3-8b, of Llama-3-8B
(6144x4096, 4096x4096, 28672x4096, 4096x14336; 32 layers), every layer with its own weights so
the step streams them from memory as a decode step does. Activations are bf16. Variants:

- bf16: F.linear on a bf16 weight (cuBLAS);
- int4 / int8: engine/kernels/quant_matmul.py on the packed codes (what the quantized layers
  run on CUDA);
- int4-dequant / int8-dequant: the layers' fallback, the whole weight dequantized before F.linear.

Variants alternate inside each repeat; the table prints the median of the repeats (each itself
triton.testing.do_bench's median, or do_bench_cudagraph's with --cuda-graph, as decode runs
inside CUDA graphs), the ratio to bf16, and the weight bytes a step reads over its time. Each
variant's largest error against the float32 product on the dequantized weight is printed too.

    .venv/bin/python bench/quant_matmul.py [--model smollm2|llama3-8b] [--rows 1,32,2048]
        [--group-size 32] [--repeats 5] [--cuda-graph]
    .venv/bin/python bench/quant_matmul.py --device cpu --model tiny --rows 1,3 --repeats 1

--device cpu runs the kernels under Triton's interpreter (TRITON_INTERPRET=1): a smoke run of
this script (minutes at SmolLM2's shapes, seconds with --model tiny); its times are no GPU figures.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = {  # (layer shapes [out, in], layers)
    "smollm2": ([(960, 576), (576, 576), (3072, 576), (576, 1536)], 30),
    "llama3-8b": ([(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)], 32),
    "tiny": ([(96, 64), (64, 64), (256, 64), (64, 128)], 2),  # smoke runs (tests)
}
VARIANTS = ("bf16", "int4", "int4-dequant", "int8", "int8-dequant")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    p.add_argument("--rows", default="1,32,2048", help="comma-separated activation rows")
    p.add_argument("--group-size", type=int, default=32)
    p.add_argument("--layers", type=int, default=None, help="default: the model's")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cuda-graph", action="store_true", help="time each step as one CUDA graph")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    return p.parse_args()


def build_layers(torch, shapes, num_layers, group_size, device):
    """Per layer and projection: the bf16 weight, the int4 pack and the int8 pack."""
    from engine.quantization.int4 import pack_codes, quantize_int4
    from engine.quantization.int8 import quantize_int8

    layers = []
    for layer in range(num_layers):
        projections = []
        for n, k in shapes:
            gen = torch.Generator(device).manual_seed(layer * 1009 + n * 7 + k)
            weight = torch.randn(n, k, generator=gen, device=device) * 0.02  # built in place
            codes, scales, zeros = quantize_int4(weight, group_size)
            q, q_scales = quantize_int8(weight)
            projections.append(dict(
                bf16=weight.to(torch.bfloat16), packed=pack_codes(codes),
                scales_and_zeros=torch.stack([scales.t(), zeros.t()], -1).contiguous(),
                q=q, q_scales=q_scales.to(torch.bfloat16)))
        layers.append(projections)
    return layers


def step_fn(torch, variant, layers, xs, group_size):
    """A callable that runs every projection of every layer once with ``variant``."""
    import torch.nn.functional as F

    from engine.kernels.quant_matmul import int4_matmul, int8_matmul
    from engine.quantization.int4 import dequantize_int4, unpack_codes

    def one(p, x):
        if variant == "bf16":
            return F.linear(x, p["bf16"])
        if variant == "int4":
            return int4_matmul(x, p["packed"], p["scales_and_zeros"], group_size)
        if variant == "int4-dequant":  # Int4WeightOnlyLinear's fallback off the CPU
            sz = p["scales_and_zeros"]
            w = dequantize_int4(unpack_codes(p["packed"]), sz[..., 0].t(), sz[..., 1].t(), group_size)
            return F.linear(x, w.to(x.dtype))
        if variant == "int8":
            return int8_matmul(x, p["q"], p["q_scales"])
        return F.linear(x, p["q"].to(x.dtype)) * p["q_scales"]  # Int8WeightOnlyLinear's fallback

    def run():
        return [one(p, x) for projections in layers for p, x in zip(projections, xs)]

    return run


def max_errors(torch, layers, xs, group_size) -> dict[str, float]:
    """Each variant's largest |y - y_ref| / max |y_ref| on layer 0 against float32 products."""
    from engine.quantization.int4 import dequantize_int4, unpack_codes

    out = {}
    for variant in VARIANTS:
        ys = step_fn(torch, variant, layers[:1], xs, group_size)()
        worst = 0.0
        for p, x, y in zip(layers[0], xs, ys):
            if variant.startswith("int4"):
                sz = p["scales_and_zeros"]
                w = dequantize_int4(unpack_codes(p["packed"]), sz[..., 0].t(), sz[..., 1].t(),
                                    group_size)
            elif variant.startswith("int8"):
                w = p["q"].float() * p["q_scales"].float()[:, None]
            else:
                w = p["bf16"].float()
            ref = x.float() @ w.t()
            worst = max(worst, ((y.float() - ref).abs().max() / ref.abs().max()).item())
        out[variant] = worst
    return out


def time_ms(torch, fn, device, cuda_graph: bool) -> float:
    if device == "cuda":
        import triton.testing

        if cuda_graph:
            return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    fn()
    start = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - start)


def weight_bytes(variant: str, shapes, num_layers: int, group_size: int) -> float:
    """Bytes of weight a step reads in ``variant`` (the dequant variants read codes, write and read
    a float32 and a bf16 copy; counted as codes only, the least they could read)."""
    numel = sum(n * k for n, k in shapes) * num_layers
    if variant == "bf16":
        return 2 * numel
    if variant.startswith("int4"):
        return numel / 2 + numel / group_size * 4  # nibbles + a bf16 (scale, zero) pair a group
    return numel + sum(n for n, _ in shapes) * num_layers * 2  # int8 codes + bf16 scales


def main() -> None:
    args = parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU, or --device cpu for an interpreter smoke run")
    shapes, default_layers = MODELS[args.model]
    num_layers = args.layers or default_layers
    rows_list = [int(r) for r in args.rows.split(",")]
    where = (torch.cuda.get_device_name() if args.device == "cuda"
             else "CPU under TRITON_INTERPRET=1 (no GPU figures)")
    print(f"# {args.model}, {num_layers} layers x 4 projections, bf16 activations, int4 group "
          f"{args.group_size}; {where}; torch {torch.__version__}")
    if args.device == "cuda":
        from engine.quantization.gpu_matmul import runs_triton_kernels

        print(f"# quantized layers take the kernels here: {runs_triton_kernels(torch.device('cuda'))}")
    layers = build_layers(torch, shapes, num_layers, args.group_size, args.device)
    print("| rows | variant | step ms (median) | / bf16 | weight GB/s | max rel. error |")
    print("|---|---|---|---|---|---|")
    for rows in rows_list:
        gen = torch.Generator().manual_seed(rows)
        xs = [torch.randn(rows, k, generator=gen).to(torch.bfloat16).to(args.device)
              for _, k in shapes]
        errors = max_errors(torch, layers, xs, args.group_size)
        fns = {v: step_fn(torch, v, layers, xs, args.group_size) for v in VARIANTS}
        times = {v: [] for v in VARIANTS}
        for _ in range(args.repeats):
            for v in VARIANTS:  # alternated, so drift moves every column alike
                times[v].append(time_ms(torch, fns[v], args.device, args.cuda_graph))
        base = statistics.median(times["bf16"])
        for v in VARIANTS:
            ms = statistics.median(times[v])
            gbs = weight_bytes(v, shapes, num_layers, args.group_size) / ms / 1e6
            print(f"| {rows} | {v} | {ms:.3f} | {ms / base:.2f} | {gbs:.0f} | {errors[v]:.1e} |")


if __name__ == "__main__":
    main()
