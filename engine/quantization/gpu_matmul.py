"""The quantized layers' product off the CPU: the Triton kernels of engine/kernels/quant_matmul.py
on CUDA devices that run them (sm80+, Triton installed), None elsewhere so the layer falls back to
dequantizing its weight. The kernel module is imported on first use: the CPU path never imports
Triton.
"""

from __future__ import annotations

import functools

import torch

from engine.kernels import is_triton_usable


@functools.lru_cache(maxsize=None)
def runs_triton_kernels(device: torch.device) -> bool:
    return device.type == "cuda" and is_triton_usable(device)


def int4_matmul_or_none(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor,
                        group_size: int) -> torch.Tensor | None:
    """x [T, K] @ dequantize(packed)^T -> [T, N] in x.dtype through the kernel, or None."""
    if not runs_triton_kernels(x.device):
        return None
    from engine.kernels.quant_matmul import int4_matmul

    return int4_matmul(x, packed, scales_and_zeros, group_size)


def int8_matmul_or_none(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor
                        ) -> torch.Tensor | None:
    """x [T, K] @ (q * s)^T -> [T, N] in x.dtype through the kernel, or None."""
    if not runs_triton_kernels(x.device):
        return None
    from engine.kernels.quant_matmul import int8_matmul

    return int8_matmul(x, q, scales)
