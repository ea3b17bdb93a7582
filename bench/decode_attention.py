"""One decode token's attention over a lone stream's long context, bf16, on the CPU path:
the gathered blocks through masked scaled_dot_product_attention (the general path) against
_decode_long_run (one GEMM of every query head against the K rows), per layer, side by side.

    .venv/bin/python bench/decode_attention.py [--lengths 800 1500 3000 5000] [--threads 1 2]

SmolLM2's shape by default (9 query heads, 3 KV heads, head size 64, blocks of 16 tokens in a
random order, as a prefix-cached conversation's are).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from engine.layers.attention_metadata import DecodeGroup  # noqa: E402
from engine.layers import attention, kv_access  # noqa: E402
from engine.layers.attention import PagedAttention, Workspace  # noqa: E402


def _per_call_us(fn, calls: int = 100) -> float:
    for _ in range(10):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[800, 1500, 3000, 5000])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    d, bs, pool_blocks = 64, 16, 1024
    attn = PagedAttention(args.heads, args.kv_heads, d)
    k_cache, v_cache = torch.randn(2, pool_blocks, bs, args.kv_heads, d, dtype=torch.bfloat16).unbind(0)
    workspace = Workspace(torch.device("cpu"))
    pool = kv_access.pool_access((k_cache, v_cache), torch.bfloat16)
    threshold = attention.LONG_DECODE_CONTEXT
    print(f"{'threads':>7}{'tokens':>8}{'gathered SDPA us':>18}{'long-run GEMM us':>18}{'speed-up':>10}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for length in args.lengths:
            blocks = -(-length // bs)
            ids = torch.randperm(pool_blocks)[:blocks]
            mask = (torch.arange(blocks * bs) < length)[None, None, None, :]
            group = DecodeGroup(0, 1, ids, mask, None, length)
            q = torch.randn(1, args.heads, d, dtype=torch.bfloat16)

            def step():
                return attn._decode(q, pool, group, workspace)

            timings = {"sdpa": [], "gemm": []}
            for _ in range(args.repeats):  # alternated
                for name, cutoff in (("sdpa", 1 << 30), ("gemm", 0)):
                    attention.LONG_DECODE_CONTEXT = cutoff
                    timings[name].append(_per_call_us(step))
            attention.LONG_DECODE_CONTEXT = threshold
            sdpa, gemm = (statistics.median(timings[n]) for n in ("sdpa", "gemm"))
            print(f"{threads:>7}{length:>8}{sdpa:>18.1f}{gemm:>18.1f}{sdpa / gemm:>9.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
