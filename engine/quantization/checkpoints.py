"""Quantized safetensors checkpoints: Pagoda's own (written by ``python -m engine convert``),
AutoGPTQ's and AutoAWQ's 4-bit layouts, all read into Int4Weight / Int8Weight at load.

Pagoda's layout (config.json ``quantization_config = {"quant_method": "pagoda", "bits": 4 or 8,
"group_size": G}``), for each quantized projection ``P`` (an HF name such as
``model.layers.0.self_attn.q_proj``), beside the float tensors kept as they were:
- bits 4: ``P.qweight`` uint8 [N, K / 2] (code of column 2j in the low nibble of byte j, 2j + 1 in
  the high), ``P.scales`` and ``P.zeros`` bf16 [N, K / G]; w = (q - 8) * s + z per group
- bits 8: ``P.qweight`` int8 [N, K], ``P.scales`` float32 [N]; w = q * s per row (or [N, K / 32],
  w = q * d per block of 32 columns: a GGUF's Q8_0/Q5_0 blocks as they were)
The plain codes, not the CPU kernel's opaque pack: packing is a cheap step at load.

GPTQ (quant_method "gptq", bits 4): ``qweight`` int32 [K / 8, N] packed along K (nibble j of row
i is input row 8i + j), ``qzeros`` int32 [K / G, N / 8] packed along N, ``scales`` fp16
[K / G, N], ``g_idx`` int32 [K]; w = (q - (z + 1)) * s in the original ("gptq", v1) format, where
the stored zero is one less, w = (q - z) * s in "gptq_v2". Act-order checkpoints (g_idx not
k // G) have groups our contiguous-group kernel cannot hold.
AWQ (quant_method "awq", version gemm, bits 4): ``qweight`` int32 [K, N / 8] and ``qzeros``
int32 [K / G, N / 8] packed along N in AWQ's interleaved order (nibble i holds column
AWQ_ORDER[i] of its eight), ``scales`` fp16 [K / G, N]; w = (q - z) * s.
Both become ours with the codes unchanged and z' = (8 - z) * s.
"""

from __future__ import annotations

import torch

from engine.quantization.int4 import GROUP_SIZES, KERNEL_DTYPE, Int4Weight, pack_codes, unpack_codes
from engine.quantization.int8 import Int8Weight

PAGODA = "pagoda"
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # column j of eight sits in nibble AWQ_REVERSE_ORDER[j]
# the tensors one quantized projection is stored as, by method
PARTS = {PAGODA: ("qweight", "scales", "zeros"), "gptq": ("qweight", "qzeros", "scales", "g_idx"),
         "awq": ("qweight", "qzeros", "scales")}


def method_of(quantization_config: dict | None) -> str | None:
    """The quant_method of a config.json's quantization_config we read, or None (float);
    ValueError for one we do not."""
    if not quantization_config:
        return None
    method = quantization_config.get("quant_method")
    if method not in PARTS:
        raise ValueError(f"quantization method {method!r} is not supported; we read {list(PARTS)}")
    bits = quantization_config.get("bits", quantization_config.get("w_bit"))
    if bits != 4 and not (method == PAGODA and bits == 8):
        raise ValueError(f"{method} with {bits} bits is not supported (4-bit only)")
    if method == "awq" and (quantization_config.get("version", "gemm").lower() != "gemm"
                            or quantization_config.get("zero_point") is False):
        raise ValueError("AWQ: only the GEMM layout with zero points is supported")
    if method == "gptq" and quantization_config.get("desc_act"):
        raise ValueError("GPTQ act-order (desc_act) checkpoints are not supported")
    return method


def group_size_of(quantization_config: dict, in_features: int) -> int:
    group = quantization_config.get("group_size", quantization_config.get("q_group_size", 128))
    return in_features if group in (-1, None) else int(group)


def to_pagoda(weight: Int4Weight | Int8Weight) -> dict[str, torch.Tensor]:
    """The tensors (suffix -> tensor) one projection is written as."""
    if isinstance(weight, Int8Weight):
        return {"qweight": weight.q.contiguous(), "scales": weight.scales.float().contiguous()}
    return {"qweight": pack_codes(weight.codes).contiguous(),
            "scales": weight.scales.to(KERNEL_DTYPE).contiguous(),
            "zeros": weight.zeros.to(KERNEL_DTYPE).contiguous()}


def _unpack_int32(packed: torch.Tensor, order=tuple(range(8))) -> torch.Tensor:
    """int32 [R, C] of eight nibbles each -> uint8 [R, C * 8], value j of each word from nibble order[j]."""
    shifts = torch.tensor(order, dtype=torch.int32) * 4
    return ((packed[:, :, None] >> shifts) & 0xF).to(torch.uint8).reshape(packed.shape[0], -1)


def _ours(codes_nk: torch.Tensor, zeros_gn: torch.Tensor, scales_gn: torch.Tensor,
          group_size: int) -> Int4Weight:
    scales = scales_gn.float()
    zeros = (8 - zeros_gn.float()) * scales  # (q - z) s = (q - 8) s + (8 - z) s
    return Int4Weight(codes_nk.contiguous(), scales.t().to(KERNEL_DTYPE).contiguous(),
                      zeros.t().to(KERNEL_DTYPE).contiguous(), group_size)


def read_projection(method: str, parts: dict[str, torch.Tensor], quantization_config: dict
                    ) -> Int4Weight | Int8Weight | torch.Tensor:
    """One projection's stored tensors -> our weight [N, K]; float32 when its groups are ones
    our int4 kernel does not take (then the layer stays float)."""
    if method == PAGODA:
        if quantization_config.get("bits") == 8:
            return Int8Weight(parts["qweight"], parts["scales"].float())
        codes = unpack_codes(parts["qweight"])
        return Int4Weight(codes, parts["scales"], parts["zeros"], codes.shape[1] // parts["scales"].shape[1])
    if method == "gptq":
        codes = _unpack_int32(parts["qweight"].t().contiguous()).contiguous()  # [N, K]
        in_features = codes.shape[1]
        group = group_size_of(quantization_config, in_features)
        g_idx = parts.get("g_idx")
        if g_idx is not None and not torch.equal(g_idx.long(), torch.arange(in_features) // group):
            raise ValueError("GPTQ g_idx is not k // group_size (act-order): not supported")
        offset = 0 if quantization_config.get("checkpoint_format") == "gptq_v2" else 1
        weight = _ours(codes, _unpack_int32(parts["qzeros"]).int() + offset, parts["scales"], group)
    else:
        codes = _unpack_int32(parts["qweight"], AWQ_REVERSE_ORDER).t()  # [N, K]
        group = group_size_of(quantization_config, codes.shape[1])
        weight = _ours(codes, _unpack_int32(parts["qzeros"], AWQ_REVERSE_ORDER), parts["scales"], group)
    return weight if group in GROUP_SIZES else weight.dequantize()
