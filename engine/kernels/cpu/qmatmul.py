"""int4 and int8 weights x int8-quantized activations on the CPU (qmatmul.c): llama.cpp's Q4_1 and
Q8_0 times Q8_0.

torch's int4 CPU kernel reads bf16 activations and converts every weight to bf16 before the
product; its int8 one rounds its output to the activation dtype. These kernels quantize each
activation row per block of 32 to int8 (one scale a block) and multiply integer codes with VNNI's
u8 x s8 dot products (AVX512-VNNI or AVX-VNNI; AVX2's maddubs otherwise), G output rows a vector:
a quarter of the instructions per weight, and the same code serves one row (decode) and thousands
(prefill). Their cost in fidelity is the activation rounding llama.cpp pays.

Layouts (G = rows_per_group()):
- int4 (``pack_int4``): nibbles uint8 [N / G, K / 32, 4, G, 4], d and m fp16 [N / G, K / 32, G]
  with w = d q + m, so GGUF's Q4_1 (and Q4_0: m = -8 d) blocks load without rounding their scales.
- int8 (``pack_int8``): q + 128 uint8 [N / G, K / 32, 8, G, 4], d fp16 [N / G, K / 32, G], w = d q:
  Q8_0's own blocks.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from engine.kernels.cpu import native

BLOCK = 32
DTYPES = (torch.float32, torch.bfloat16)  # activations and outputs the kernels read and write
ISA_NAMES = {1: "avx2", 2: "avx-vnni", 3: "avx512", 4: "avx512-vnni"}
_FP16_MAX = 65504.0
_local = threading.local()


def library() -> ctypes.CDLL | None:
    """The compiled kernels (native.library(): the fused decode step's library too), None when
    they cannot run here (no compiler, no AVX2/FMA/F16C, off)."""
    return native.library()


def isa() -> str | None:
    """Which instruction path the kernels were compiled with ("+amx": whole 16-row tiles take AMX's
    tile products), None when they are not usable."""
    lib = library()
    return None if lib is None else ISA_NAMES[lib.pagoda_q4_isa()] + ("+amx" if lib.pagoda_q4_amx() else "")


def rows_per_group(lib: ctypes.CDLL | None = None) -> int:
    """Output rows the kernels take at a time (one vector lane each): 16 with AVX-512, 8 with AVX2."""
    return (lib or library()).pagoda_q4_rows_per_group()


def supports(out_features: int, in_features: int) -> bool:
    """Whether the kernels are usable here and take a weight [out_features, in_features]."""
    return library() is not None and in_features % BLOCK == 0 and out_features % rows_per_group() == 0


def _fp16(v: torch.Tensor, what: str) -> torch.Tensor:
    if not v.abs().max() <= _FP16_MAX:
        raise ValueError(f"an {what} is outside fp16's range")
    return v.to(torch.float16)


def _by_group(v: torch.Tensor, g: int) -> torch.Tensor:
    """[N, K / 32] -> [N / G, K / 32, G]."""
    n, nb = v.shape
    return v.reshape(n // g, g, nb).transpose(1, 2).contiguous()


def _check(n: int, k: int, g: int, group_size: int = BLOCK) -> None:
    if group_size % BLOCK or k % group_size or n % g:
        raise ValueError(f"the CPU kernels need group_size a multiple of {BLOCK} dividing in_features "
                         f"({k}) and out_features ({n}) a multiple of {g}")


def pack_int4(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
              rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain codes uint8 [N, K] (0..15) with scales and zeros [N, K / group] (w = (q - 8) s + z)
    -> (nibbles, d, m) in the int4 layout, G = ``rows`` (default rows_per_group()); byte t of row j
    in slice s holds column 4 s + t low and 16 + 4 s + t high. ValueError when a scale or minimum
    is beyond fp16's range."""
    n, k = codes.shape
    g = rows or rows_per_group()
    _check(n, k, g, group_size)
    per, nb = group_size // BLOCK, k // BLOCK
    s = scales.float().repeat_interleave(per, dim=1)  # [N, K / 32]
    m = zeros.float().repeat_interleave(per, dim=1) - 8 * s
    c = codes.to(torch.uint8).reshape(n // g, g, nb, 2, 4, 4)  # column 32 b + 16 h + 4 s + t
    nibbles = (c[:, :, :, 0] | (c[:, :, :, 1] << 4)).permute(0, 2, 3, 1, 4)  # [N/G, nb, s, G, t]
    return (nibbles.contiguous(), _by_group(_fp16(s, "int4 scale"), g),
            _by_group(_fp16(m, "int4 minimum"), g))


def unpack_int4(nibbles: torch.Tensor, d: torch.Tensor, m: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of pack_int4: (codes uint8 [N, K], d float32 [N, K / 32], m float32 [N, K / 32])."""
    groups, nb, _, g, _ = nibbles.shape
    lo, hi = (nibbles & 0x0F), (nibbles >> 4)  # [N/G, nb, s, G, t]
    codes = torch.stack([lo, hi], dim=2).permute(0, 4, 1, 2, 3, 5).reshape(groups * g, nb * BLOCK)
    return codes, _flat(d), _flat(m)


def _flat(v: torch.Tensor) -> torch.Tensor:
    groups, nb, g = v.shape
    return v.float().transpose(1, 2).reshape(groups * g, nb)


def quantize_int8_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] float -> (q int8 [N, K] in -127..127, d float32 [N, K / 32]), Q8_0's rounding:
    d = max |w| / 127 per block of 32 (stored in fp16, so q is chosen against the fp16 d)."""
    n, k = weight.shape
    blocks = weight.detach().float().reshape(n, k // BLOCK, BLOCK)
    d = (blocks.abs().amax(dim=-1) / 127).to(torch.float16).float()
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv[..., None]).clamp(-127, 127).to(torch.int8)
    return q.reshape(n, k), d


PACK_CHUNK_ROWS = 8192


def pack_int8(q: torch.Tensor, d: torch.Tensor, rows: int | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """q int8 [N, K] with d [N, K / 32] (w = d q) -> (q + 128 uint8 [N / G, K / 32, 8, G, 4], d fp16)."""
    n, k = q.shape
    g = rows or rows_per_group()
    _check(n, k, g)
    packed = torch.empty(n // g, k // BLOCK, 8, g, 4, dtype=torch.uint8)
    step = max(1, PACK_CHUNK_ROWS // g)  # groups a chunk: no whole-matrix temporaries (Gemma 3's
    for start in range(0, n // g, step):  # vocabulary took 0.9 GB of int16 ones at load)
        rows_q = q[start * g:(start + step) * g].view(torch.uint8) ^ 0x80  # q + 128, in 8 bits
        packed[start:start + step] = rows_q.reshape(-1, g, k // BLOCK, 8, 4).permute(0, 2, 3, 1, 4)
    return packed, _by_group(_fp16(d.float(), "int8 scale"), g)


def unpack_int8(packed: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of pack_int8: (q int8 [N, K], d float32 [N, K / 32])."""
    groups, nb, _, g, _ = packed.shape
    q = (packed.permute(0, 3, 1, 2, 4).reshape(groups * g, nb * BLOCK).to(torch.int16) - 128)
    return q.to(torch.int8), _flat(d)


def _scratch_bytes(rows: int, k: int) -> int:
    """qmatmul.c's pagoda_q4_scratch_bytes: row_bytes a row (codes, then a scale and a sum per
    block, 64-byte aligned)."""
    return rows * ((k + k // BLOCK * 8 + 63) // 64 * 64)


def _scratch(nbytes: int) -> int:
    """Address of this thread's scratch area of at least ``nbytes`` (grown geometrically)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.numel() < nbytes:
        size = max(nbytes, 0 if buf is None else 2 * buf.numel())
        buf = _local.buf = torch.empty(size, dtype=torch.uint8)  # 64-byte aligned (c10's CPU allocator)
    return buf.data_ptr()


def _call(fn, x: torch.Tensor, w: int, d: int, m: int | None, n: int, bias, out_dtype,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """One kernel call; kept lean, it runs ~120 times a decode step. ``out``: the [M, N] tensor
    to write (contiguous, out_dtype), instead of a new one."""
    rows, k = x.shape
    if x.stride(1) != 1 or not (x.dtype is torch.bfloat16 or x.dtype is torch.float32):
        raise ValueError("the CPU kernels take fp32 or bf16 activations with contiguous rows")
    out_dtype = out_dtype or x.dtype
    if out is not None and (out.shape != (rows, n) or out.dtype != out_dtype or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous {out_dtype} [{rows}, {n}], not {out.dtype} {tuple(out.shape)}")
    y = torch.empty(rows, n, dtype=out_dtype) if out is None else out
    if rows == 0:
        return y
    scratch = _scratch(_scratch_bytes(rows, k))
    args = [x.data_ptr(), rows, k, x.stride(0), x.dtype is torch.bfloat16, w, d]
    if m is not None:
        args.append(m)
    fn(*args, n, None if bias is None else bias.data_ptr(), y.data_ptr(), n,
       out_dtype is torch.bfloat16, scratch, torch.get_num_threads())
    return y


def int4_matmul(x: torch.Tensor, nibbles: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
                bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """x [M, K] fp32 or bf16 (rows contiguous) -> y [M, N] (out_dtype, default x's); bias fp32 [N]
    or None; ``lib``: another build of the kernels (tests), declared with ``native.declare``."""
    return _call((lib or library()).pagoda_q4_matmul, x, nibbles.data_ptr(), d.data_ptr(),
                 m.data_ptr(), nibbles.shape[0] * nibbles.shape[3], bias, out_dtype)


def int8_matmul(x: torch.Tensor, packed: torch.Tensor, d: torch.Tensor,
                bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                lib: ctypes.CDLL | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """int4_matmul's contract for int8 weights (pack_int8); ``out``: _call's."""
    return _call((lib or library()).pagoda_q8_matmul, x, packed.data_ptr(), d.data_ptr(), None,
                 packed.shape[0] * packed.shape[3], bias, out_dtype, out)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch form of the kernels' activation rounding: x [M, K] -> codes float64 [M, K]
    (integers in -127..127), scales float32 [M, K / 32] (max |a| / 127 per block)."""
    rows, k = x.shape
    blocks = x.float().reshape(rows, k // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1)  # [M, K / 32]
    # the kernel's float32 operations, each correctly rounded (torch's own float32 division may
    # take another route and land an ulp away, which flips a code at a tie)
    inv = torch.where(amax > 0, (127.0 / amax.double()).float(), torch.zeros_like(amax))
    scaled = (blocks.double() * inv.double()[..., None]).float()  # exact product, rounded once
    q = torch.round(scaled)  # torch.round: half to even, as the kernel's cvtps
    return q.reshape(rows, k).double(), (amax.double() / 127.0).float()


def reference(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """What the kernels compute, in float64 from the same rounded activations (plain torch), for
    weights w = d q + m per block (codes [N, K] as integers, d and m [N, K / 32]; m None: 0):
    sum_b d_b sa_b (q_b . qa_b) + m_b sa_b sum(qa_b) (+ bias), returned as float32 [M, N]."""
    rows, k = x.shape
    qa, sa = quantize_activations(x)
    qa = qa.reshape(rows, k // BLOCK, BLOCK)
    dots = torch.einsum("rbi,nbi->rnb", qa, codes.double().reshape(codes.shape[0], -1, BLOCK))  # exact
    sa = sa.double()
    y = (dots * (d.double()[None] * sa[:, None])).sum(-1)
    if m is not None:
        y = y + (m.double()[None] * (sa * qa.sum(-1))[:, None]).sum(-1)
    if bias is not None:
        y = y + bias.double()
    return y.float()
