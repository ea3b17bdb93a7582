"""GGUF quantized blocks straight into Pagoda's int4/int8 layouts, without a float weight.

Block layouts (gguf 0.19 gguf/quants.py; 32 weights a block, one row of the [out, in] weight is
in / 32 consecutive blocks):
- Q4_0, 18 bytes: fp16 d, 16 bytes of nibbles;           w = d * (q - 8)
- Q4_1, 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles;   w = d * q + m
- Q8_0, 34 bytes: fp16 d, 32 int8;                       w = d * q
Nibble byte j of a block holds weight j in its low half and weight j + 16 in its high half.

Our int4 computes w = (q - 8) * s + z per group of 32, so Q4_0 is s = d, z = 0 and Q4_1 is
s = d, z = m + 8 d, with the codes kept as they are. The engine's own CPU kernel keeps d and m in
fp16, so nothing is lost; torch's int4 kernel (the fallback) rounds d and z to bf16. Functions take a tensor's raw bytes (``GGUFReader`` tensors'
``.data``: uint8 [rows, bytes a row]) and the HF shape (out, in). Rows come out in file order:
apply the loader's Q/K un-permutation to codes, scales and zeros alike (it moves whole rows).
"""

from __future__ import annotations

import numpy as np
import torch


BLOCK = 32
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def _blocks(data, shape: tuple[int, int], qtype: str) -> torch.Tensor:
    """Raw bytes -> uint8 [out, in / 32, bytes a block]."""
    out_features, in_features = (int(d) for d in shape)
    if qtype not in BLOCK_BYTES:
        raise ValueError(f"unsupported GGUF block type {qtype!r}; expected one of {list(BLOCK_BYTES)}")
    if in_features % BLOCK:
        raise ValueError(f"{qtype}: in_features ({in_features}) is not a multiple of {BLOCK}")
    # a copy of the bytes (0.56 bytes a weight): GGUFReader's memory map is read-only
    raw = data if isinstance(data, torch.Tensor) else torch.from_numpy(np.array(data, dtype=np.uint8))
    expected = out_features * in_features // BLOCK * BLOCK_BYTES[qtype]
    if raw.dtype != torch.uint8 or raw.numel() != expected:
        raise ValueError(f"{qtype} tensor of shape {tuple(shape)} needs {expected} uint8 bytes, "
                         f"got {raw.numel()} of {raw.dtype}")
    return raw.reshape(out_features, in_features // BLOCK, BLOCK_BYTES[qtype])


def _fp16(two_bytes: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 2] little-endian -> float32 [...]."""
    return two_bytes.contiguous().view(torch.float16)[..., 0].float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """uint8 [out, blocks, 16] -> codes uint8 [out, blocks * 32] in weight order."""
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # [out, blocks, 32]: low halves first
    return codes.reshape(qs.shape[0], -1)


def q4_to_int4(data, shape: tuple[int, int], qtype: str
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_0 / Q4_1 bytes -> (codes uint8 [out, in], scales and zeros float32 [out, in/32], the
    file's fp16 values unrounded), the arguments of Int4WeightOnlyLinear with group_size 32."""
    if qtype not in ("Q4_0", "Q4_1"):
        raise ValueError(f"q4_to_int4 takes Q4_0 or Q4_1 blocks, got {qtype!r}")
    blocks = _blocks(data, shape, qtype)
    d = _fp16(blocks[..., 0:2])  # [out, blocks]
    if qtype == "Q4_0":
        zeros, qs = torch.zeros_like(d), blocks[..., 2:]
    else:
        zeros, qs = _fp16(blocks[..., 2:4]) + 8 * d, blocks[..., 4:]
    return _nibbles(qs), d, zeros


def q8_0_to_int8(data, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 bytes -> (q int8 [out, in], scales float32 [out]) for Int8WeightOnlyLinear.

    Not exact: Q8_0 has one scale per 32 weights, the per-channel kernel one per row. We take the
    row's largest block scale (so nothing clips) and re-round every other block onto it,
    q' = round(q * d_block / d_row); a block whose scale is the row's keeps its codes, the others
    lose up to half a step of d_row. Measured: SmolLM2's token_embd comes out 1.17% RMS off its
    Q8_0 dequantization, the same figure as quantizing those floats per row from scratch, so the
    re-rounding adds nothing beyond the per-channel kernel's own limit; on Gaussian rows that is
    0.73% on top of Q8_0's own 0.54%. The lossless route, a group-wise int8 kernel, torch does not
    have on CPU.
    """
    blocks = _blocks(data, shape, "Q8_0")
    d = _fp16(blocks[..., 0:2])  # [out, blocks]
    q = blocks[..., 2:].contiguous().view(torch.int8).float()  # [out, blocks, 32]
    row_scale = d.abs().amax(dim=1).clamp(min=1e-8)  # [out]
    requantized = torch.round(q * (d / row_scale[:, None])[..., None]).clamp(-127, 127)
    return requantized.to(torch.int8).reshape(blocks.shape[0], -1), row_scale


Q4_K_BLOCK, Q4_K_BYTES = 256, 144  # fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles


def q4_k_to_int4(data, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K bytes -> (codes uint8 [out, in], scales and zeros float32 [out, in / 32]) for groups of 32.

    A Q4_K super-block of 256 weights has 8 sub-blocks of 32, each w = d sc_j q - dmin m_j with
    6-bit sc_j and m_j: a group of 32 with s = d sc_j and z = 8 s - dmin m_j, codes as they are
    (sub-block 2 i in the low nibbles of bytes 32 i .. 32 i + 31, 2 i + 1 in the high ones). s is
    exact in float32 (an fp16 times a 6-bit integer); the engine's kernel keeps s and z - 8 s in
    fp16, a relative rounding of 2^-11 at most."""
    from gguf.quants import Q4_K

    out_features, in_features = (int(d) for d in shape)
    if in_features % Q4_K_BLOCK:
        raise ValueError(f"Q4_K: in_features ({in_features}) is not a multiple of {Q4_K_BLOCK}")
    raw = np.ascontiguousarray(np.asarray(data, dtype=np.uint8))
    n_blocks = out_features * in_features // Q4_K_BLOCK
    if raw.size != n_blocks * Q4_K_BYTES:
        raise ValueError(f"Q4_K tensor of shape {tuple(shape)} needs {n_blocks * Q4_K_BYTES} bytes, "
                         f"got {raw.size}")
    blocks = raw.reshape(n_blocks, Q4_K_BYTES)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [n, 1]
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, mins = Q4_K.get_scale_min(blocks[:, 4:16].copy())  # [n, 8] each, 0..63
    scales = d * sc.astype(np.float32)  # [n, 8]
    zeros = 8 * scales - dmin * mins.astype(np.float32)
    qs = torch.from_numpy(blocks[:, 16:].copy()).reshape(n_blocks, 4, 32)  # 4 pairs of sub-blocks
    codes = torch.stack([qs & 0x0F, qs >> 4], dim=2)  # [n, 4, 2, 32]: sub-blocks 2 i, 2 i + 1
    groups = (out_features, in_features // BLOCK)
    return (codes.reshape(out_features, in_features), torch.from_numpy(scales).reshape(groups),
            torch.from_numpy(zeros).reshape(groups))


Q5_0_BYTES = 22  # fp16 d, 4 bytes of fifth bits, 16 bytes of nibbles; w = d * (q - 16)


def int8_blocks(data, shape: tuple[int, int], qtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0, Q5_0, Q5_1, Q5_K or Q6_K bytes -> (q int8 [out, in], d float32 [out, in / 32]) with
    w = d q per block of 32: the native int8 kernel's own format (engine/kernels/cpu/qmatmul.py).
    Q8_0 and Q5_0 load exactly (their codes and fp16 scales as they are: Q5_0's q - 16 is in
    -16..15). The others are dequantized (gguf's own) and rounded per block of 32 as Q8_0 rounds
    (quantize_int8_blocks): half a step of the block's largest weight / 127 at most, on top of the
    file's rounding."""
    out_features, in_features = (int(d) for d in shape)
    if qtype == "Q8_0":
        blocks = _blocks(data, shape, "Q8_0")
        q = blocks[..., 2:].contiguous().view(torch.int8).reshape(out_features, in_features)
        return q, _fp16(blocks[..., 0:2])
    if qtype == "Q5_0":
        if in_features % BLOCK:
            raise ValueError(f"Q5_0: in_features ({in_features}) is not a multiple of {BLOCK}")
        raw = torch.from_numpy(np.array(data, dtype=np.uint8))
        if raw.numel() != out_features * in_features // BLOCK * Q5_0_BYTES:
            raise ValueError(f"Q5_0 tensor of shape {tuple(shape)} needs "
                             f"{out_features * in_features // BLOCK * Q5_0_BYTES} bytes, got {raw.numel()}")
        blocks = raw.reshape(out_features, in_features // BLOCK, Q5_0_BYTES)
        high = blocks[..., 2:6].contiguous().view(torch.int32)  # [out, blocks, 1]: bit j = weight j
        bits = ((high >> torch.arange(32, dtype=torch.int32)) & 1).to(torch.uint8)  # [out, blocks, 32]
        codes = _nibbles(blocks[..., 6:]).reshape(bits.shape) | (bits << 4)
        q = (codes.to(torch.int16) - 16).to(torch.int8).reshape(out_features, in_features)
        return q, _fp16(blocks[..., 0:2])
    if qtype not in ("Q5_1", "Q5_K", "Q6_K"):
        raise ValueError(f"int8_blocks takes Q8_0, Q5_0, Q5_1, Q5_K or Q6_K, got {qtype!r}")
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from engine.kernels.cpu.qmatmul import quantize_int8_blocks

    weight = dequantize(np.asarray(data, dtype=np.uint8), GGMLQuantizationType[qtype])
    return quantize_int8_blocks(torch.from_numpy(np.asarray(weight, dtype=np.float32)).reshape(
        out_features, in_features))


def int8_from_blocks(data, shape: tuple[int, int], qtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0, Q5_0, Q5_1, Q5_K or Q6_K bytes -> (q int8 [out, in], scales float32 [out]) for the
    per-channel int8 layers. Q8_0 re-rounds its codes onto the row's largest scale (q8_0_to_int8);
    the 5- and 6-bit types are dequantized one tensor at a time (gguf's own dequantization) and
    rounded per row to 255 levels, which adds about half a step of the row's largest weight /
    127 to each, on top of the file's own rounding."""
    if qtype == "Q8_0":
        return q8_0_to_int8(data, shape)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from engine.quantization.int8 import quantize_int8

    if qtype not in ("Q5_0", "Q5_1", "Q5_K", "Q6_K"):
        raise ValueError(f"int8_from_blocks takes Q8_0, Q5_0, Q5_1, Q5_K or Q6_K, got {qtype!r}")
    weight = dequantize(np.asarray(data, dtype=np.uint8), GGMLQuantizationType[qtype])
    return quantize_int8(torch.from_numpy(np.asarray(weight, dtype=np.float32)).reshape(
        int(shape[0]), int(shape[1])))
