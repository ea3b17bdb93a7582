"""The engine's CPU kernels as one native library (every .c beside this file, ``pagoda_kernels.h``):
loaded once, its entry points' ctypes signatures declared from the one table below, its switches
set once for every caller (the products of qmatmul.py and the fused step of decode_step.py are
the same library, so ``PAGODA_AMX=0`` reaches both).

A signature that disagrees with the C prototype passes wrong values or crashes the process;
tests/engine/kernels/test_cpu_native_library.py parses the header and compares it with
``SIGNATURES`` and the structs here.
"""

from __future__ import annotations

import ctypes

from engine.kernels.cpu import build

_p, _i32, _i64, _f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
_state: dict[str, object] = {}


class Proj(ctypes.Structure):
    """pg_proj: one projection in qmatmul.c's layout, bits 4 (nibbles, d, m) or 8 (q + 128, d, m NULL)."""
    _fields_ = [("bits", _i64), ("w", _p), ("d", _p), ("m", _p), ("bias", _p), ("n", _i64)]


class Layer(ctypes.Structure):
    """pg_layer: a decoder layer's norms, projections, K/V pool, RoPE table and window."""
    _fields_ = [("in_norm", _p), ("post_norm", _p), ("qkv", Proj), ("o", Proj), ("gate_up", Proj),
                ("down", Proj), ("k_cache", _p), ("v_cache", _p), ("q_norm", _p), ("k_norm", _p),
                ("attn_out_norm", _p), ("mlp_out_norm", _p), ("cos_sin", _p), ("window", _i64)]


class Shape(ctypes.Structure):
    """pg_shape: the model's sizes and the step's table width and threads."""
    _fields_ = [("hidden", _i64), ("heads", _i64), ("kv_heads", _i64), ("head_dim", _i64),
                ("inter", _i64), ("block_size", _i64), ("table_width", _i64), ("eps", _f32),
                ("scale", _f32), ("kv_bf16", _i64), ("num_threads", _i64),
                ("bf16_products", _i64), ("gelu", _i64)]


_ref = ctypes.POINTER
# name: (argtypes, restype), as pagoda_kernels.h declares them
SIGNATURES: dict[str, tuple[list, type | None]] = {
    "pagoda_q4_isa": ([], _i32),
    "pagoda_q4_set_amx": ([_i32], _i32),
    "pagoda_q4_amx": ([], _i32),
    "pagoda_q4_rows_per_group": ([], _i32),
    "pagoda_q4_scratch_bytes": ([_i64, _i64], _i64),
    "pagoda_q4_matmul": ([_p, _i64, _i64, _i64, _i32, _p, _p, _p, _i64, _p, _p, _i64, _i32, _p, _i32], None),
    "pagoda_q8_matmul": ([_p, _i64, _i64, _i64, _i32, _p, _p, _i64, _p, _p, _i64, _i32, _p, _i32], None),
    "pagoda_decode_max_head_dim": ([], _i64),
    "pagoda_attention_bf16_products": ([], _i32),
    "pagoda_decode_max_block_size": ([], _i64),
    "pagoda_decode_work_floats": ([_ref(Shape), _i64], _i64),
    "pagoda_decode_scratch_bytes": ([_ref(Shape), _i64], _i64),
    "pagoda_decode_step": ([_ref(Layer), _i64, _p, _ref(Shape), _i64, _p, _i64, _p, _p, _p, _p, _p, _p,
                            _p, _i64, _p, _p], None),
    "pagoda_decode_layers": ([_ref(Layer), _i64, _p, _ref(Shape), _i64, _p, _i64, _p, _p, _p, _p, _p, _p,
                              _p, _i64, _p, _p, _i64, _i64], None),
    "pagoda_embed_int8": ([_p, _p, _i64, _i64, _i64, _p, _i64, _p, _i64], _i64),
    "pagoda_argmax_rows": ([_p, _i64, _i64, _i64, _p, _i64], None),
}


def declare(lib: ctypes.CDLL, names=SIGNATURES) -> ctypes.CDLL:
    """Set the C signatures of ``names`` (default: every entry point) on a loaded build."""
    for name in names:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = SIGNATURES[name]
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled kernels, declared, None when they cannot run here (no compiler, no
    AVX2/FMA/F16C, PAGODA_NATIVE_KERNELS=0). ``PAGODA_AMX=0`` keeps every product of it, the fused
    step's included, on the VNNI tiles (the same bits; for A/B runs)."""
    if "lib" not in _state:
        lib = build.load()
        if lib is not None:
            declare(lib)
            if lib.pagoda_q4_isa() == 0:
                lib = None
            elif not build.env_switch("PAGODA_AMX"):
                lib.pagoda_q4_set_amx(0)
        _state["lib"] = lib
    return _state["lib"]
