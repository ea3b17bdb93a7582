"""Group-wise asymmetric int4 weight-only linear layers.

A weight [out, in] is cut into groups of ``group_size`` consecutive input columns; each group of
each row has a scale s and a zero point z, and a 4-bit code q in 0..15 stands for

    w = (q - 8) * s + z

On the CPU the product runs in the engine's own kernel where it builds (engine/kernels/cpu/qmatmul.py:
the codes times int8-rounded activations with VNNI dot products, fp16 d = s and m = z - 8 s per
32 columns, 1.2x torch's int4 kernel at 1 row and 1.8-2.1x from 32 rows, one thread, AVX512-VNNI;
bench/cpu_kernels.py). Otherwise it is ``torch.ops.aten._weight_int4pack_mm_for_cpu``, which
computes the same formula (checked in the tests). Facts of that kernel in torch 2.13 (measured;
see bench/linear_kernels.py):
- the activation and the scales/zeros tensor must have the same dtype (fp32, bf16 or fp16);
  on AVX512-BF16 CPUs only bf16 is fast, so the module runs the product in bf16 and casts its
  input and output, whatever dtype the model computes in;
- group_size is 32, 64, 128 or 256; in_features must be a multiple of it, out_features of 16;
- the activation must be 2-D and contiguous;
- ``_convert_weight_to_int4pack_for_cpu`` takes int32 codes [out, in] and returns an opaque,
  blocked uint8 [out, in / 2] (inner_k_tiles is ignored on CPU), so a checkpoint should store
  the plain codes (``pack_codes``) and pack them when loading.
Off the CPU the module keeps the plain nibbles and multiplies them in a Triton kernel
(engine/quantization/gpu_matmul.py), or dequantizes before the product where Triton cannot run.

torch's kernel wins at few rows and loses to a bf16 GEMM at many (SmolLM2's projections on
AVX512-BF16: 3.6 vs 9.1 ms at 1 row, even at 16, 21 vs 17 ms at 32; bench/linear_kernels.py), so
on the CPU ``set_weight(..., dense_rows=N)`` also keeps a bf16 copy of the dequantized weight (2
bytes a weight, beside the 0.63 of the codes and groups of 32) and ``forward`` multiplies a step of
N rows or more by that copy instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels.cpu import qmatmul
from engine.kernels.quant_reference import (  # noqa: F401  (part of this module's API)
    GROUP_SIZES, dequantize_int4, int4_linear_reference, pack_codes, unpack_codes)

KERNEL_DTYPE = torch.bfloat16  # scales, zeros and activations of the fast CPU product
DENSE_CHUNK_ROWS = 1024  # rows dequantized at a time into the dense copy (bounds the fp32 scratch)


def check_int4_shape(out_features: int, in_features: int, group_size: int) -> None:
    """ValueError unless the CPU kernel accepts a weight [out_features, in_features]."""
    if group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group_size must be one of {GROUP_SIZES}, got {group_size}")
    if in_features % group_size:
        raise ValueError(f"int4 needs in_features ({in_features}) to be a multiple of "
                         f"group_size ({group_size})")
    if out_features % 16:
        raise ValueError(f"int4 needs out_features ({out_features}) to be a multiple of 16")


def quantize_int4(weight: torch.Tensor, group_size: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K] float -> codes uint8 [N, K] in 0..15, scales and zeros bf16 [N, K / group].

    Min/max per group: s = (max - min) / 15 and z = min + 8 s, both rounded to bf16 first, and the
    codes chosen against the rounded values so the bf16 rounding is not paid twice.
    """
    out_features, in_features = weight.shape
    check_int4_shape(out_features, in_features, group_size)
    groups = weight.detach().float().reshape(out_features, in_features // group_size, group_size)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    scales = ((hi - lo) / 15).clamp(min=1e-6).to(KERNEL_DTYPE)
    zeros = (lo + 8 * scales.float()).to(KERNEL_DTYPE)
    q = torch.round((groups - zeros.float()[..., None]) / scales.float()[..., None] + 8)
    codes = q.clamp(0, 15).to(torch.uint8).reshape(out_features, in_features)
    return codes, scales, zeros


def dense_int4(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
               dtype: torch.dtype = KERNEL_DTYPE) -> torch.Tensor:
    """dequantize_int4 in ``dtype``, DENSE_CHUNK_ROWS rows at a time (fp32 scratch of one chunk)."""
    out = torch.empty(codes.shape, dtype=dtype, device=codes.device)
    for start in range(0, codes.shape[0], DENSE_CHUNK_ROWS):
        rows = slice(start, start + DENSE_CHUNK_ROWS)
        out[rows] = dequantize_int4(codes[rows], scales[rows], zeros[rows], group_size)
    return out


@dataclass
class Int4Weight:
    """One weight in plain int4 form, as checkpoints and loaders hand it over:
    codes uint8 [N, K] in 0..15, scales and zeros [N, K / group_size]; w = (q - 8) * s + z."""

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def map_rows(self, fn) -> Int4Weight:
        """The same weight with ``fn`` (a permutation of rows, [N, ...] -> [N, ...]) applied to
        codes, scales and zeros alike."""
        return Int4Weight(fn(self.codes), fn(self.scales), fn(self.zeros), self.group_size)

    def dequantize(self) -> torch.Tensor:
        return dequantize_int4(self.codes, self.scales, self.zeros, self.group_size)


class Int4WeightOnlyLinear(nn.Module):
    """y = x dequantize(W)^T (+ b) with W in 4-bit groups; takes and returns the model's dtype."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 group_size: int, bias: torch.Tensor | None = None, dense_rows: int | None = None):
        super().__init__()
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.set_weight(codes, scales, zeros, group_size, dense_rows)

    def set_weight(self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                   group_size: int, dense_rows: int | None = None) -> None:
        """Pack plain codes uint8 [N, K] with scales and zeros [N, K / group] into the kernel's layout.

        dense_rows (CPU only; None or 0: off): also keep the dequantized weight in bf16,
        ``weight_dense`` [N, K], and multiply steps of at least that many rows by it."""
        out_features, in_features = codes.shape
        check_int4_shape(out_features, in_features, group_size)
        expected = (out_features, in_features // group_size)
        if tuple(scales.shape) != expected or tuple(zeros.shape) != expected:
            raise ValueError(f"int4 scales/zeros must be {expected}, got {tuple(scales.shape)} "
                             f"and {tuple(zeros.shape)}")
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.is_cpu_kernel = codes.device.type == "cpu"
        # on the CPU, the engine's own int4 x int8 kernel where it builds (engine/kernels/cpu/qmatmul.py)
        self.native = self.is_cpu_kernel and qmatmul.supports(out_features, in_features)
        if self.native:
            try:
                packed, d, m = qmatmul.pack_int4(codes, scales, zeros, group_size)
                self.register_buffer("q4_d", d)  # fp16 [N / G, K / 32, G]: w = d q + m
                self.register_buffer("q4_m", m)
            except ValueError:  # a scale beyond fp16: torch's kernel takes bf16 ones
                self.native = False
        if self.native:
            self.register_buffer("scales_and_zeros", None)
            # the kernel's arguments as a plain attribute: ~120 calls a decode step, and a
            # buffer lookup through nn.Module.__getattr__ costs ~0.3 us each
            self._native_args = (packed, self.q4_d, self.q4_m)
        else:
            self._native_args = None
            self.register_buffer("q4_d", None)
            self.register_buffer("q4_m", None)
            if self.is_cpu_kernel:
                packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
            else:
                packed = pack_codes(codes.to(torch.uint8))
            # [K / group, N, 2]: (scale, zero) pairs, the kernel's qScaleAndZeros
            self.register_buffer("scales_and_zeros", torch.stack(
                [scales.t(), zeros.t()], dim=-1).to(KERNEL_DTYPE).contiguous())
        self.register_buffer("weight_packed", packed)  # CPU: a kernel's layout; else plain nibbles
        keep_dense = bool(dense_rows) and self.is_cpu_kernel
        self.dense_rows = dense_rows if keep_dense else None
        # steps of fewer rows than this go straight to the CPU kernel (0: never, as with a bias)
        self.direct_rows = (0 if not self.is_cpu_kernel or self.bias is not None
                            else self.dense_rows or 1 << 62)
        # from the codes and the bf16 groups torch's kernel reads, one layer (a chunk of it) at a time
        self.register_buffer("weight_dense", dense_int4(
            codes, scales.to(KERNEL_DTYPE), zeros.to(KERNEL_DTYPE), group_size) if keep_dense else None)

    @classmethod
    def from_float(cls, weight: torch.Tensor, group_size: int = 32,
                   bias: torch.Tensor | None = None) -> Int4WeightOnlyLinear:
        codes, scales, zeros = quantize_int4(weight, group_size)
        return cls(codes, scales, zeros, group_size, bias)

    def dequantized_weight(self) -> torch.Tensor:
        """float32 [N, K]; not for torch's CPU pack, which is opaque."""
        if self.native:
            codes, d, m = qmatmul.unpack_int4(self.weight_packed, self.q4_d, self.q4_m)
            return (codes.float().reshape(self.out_features, -1, qmatmul.BLOCK) * d[..., None]
                    + m[..., None]).reshape(self.out_features, self.in_features)
        if self.is_cpu_kernel:
            raise NotImplementedError("the CPU int4 pack is opaque; keep the codes to dequantize")
        return dequantize_int4(unpack_codes(self.weight_packed), self.scales_and_zeros[..., 0].t(),
                               self.scales_and_zeros[..., 1].t(), self.group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The decode step's common case, one kernel call and nothing around it: [T, K] bf16
        # contiguous rows, no bias, fewer rows than the dense copy takes (bench/decode_profile.py).
        if self.direct_rows > x.shape[0] and x.dim() == 2 and x.stride(-1) == 1:
            native = self._native_args
            if native is not None and (x.dtype is torch.bfloat16 or x.dtype is torch.float32):
                return qmatmul.int4_matmul(x, *native)
            if x.dtype == KERNEL_DTYPE and x.is_contiguous():
                return torch.ops.aten._weight_int4pack_mm_for_cpu(
                    x, self.weight_packed, self.group_size, self.scales_and_zeros)
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)  # [T, K]
        if self.weight_dense is not None and x2.shape[0] >= self.dense_rows:
            out = F.linear(x2.to(KERNEL_DTYPE), self.weight_dense).to(x.dtype)
        elif self.native:
            xk = x2 if x2.dtype in qmatmul.DTYPES else x2.float()
            bias = None if self.bias is None else self.bias.float().contiguous()
            out = qmatmul.int4_matmul(xk.contiguous(), self.weight_packed, self.q4_d, self.q4_m, bias).to(x.dtype)
            return out.reshape(*shape[:-1], self.out_features)
        elif self.is_cpu_kernel:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2.to(KERNEL_DTYPE).contiguous(), self.weight_packed, self.group_size,
                self.scales_and_zeros).to(x.dtype)
        else:  # off the CPU: the Triton kernel where it runs, else dequantize the whole weight
            from engine.quantization.gpu_matmul import int4_matmul_or_none
            out = int4_matmul_or_none(x2, self.weight_packed, self.scales_and_zeros, self.group_size)
            if out is None:
                out = F.linear(x2, self.dequantized_weight().to(x.dtype))
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out.reshape(*shape[:-1], self.out_features)

    def kernel_weights(self) -> list[torch.Tensor]:
        """What the native kernel streams each call (engine/memory/weight_arena.py)."""
        return list(self._native_args or ())

    def move_kernel_weights(self, place: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Takes ``place(t)``'s copy of each of ``kernel_weights()`` in its stead."""
        if self._native_args is not None:
            self.weight_packed, self.q4_d, self.q4_m = (place(t) for t in self._native_args)
            self._native_args = (self.weight_packed, self.q4_d, self.q4_m)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, bias={self.bias is not None}"
                + (f", dense_rows={self.dense_rows}" if self.dense_rows else ""))
