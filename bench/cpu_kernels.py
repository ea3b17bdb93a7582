"""The engine's own CPU kernels (engine/kernels/cpu/qmatmul.py) against torch's, side by side.

int4: one "step" runs SmolLM2-135M's four projections of each of its 30 layers (fused qkv 960x576,
o 576x576, fused gate/up 3072x576, down 576x1536) with bf16 activations, every layer with its own
random codes and scales, so a step streams the whole model from memory as a real decode step does;
against torch's int4 kernel. int8: the LM head (49152x576), against torch's per-channel int8
kernel and the bf16 GEMM. Kernels alternate inside each repeat; the table prints medians and ratios.

    .venv/bin/python bench/cpu_kernels.py [--rows 1,4,8,16,32,64,256] [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.machine import cpu_line  # noqa: E402
from engine.kernels.cpu import qmatmul  # noqa: E402
from engine.quantization.int8 import quantize_int8  # noqa: E402

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in) of one layer


def _layers(num_layers: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(num_layers):
        for n, k in SHAPES:
            codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
            scales = torch.rand(n, k // 32, generator=gen) * 0.01
            zeros = torch.randn(n, k // 32, generator=gen) * 0.01
            layers.append({
                "k": k, "q4": qmatmul.pack_int4(codes, scales, zeros, 32),
                "torch": torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1),
                "sz": torch.stack([scales.t(), zeros.t()], dim=-1).to(torch.bfloat16).contiguous()})
    return layers


def _step(layers: list[dict], inputs: dict, kernel: str) -> None:
    for layer in layers:
        x = inputs[layer["k"]]
        if kernel == "q4":
            qmatmul.int4_matmul(x, *layer["q4"])
        else:
            torch.ops.aten._weight_int4pack_mm_for_cpu(x, layer["torch"], 32, layer["sz"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4,8,16,32,64,256")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if qmatmul.library() is None:
        sys.exit("the native kernel is not available here (no C compiler, no AVX2/FMA/F16C, or "
                 "PAGODA_NATIVE_KERNELS=0)")
    print(f"{cpu_line()}; {torch.get_num_threads()} threads; native kernel path: {qmatmul.isa()}")
    layers = _layers(args.layers)
    gen = torch.Generator().manual_seed(1)
    head = (torch.randn(49152, 576, generator=gen) * 0.05).bfloat16()
    head_q8 = qmatmul.pack_int8(*qmatmul.quantize_int8_blocks(head))
    q, s = quantize_int8(head)
    head_int8 = (q, s.bfloat16())
    print(f"{'rows':>5} | {'int4: ours':>10} {'torch':>8} {'ratio':>6} | {'LM head: ours':>13} "
          f"{'torch int8':>10} {'ratio':>6} {'bf16 GEMM':>9} {'ratio':>6}   (ms)")
    for rows in (int(r) for r in args.rows.split(",")):
        inputs = {k: torch.randn(rows, k, dtype=torch.bfloat16) for k in {k for _, k in SHAPES}}
        x = inputs[576]
        cases = {
            "q4": lambda: _step(layers, inputs, "q4"),
            "torch4": lambda: _step(layers, inputs, "torch"),
            "q8": lambda: qmatmul.int8_matmul(x, *head_q8, out_dtype=torch.float32),
            "torch8": lambda: torch._weight_int8pack_mm(x, *head_int8),
            "bf16": lambda: torch.nn.functional.linear(x, head),
        }
        reps = max(1, 64 // rows)
        times = {name: [] for name in cases}
        for _ in range(args.repeats):
            for name, fn in cases.items():
                fn()  # warm
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                times[name].append((time.perf_counter() - t0) / reps * 1e3)
        t = {name: statistics.median(v) for name, v in times.items()}
        print(f"{rows:>5} | {t['q4']:>10.2f} {t['torch4']:>8.2f} {t['torch4'] / t['q4']:>5.2f}x | "
              f"{t['q8']:>13.2f} {t['torch8']:>10.2f} {t['torch8'] / t['q8']:>5.2f}x "
              f"{t['bf16']:>9.2f} {t['bf16'] / t['q8']:>5.2f}x", flush=True)


if __name__ == "__main__":
    main()
