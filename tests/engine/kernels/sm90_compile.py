"""Compile every kernel for an H200 (sm_90) down to a cubin, with no GPU needed.

Run as a script (never with TRITON_INTERPRET set): the interpreter accepts programs the
compiler rejects (loop-carried type changes, dot shapes, ...), so this catches them on CPU.
Tile constants come from the kernel modules; the model shapes are SmolLM2 (9 heads, 3 KV heads,
head_dim 64) and Llama-3-8B (32 heads, 8 KV heads, head_dim 128), in bfloat16.
"""

import os

assert os.environ.get("TRITON_INTERPRET", "0") == "0", "run without TRITON_INTERPRET"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from engine.kernels import activation, cache, layernorm, quant_matmul, rotary  # noqa: E402
from engine.kernels import attention_decode as decode  # noqa: E402
from engine.kernels import attention_prefill as prefill  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
DT = "bf16"
MODELS = [dict(heads=9, kv_heads=3, head_dim=64), dict(heads=32, kv_heads=8, head_dim=128)]


def compile_kernel(kernel, pointers: dict, constexprs: dict, num_warps: int = 4) -> None:
    """pointers: {arg: element type}; other non-constexpr args are i32, except the fp32 scales."""
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = "*" + pointers[name]
        else:
            signature[name] = "fp32" if name in ("qk_scale", "eps") else "i32"
    triton.compile(ASTSource(kernel, signature, constexprs), target=TARGET,
                   options={"num_warps": num_warps})
    print(f"compiled {kernel.__name__} {constexprs}", flush=True)


def main() -> None:
    scale_ptrs = dict(k_scale_ptr="fp32", v_scale_ptr="fp32")  # an 8-bit KV cache's scales
    # (cache element type, QUANT): the float cache, and int8 / fp8 e4m3 codes with scales
    caches = ((DT, False), ("i8", True), ("fp8e4nv", True))
    for m in MODELS:
        group, head_dim = m["heads"] // m["kv_heads"], m["head_dim"]
        for cache_dt, quant in caches:
            compile_kernel(cache._reshape_and_cache_kernel,
                           dict(scale_ptrs, key_ptr=DT, value_ptr=DT, k_cache_ptr=cache_dt,
                                v_cache_ptr=cache_dt, slot_mapping_ptr="i64"),
                           dict(NUM_KV_HEADS=m["kv_heads"], HEAD_DIM=head_dim, BLOCK_SIZE=16,
                                BLOCK_H=triton.next_power_of_2(m["kv_heads"]), BLOCK_D=head_dim,
                                QUANT=quant, IS_INT8=cache_dt == "i8",
                                QMAX=127.0 if cache_dt == "i8" else 448.0, MIN_SCALE=1e-12))
        for cache_dt, quant in caches:
            attention_ptrs = dict(scale_ptrs, q_ptr=DT, k_cache_ptr=cache_dt, v_cache_ptr=cache_dt,
                                  out_ptr=DT, block_tables_ptr="i32", context_lens_ptr="i32")
            for is_split in (False, True):
                compile_kernel(decode._decode_split_kernel,
                               dict(attention_ptrs, part_out_ptr="fp32", part_lse_ptr="fp32"),
                               dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_H=16,
                                    BLOCK_SIZE=16, BLOCK_N=decode.BLOCK_N, IS_SPLIT=is_split,
                                    DOT_UPCAST=False, DOT_PRECISION="tf32", QUANT=quant))
            compile_kernel(prefill._prefill_kernel, dict(attention_ptrs, cu_query_lens_ptr="i32"),
                           dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_D=head_dim,
                                BLOCK_M=prefill.BLOCK_M, BLOCK_Q=prefill.BLOCK_M // group,
                                BLOCK_SIZE=16, BLOCK_N=prefill.BLOCK_N, DOT_UPCAST=False,
                                DOT_PRECISION="tf32", QUANT=quant))
        compile_kernel(decode._decode_reduce_kernel,
                       dict(part_out_ptr="fp32", part_lse_ptr="fp32", out_ptr=DT),
                       dict(HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_S=decode.MAX_SPLITS))
        compile_kernel(rotary._rotary_kernel,
                       dict(positions_ptr="i64", q_ptr=DT, k_ptr=DT, cos_sin_ptr="fp32"),
                       dict(NUM_HEADS=m["heads"], NUM_KV_HEADS=m["kv_heads"], HALF=head_dim // 2,
                            BLOCK_H=triton.next_power_of_2(m["heads"]),
                            BLOCK_KVH=triton.next_power_of_2(m["kv_heads"]),
                            BLOCK_HALF=head_dim // 2))
    for has_residual in (False, True):
        compile_kernel(layernorm._rms_norm_kernel,
                       dict(x_ptr=DT, residual_ptr=DT, weight_ptr=DT, out_ptr=DT,
                            new_residual_ptr=DT),
                       dict(D=4096, BLOCK_D=4096, HAS_RESIDUAL=has_residual), num_warps=16)
    compile_kernel(activation._silu_and_mul_kernel, dict(x_ptr=DT, out_ptr=DT),
                   dict(BLOCK=activation.BLOCK_I))
    for rows in (1, 2048):  # the decode and the prefill tiles
        block_m, block_n, block_k, num_warps = quant_matmul._blocks(rows)
        tiles = dict(BLOCK_M=block_m, BLOCK_N=block_n, DOT_UPCAST=False, DOT_PRECISION="tf32")
        compile_kernel(quant_matmul._int4_matmul_kernel,
                       dict(x_ptr=DT, w_ptr="u8", sz_ptr=DT, bias_ptr=DT, out_ptr=DT),
                       dict(tiles, GROUP_SIZE=32, HAS_BIAS=False, BLOCK_K=min(32, block_k)),
                       num_warps)
        compile_kernel(quant_matmul._int8_matmul_kernel,
                       dict(x_ptr=DT, w_ptr="i8", scales_ptr=DT, bias_ptr=DT, out_ptr=DT),
                       dict(tiles, HAS_BIAS=True, BLOCK_K=block_k), num_warps)


if __name__ == "__main__":
    main()
