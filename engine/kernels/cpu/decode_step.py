"""The fused decode step of the native library (decode_step.c): a Llama-family decode step, every
layer in one native call.

The caller (engine/models/fused_decode.py) describes the model once, ``Layer`` structs of
pointers into its own tensors (which must stay alive and in place), and calls the library's
``pagoda_decode_step`` per step (signatures: native.py).
"""

from __future__ import annotations

import ctypes

from engine.kernels.cpu import native
from engine.kernels.cpu.native import Layer, Proj, Shape  # noqa: F401 - the structs the caller fills

MAX_HEAD_DIM, MAX_BLOCK_SIZE = 512, 256  # stack buffers of attention.c and decode_step.c


def library() -> ctypes.CDLL | None:
    """The native library (the products' own: one library, one set of switches), None where its
    step does not run here."""
    lib = native.library()
    if lib is None or (lib.pagoda_decode_max_head_dim(), lib.pagoda_decode_max_block_size()) != (
            MAX_HEAD_DIM, MAX_BLOCK_SIZE):  # (0, 0): built without AVX2/FMA/F16C
        return None
    return lib
