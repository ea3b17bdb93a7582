"""ctypes binding of decode_step.c: a Llama-family decode step, every layer in one native call.

The caller (engine/models/fused_decode.py) describes the model once, ``Layer`` structs of
pointers into its own tensors (which must stay alive and in place), and calls ``run`` per step.
"""

from __future__ import annotations

import ctypes

from engine.kernels.cpu import build, qmatmul

_p, _i64, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_state: dict[str, object] = {}
MAX_HEAD_DIM, MAX_BLOCK_SIZE = 512, 256  # decode_step.c's stack buffers


class Proj(ctypes.Structure):
    """One projection in qmatmul.c's layout: bits 4 (nibbles, d, m) or 8 (q + 128, d, m NULL)."""
    _fields_ = [("bits", _i64), ("w", _p), ("d", _p), ("m", _p), ("bias", _p), ("n", _i64)]


class Layer(ctypes.Structure):
    _fields_ = [("in_norm", _p), ("post_norm", _p), ("qkv", Proj), ("o", Proj), ("gate_up", Proj),
                ("down", Proj), ("k_cache", _p), ("v_cache", _p)]


class Shape(ctypes.Structure):
    _fields_ = [("hidden", _i64), ("heads", _i64), ("kv_heads", _i64), ("head_dim", _i64),
                ("inter", _i64), ("block_size", _i64), ("table_width", _i64), ("eps", _f32),
                ("scale", _f32), ("kv_bf16", _i64), ("num_threads", _i64)]


def library() -> ctypes.CDLL | None:
    """The compiled step (it includes qmatmul.c), None where the native kernels do not run."""
    if "lib" not in _state:
        lib = build.load("decode_step") if qmatmul.library() is not None else None
        if lib is not None:
            ref = ctypes.POINTER
            lib.pagoda_decode_max_head_dim.restype = _i64
            lib.pagoda_decode_max_block_size.restype = _i64
            lib.pagoda_decode_work_floats.argtypes = [ref(Shape), _i64]
            lib.pagoda_decode_work_floats.restype = _i64
            lib.pagoda_decode_scratch_bytes.argtypes = [ref(Shape), _i64]
            lib.pagoda_decode_scratch_bytes.restype = _i64
            lib.pagoda_decode_step.argtypes = [
                _p, _i64, _p, ref(Shape), _i64, _p, _i64, _p, _p, _p, _p, _p, _p, _i64, _p, _p]
            lib.pagoda_decode_step.restype = None
            if (lib.pagoda_decode_max_head_dim(), lib.pagoda_decode_max_block_size()) != (
                    MAX_HEAD_DIM, MAX_BLOCK_SIZE):  # (0, 0): built without AVX2/FMA/F16C
                lib = None
        _state["lib"] = lib
    return _state["lib"]
