"""The quantized layouts' formulas in plain torch: what a stored weight stands for and the float32
product it should give, the references every kernel (torch's, engine/kernels/cpu, the Triton ones in
engine/kernels/quant_matmul.py) is tested against. A leaf module: it imports only torch.

int4: codes q in 0..15 per weight, a scale s and a zero z per group of ``group_size`` columns,
w = (q - 8) * s + z. int8: codes q in -127..127, a scale s per row, w = q * s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GROUP_SIZES = (32, 64, 128, 256)


def dequantize_int4(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                    group_size: int) -> torch.Tensor:
    """The float32 weight [N, K] the codes stand for: (q - 8) * s + z per group."""
    out_features, in_features = codes.shape
    q = codes.float().reshape(out_features, in_features // group_size, group_size)
    w = (q - 8) * scales.float()[..., None] + zeros.float()[..., None]
    return w.reshape(out_features, in_features)


def int4_linear_reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                          zeros: torch.Tensor, group_size: int,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-torch float32 x @ dequantize(W).T (+ b), returned in x's dtype."""
    weight = dequantize_int4(codes, scales, zeros, group_size)
    out = F.linear(x.float(), weight, None if bias is None else bias.float())
    return out.to(x.dtype)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """codes uint8 [N, K] -> uint8 [N, K / 2], even columns in the low nibble (storage layout)."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_codes: uint8 [N, K / 2] -> uint8 [N, K]."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 [N, K] = q * s per row."""
    return q.float() * scales.float()[:, None]


def int8_linear_reference(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-torch float32 x @ (q * s).T (+ b), returned in x's dtype."""
    out = F.linear(x.float(), dequantize_int8(q, scales), None if bias is None else bias.float())
    return out.to(x.dtype)
