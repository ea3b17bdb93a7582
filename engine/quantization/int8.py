"""Per-output-channel symmetric int8 weight-only linear layers (gpt-fast's WeightOnlyInt8Linear).

Row n of the weight is q[n, :] * s[n] with q in -127..127 (symmetric: no zero point, -128 unused so
that negation is exact). On the CPU the product runs in ``torch._weight_int8pack_mm(x, q, s)``,
which needs a 2-D activation and scales of the activation's dtype (fp32, bf16 or fp16); with
bf16 it segfaults (torch 2.13, AVX-512 CPU) unless in_features is a multiple of 16, so such
layers, and any off the CPU, dequantize the weight to the activation's dtype before the product.

As with int4, a bf16 GEMM beats the kernel at many rows (SmolLM2's projections: 4.3 vs 9.1 ms at
1 row, 24 vs 17 ms at 32), so on the CPU with bf16 activations ``dense_rows=N`` keeps a bf16 copy
of q * s (2 bytes a weight beside the 1 of q) for steps of N rows or more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels.quant_reference import dequantize_int8, int8_linear_reference  # noqa: F401

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] float -> q int8 [N, K], scales float32 [N] (s = max |w| / 127 per row)."""
    if weight.dim() != 2:
        raise ValueError(f"int8 quantization needs a 2-D weight, got shape {tuple(weight.shape)}")
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-8)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def blocks_to_rows(q: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block int8 (q [N, K], d [N, K / 32]: w = d q per block of 32) -> per-row (q' int8 [N, K],
    s float32 [N]): the row's largest block scale (nothing clips), every other block re-rounded
    onto it, q' = round(q d / s): up to half a step of s more error in those blocks."""
    n, k = q.shape
    d = d.float()
    row_scale = d.abs().amax(dim=1).clamp(min=1e-8)  # [N]
    blocks = q.float().reshape(n, d.shape[1], k // d.shape[1])
    requantized = torch.round(blocks * (d / row_scale[:, None])[..., None]).clamp(-127, 127)
    return requantized.to(torch.int8).reshape(n, k), row_scale


@dataclass
class Int8Weight:
    """One weight in int8 form: q int8 [N, K] and scales float32, either [N] (w = q * s per row)
    or [N, K / 32] (w = q * d per block of 32 columns: GGUF's Q8_0 and Q5_0 as they are, the
    engine's native int8 kernel's format)."""

    q: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def is_blocked(self) -> bool:
        return self.scales.dim() == 2

    def map_rows(self, fn) -> Int8Weight:
        return Int8Weight(fn(self.q), fn(self.scales))

    def per_row(self) -> Int8Weight:
        """This weight with one scale per row (re-rounded when blocked: blocks_to_rows)."""
        return Int8Weight(*blocks_to_rows(self.q, self.scales)) if self.is_blocked else self

    def dequantize(self) -> torch.Tensor:
        if self.is_blocked:
            n, k = self.q.shape
            return (self.q.float().reshape(n, self.scales.shape[1], -1)
                    * self.scales.float()[..., None]).reshape(n, k)
        return dequantize_int8(self.q, self.scales)


def dense_int8(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype,
               chunk_rows: int = 1024) -> torch.Tensor:
    """dequantize_int8 in ``dtype``, ``chunk_rows`` rows at a time (fp32 scratch of one chunk)."""
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
    for start in range(0, q.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        out[rows] = dequantize_int8(q[rows], scales[rows])
    return out


class Int8WeightOnlyLinear(nn.Module):
    """y = x (q * s)^T (+ b); takes and returns the activation's dtype.

    With block scales (d [N, K / 32], a GGUF's Q8_0/Q5_0 blocks) on a CPU where the engine's own
    kernels build, the weight stays in those blocks and multiplies in the native int8 kernel
    (engine/kernels/cpu/qmatmul.py: activations rounded to int8 per block, as for int4); elsewhere
    block scales are re-rounded to one scale per row (blocks_to_rows) for torch's kernel."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.float32, dense_rows: int | None = None):
        super().__init__()
        if q.dim() != 2 or q.dtype != torch.int8:
            raise ValueError(f"int8 weight must be a 2-D int8 tensor, got {q.dtype} {tuple(q.shape)}")
        if tuple(scales.shape) not in ((q.shape[0],), (q.shape[0], q.shape[1] // 32)):
            raise ValueError(f"int8 scales must be [{q.shape[0]}] or [{q.shape[0]}, "
                             f"{q.shape[1] // 32}], got {tuple(scales.shape)}")
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.set_weight(q, scales, dtype, dense_rows)

    @staticmethod
    def takes_blocks(out_features: int, in_features: int, device: torch.device | str) -> bool:
        """Whether a weight of this shape on ``device`` keeps block scales (the native kernel)."""
        from engine.kernels.cpu import qmatmul
        return torch.device(device).type == "cpu" and qmatmul.supports(out_features, in_features)

    def set_weight(self, q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype,
                   dense_rows: int | None = None) -> None:
        """dense_rows (CPU and bf16 only; None or 0: off): also keep ``weight_dense`` = q * s in
        bf16 [N, K], and multiply steps of at least that many rows by it."""
        self.out_features, self.in_features = q.shape
        self._native_args = None
        if scales.dim() == 2 and self.takes_blocks(*q.shape, q.device):
            from engine.kernels.cpu import qmatmul
            try:
                packed, d = qmatmul.pack_int8(q, scales)
            except ValueError:  # a scale beyond fp16: one scale a row instead
                pass
            else:
                self._set_blocks(q, scales, packed, d, dtype, dense_rows)
                return
        if scales.dim() == 2:
            q, scales = blocks_to_rows(q, scales)
        self.register_buffer("q8_packed", None)
        self.register_buffer("q8_d", None)
        self.register_buffer("weight_int8", q.contiguous())
        # kept in the dtype the model computes in, so the kernel needs no cast per call
        self.register_buffer("scales", scales.detach().to(dtype))
        keep_dense = bool(dense_rows) and q.device.type == "cpu" and dtype == torch.bfloat16
        self.dense_rows = dense_rows if keep_dense else None
        # rounded like the kernel's bf16 scales, so both paths stand for the same weight
        self.register_buffer("weight_dense", dense_int8(q, self.scales, dtype) if keep_dense else None)

    def _set_blocks(self, q, scales, packed, d, dtype, dense_rows) -> None:
        self.register_buffer("q8_packed", packed)  # q + 128 uint8 [N / G, K / 32, 8, G, 4]
        self.register_buffer("q8_d", d)  # fp16 [N / G, K / 32, G]
        self.register_buffer("weight_int8", None)
        self.register_buffer("scales", None)
        # the kernel's arguments as a plain attribute (a buffer lookup costs ~0.3 us a call)
        self._native_args = (packed, d)
        self._bias32 = None if self.bias is None else self.bias.float().contiguous()
        keep_dense = bool(dense_rows) and dtype == torch.bfloat16
        self.dense_rows = dense_rows if keep_dense else None
        dense = None
        if keep_dense:  # rounded like the kernel's fp16 block scales
            dense = Int8Weight(q, d.float().transpose(1, 2).reshape(q.shape[0], -1)).dequantize()
        self.register_buffer("weight_dense", None if dense is None else dense.to(dtype))

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   dtype: torch.dtype | None = None) -> Int8WeightOnlyLinear:
        q, scales = quantize_int8(weight)
        return cls(q, scales, bias, dtype or weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        native = self._native_args
        if native is not None:
            from engine.kernels.cpu import qmatmul
            shape = x.shape
            x2 = x.reshape(-1, self.in_features)
            if self.weight_dense is not None and x2.shape[0] >= self.dense_rows and (
                    x.dtype == self.weight_dense.dtype):
                out = F.linear(x2, self.weight_dense)
                if self.bias is not None:
                    out = out + self.bias.to(x.dtype)
            else:
                xk = x2 if x2.dtype in qmatmul.DTYPES else x2.float()
                out = qmatmul.int8_matmul(xk if xk.stride(-1) == 1 else xk.contiguous(), *native,
                                          self._bias32).to(x.dtype)
            return out.reshape(*shape[:-1], self.out_features)
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)  # [T, K]
        scales = self.scales if self.scales.dtype == x.dtype else self.scales.to(x.dtype)
        if self.weight_dense is not None and x2.shape[0] >= self.dense_rows and (
                x.dtype == self.weight_dense.dtype):
            out = F.linear(x2, self.weight_dense)
        elif x.device.type == "cpu" and x.dtype in KERNEL_DTYPES and (
                x.dtype != torch.bfloat16 or self.in_features % 16 == 0):
            out = torch._weight_int8pack_mm(x2.contiguous(), self.weight_int8, scales)
        else:  # the Triton kernel on a GPU that runs it, else dequantize first
            from engine.quantization.gpu_matmul import int8_matmul_or_none
            out = int8_matmul_or_none(x2, self.weight_int8, scales)
            if out is None:
                out = F.linear(x2, self.weight_int8.to(x.dtype)) * scales
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out.reshape(*shape[:-1], self.out_features)

    def kernel_weights(self) -> list[torch.Tensor]:
        """What the native kernel streams each call (engine/memory/weight_arena.py)."""
        return list(self._native_args or ())

    def move_kernel_weights(self, place: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Takes ``place(t)``'s copy of each of ``kernel_weights()`` in its stead."""
        if self._native_args is not None:
            self.q8_packed, self.q8_d = (place(t) for t in self._native_args)
            self._native_args = (self.q8_packed, self.q8_d)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}"
                + (", blocks of 32 (native)" if self._native_args is not None else "")
                + (f", dense_rows={self.dense_rows}" if self.dense_rows else ""))
