"""Linear layers, each loading checkpoint tensors into its own layout (after nano-vllm's linear.py).

Every parameter carries ``weight_loader(param, loaded, shard_id=None)``: the generic model loader
(engine/models/loader.py) hands it a checkpoint tensor and, for a fused layer, which shard it is.
``loaded`` is a float tensor, or a weight already quantized (engine.quantization's Int4Weight /
Int8Weight, from a GGUF file or a quantized safetensors checkpoint).

The model file builds float layers only. A weight layout is a class here with the same shard
geometry (``shards``) that the loader swaps in before loading (``quantized_like``, gpt-fast's
pass style): Int4Linear and Int8Linear stage each shard's rows in plain codes and, once every
shard has arrived, pack them into the CPU kernel's layout. Fused shards concatenate along N.

Per step shape: the weight-only kernels beat a bf16 GEMM only at few rows (bench/linear_kernels.py;
on AVX512-BF16 int4 g32 wins up to 16 rows, bf16 from 17), so with ``dense_rows`` set (the engine's
``quantization_dense_rows``, CPU and bf16 only) a quantized layer also keeps a bf16 copy of its
weight, dequantized from its own codes when it packs them (one layer at a time, never the whole
model in fp32), and multiplies steps of at least that many rows by the copy.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels.cpu import qmatmul
from engine.quantization.int4 import (Int4Weight, Int4WeightOnlyLinear,
                                      check_int4_shape, quantize_int4)
from engine.quantization.int8 import Int8Weight, Int8WeightOnlyLinear, quantize_int8

QuantizedWeight = Int4Weight | Int8Weight
# The int8 LM head beats the bf16 GEMM up to this many rows (SmolLM2's [49152, 576] on AVX-512
# BF16: 0.5 vs 3.8 ms at 1 row, 1.7 vs 3.0 ms at 8, 7.3 vs 4.9 ms at 32; bench/linear_kernels.py).
LM_HEAD_INT8_MAX_ROWS = 8


def as_float(loaded: torch.Tensor | QuantizedWeight) -> torch.Tensor:
    return loaded.dequantize() if isinstance(loaded, (Int4Weight, Int8Weight)) else loaded


class ShapeMismatchError(ValueError):
    """A checkpoint tensor whose shape is not its parameter's (validation names both)."""

    def __init__(self, loaded: tuple[int, ...], expected: tuple[int, ...]):
        super().__init__(f"checkpoint shape {loaded} != model shape {expected}")
        self.loaded, self.expected = loaded, expected


def default_weight_loader(param: nn.Parameter, loaded, shard_id=None) -> None:
    """Copy a whole checkpoint tensor (parameters outside linear layers: norms, embeddings)."""
    if shard_id is not None:
        raise ValueError(f"this parameter has no shard {shard_id!r}")
    loaded = as_float(loaded)
    if param.shape != loaded.shape:
        raise ShapeMismatchError(tuple(loaded.shape), tuple(param.shape))
    param.data.copy_(loaded)


def embedding_weight_loader(param: nn.Parameter, loaded, shard_id=None) -> None:
    """default_weight_loader for a (tied) token embedding, which also takes a checkpoint's int8
    blocks (a GGUF's Q8_0 or Q5_0 token_embd: ``weights_for`` hands them over as they are): they
    are written into the float table a chunk of rows at a time, with no float32 copy of the whole
    vocabulary, and kept as ``param.int8_blocks`` for LMHead.prepare, whose int8 copy is then the
    file's own codes rather than a re-rounding of the table."""
    if not (isinstance(loaded, Int8Weight) and loaded.is_blocked):
        default_weight_loader(param, loaded, shard_id)
        return
    if shard_id is not None:
        raise ValueError(f"this parameter has no shard {shard_id!r}")
    if param.shape != loaded.shape:
        raise ShapeMismatchError(tuple(loaded.shape), tuple(param.shape))
    for start in range(0, param.shape[0], EMBEDDING_CHUNK_ROWS):
        rows = slice(start, start + EMBEDDING_CHUNK_ROWS)
        param.data[rows] = Int8Weight(loaded.q[rows], loaded.scales[rows]).dequantize()
    param.int8_blocks = loaded


embedding_weight_loader.takes_int8_blocks = True
EMBEDDING_CHUNK_ROWS = 8192


class Linear(nn.Module):
    """y = x W^T (+ b), with the weight stored [out, in] as in HF checkpoints."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    @property
    def shards(self) -> dict:
        """shard_id -> (first row, rows); None is the whole fused weight."""
        return {None: (0, self.out_features)}

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        if shard_id is None:
            return default_weight_loader(param, loaded)
        start, size = _shard_rows(self.shards, shard_id, loaded)
        param.data[start:start + size].copy_(as_float(loaded).to(param.dtype))


class MergedLinear(Linear):
    """Several projections of one input fused along the output (gate/up): shard i is rows
    ``sum(output_sizes[:i]) : + output_sizes[i]`` of the weight (and bias)."""

    SHARDS: tuple = ()  # shard ids in row order; empty: 0, 1, ...

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False):
        super().__init__(in_features, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)

    @property
    def shards(self) -> dict:
        ids = self.SHARDS or range(len(self.output_sizes))
        starts = [sum(self.output_sizes[:i]) for i in range(len(self.output_sizes))]
        return {None: (0, self.out_features),
                **{i: (s, n) for i, s, n in zip(ids, starts, self.output_sizes)}}


class QKVLinear(MergedLinear):
    """Q, K and V fused: shards "q" [num_heads * head_dim] then "k" and "v" [num_kv_heads * head_dim]."""

    SHARDS = ("q", "k", "v")

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False):
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        super().__init__(hidden_size, [q_size, kv_size, kv_size], bias)


def _shard_rows(shards: dict, shard_id, loaded) -> tuple[int, int]:
    if shard_id not in shards:
        raise ValueError(f"this parameter has no shard {shard_id!r}")
    start, size = shards[shard_id]
    if loaded.shape[0] != size:
        raise ValueError(f"shard {shard_id!r} has {loaded.shape[0]} rows, expected {size}")
    return start, size


class _StagedLinear:
    """Shard bookkeeping of a quantized layer: rows are staged in plain form until the last
    shard (or the whole weight) arrives, then ``_pack`` builds the kernel layout."""

    def _stage(self, like: Linear, codes_dtype: torch.dtype) -> None:
        device = like.weight.device
        self.shard_table = {k: v for k, v in like.shards.items()}
        self._pending = {k for k in self.shard_table if k is not None} or {None}
        # staging codes [N, K]; replaced by the packed layout once every shard is in
        self.weight = nn.Parameter(torch.empty(like.out_features, like.in_features, dtype=codes_dtype,
                                               device=device), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.bias = None
        if like.bias is not None:
            self.bias = nn.Parameter(torch.empty_like(like.bias), requires_grad=False)
            self.bias.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        start, size = _shard_rows(self.shard_table, shard_id, loaded)
        if param is self.bias:
            param.data[start:start + size].copy_(as_float(loaded))
            return
        self._load_rows(start, size, loaded)
        self._pending -= set(self.shard_table) if shard_id is None else {shard_id}
        if not self._pending:
            self._pack()


class Int4Linear(_StagedLinear, Int4WeightOnlyLinear):
    """Group-wise int4 in place of a (fused) Linear; loads Int4Weight shards as they are, float
    ones through quantize_int4."""

    def __init__(self, like: Linear, group_size: int, dense_rows: int | None = None):
        nn.Module.__init__(self)
        check_int4_shape(like.out_features, like.in_features, group_size)
        self.in_features, self.out_features, self.group_size = (
            like.in_features, like.out_features, group_size)
        self._dense_rows = dense_rows
        self._stage(like, torch.uint8)
        groups = (like.out_features, like.in_features // group_size)
        # float32 staging: GGUF's fp16 scales reach the kernel unrounded (torch's rounds them to bf16)
        self._scales = torch.empty(groups, dtype=torch.float32, device=like.weight.device)
        self._zeros = torch.empty(groups, dtype=torch.float32, device=like.weight.device)

    def _load_rows(self, start: int, size: int, loaded) -> None:
        if not (isinstance(loaded, Int4Weight) and loaded.group_size == self.group_size):
            loaded = Int4Weight(*quantize_int4(as_float(loaded), self.group_size), self.group_size)
        rows = slice(start, start + size)
        self.weight.data[rows].copy_(loaded.codes)
        self._scales[rows].copy_(loaded.scales)
        self._zeros[rows].copy_(loaded.zeros)

    def _pack(self) -> None:
        codes, scales, zeros = self.weight.data, self._scales, self._zeros
        del self.weight, self._scales, self._zeros
        self.set_weight(codes, scales, zeros, self.group_size, self._dense_rows)


class Int8Linear(_StagedLinear, Int8WeightOnlyLinear):
    """Per-channel int8 in place of a (fused) Linear; loads Int8Weight shards as they are,
    float ones through quantize_int8. Scales are kept in the activation dtype."""

    def __init__(self, like: Linear, dtype: torch.dtype, dense_rows: int | None = None):
        nn.Module.__init__(self)
        self.in_features, self.out_features, self.dtype = like.in_features, like.out_features, dtype
        self._dense_rows = dense_rows
        self._stage(like, torch.int8)
        device = like.weight.device
        self._scales = torch.empty(like.out_features, dtype=torch.float32, device=device)
        # Shards stored in blocks of 32 (a GGUF's Q8_0/Q5_0...) stay so where the native int8
        # kernel takes the layer; a layer with a shard of one scale a row goes per row entirely.
        self._blocked = torch.zeros(like.out_features, dtype=torch.bool)
        self._block_scales = (torch.empty(like.out_features, like.in_features // 32, device=device)
                              if self.takes_blocks(like.out_features, like.in_features, device) else None)

    def _load_rows(self, start: int, size: int, loaded) -> None:
        if not isinstance(loaded, Int8Weight):
            loaded = Int8Weight(*quantize_int8(as_float(loaded)))
        if loaded.is_blocked and self._block_scales is None:
            loaded = loaded.per_row()
        rows = slice(start, start + size)
        self.weight.data[rows].copy_(loaded.q)
        (self._block_scales if loaded.is_blocked else self._scales)[rows].copy_(loaded.scales)
        self._blocked[rows] = loaded.is_blocked

    def _pack(self) -> None:
        q, scales = self.weight.data, self._scales
        if bool(self._blocked.all()):
            scales = self._block_scales
        elif bool(self._blocked.any()):  # mixed shards: the blocked ones re-rounded per row
            rows = self._blocked.nonzero().squeeze(1)
            per_row = Int8Weight(q[rows], self._block_scales[rows]).per_row()
            q[rows], scales[rows] = per_row.q, per_row.scales
        del self.weight, self._scales, self._block_scales, self._blocked
        self.set_weight(q, scales, self.dtype, self._dense_rows)


def quantized_like(layer: Linear, layout: str, *, group_size: int = 32,
                   dtype: torch.dtype = torch.float32, dense_rows: int | None = None) -> nn.Module:
    """The empty quantized layer ("int4" or "int8") that loads in place of ``layer``; with
    ``dense_rows`` it also keeps a bf16 copy for steps of that many rows or more (CPU; int8: bf16)."""
    if layout == "int4":
        return Int4Linear(layer, group_size, dense_rows)
    if layout == "int8":
        return Int8Linear(layer, dtype, dense_rows)
    raise ValueError(f"unknown linear layout {layout!r}")


def _int8_blocks_by_chunks(weight: torch.Tensor, chunk_rows: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """qmatmul.quantize_int8_blocks ``chunk_rows`` rows at a time: its float32 temporaries are
    five copies of what it rounds (Gemma 3's [262144, 640] vocabulary: 3.3 GiB at once)."""
    n, k = weight.shape
    q = torch.empty(n, k, dtype=torch.int8)
    d = torch.empty(n, k // qmatmul.BLOCK, dtype=torch.float32)
    for start in range(0, n, chunk_rows):
        q[start:start + chunk_rows], d[start:start + chunk_rows] = qmatmul.quantize_int8_blocks(
            weight[start:start + chunk_rows])
    return q, d


class LMHead(nn.Module):
    """Vocabulary projection hidden [S, H] -> float32 logits [S, V], tied to the embedding or not.

    ``prepare`` picks the product after loading. With quantized weights, on a CPU where the
    engine's own kernels build (engine/kernels/cpu/qmatmul.py): an int8 copy with one scale per 32
    columns (Q8_0's rounding, 1.06 bytes a weight) for every step, bf16 or fp32 activations, with
    float32 logits straight from the kernel's accumulator (SmolLM2 in fp32 on AVX2: the oneDNN
    product below took 10.5 of a 17 ms decode step, bench/decode_profile.py); else, in bf16,
    torch's int8 per-channel kernel for steps of at most LM_HEAD_INT8_MAX_ROWS rows (1 byte a
    weight more; its logits are rounded to bf16). Float weights in fp32 on a CPU: a oneDNN-blocked
    copy (1.5x faster there than the default BLAS for this wide, short product; 4 bytes a weight
    more). Else the weight itself.
    """

    def __init__(self, hidden_size: int, vocab_size: int, tied: nn.Parameter | None = None):
        super().__init__()
        if tied is not None:
            self.weight = tied  # the embedding's own parameter: loaded once, under its name
        else:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
            self.weight.weight_loader = default_weight_loader
        self.packed_fp32 = None
        self.small_rows: Int8WeightOnlyLinear | None = None
        self.register_buffer("q8_weight", None, persistent=False)  # the native kernel's int8 copy
        self.register_buffer("q8_scales", None, persistent=False)

    @torch.no_grad()
    def prepare(self, *, int8_small_rows: bool) -> None:
        """int8_small_rows: the model runs the quantized fast path (an int8 copy is welcome)."""
        weight = self.weight.detach()
        blocks = getattr(self.weight, "int8_blocks", None)  # the checkpoint's own (embedding_weight_loader)
        self.weight.int8_blocks = None  # packed below or not at all: not kept twice
        self.packed_fp32 = self.small_rows = self.q8_weight = self.q8_scales = None
        if weight.device.type != "cpu":
            return
        if int8_small_rows and weight.dtype in qmatmul.DTYPES and qmatmul.supports(*weight.shape):
            self.q8_weight, self.q8_scales = qmatmul.pack_int8(
                *((blocks.q, blocks.scales) if blocks is not None else _int8_blocks_by_chunks(weight)))
        elif int8_small_rows and weight.dtype == torch.bfloat16 and weight.shape[1] % 16 == 0:
            self.small_rows = Int8WeightOnlyLinear.from_float(weight, dtype=weight.dtype)
        elif weight.dtype == torch.float32 and torch.backends.mkldnn.is_available():
            self.packed_fp32 = weight.to_mkldnn()

    def kernel_weights(self) -> list[torch.Tensor]:
        """The int8 table the native kernel streams each step (engine/memory/weight_arena.py)."""
        return [] if self.q8_weight is None else [self.q8_weight, self.q8_scales]

    def move_kernel_weights(self, place: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Takes ``place(t)``'s copy of each of ``kernel_weights()`` in its stead."""
        if self.q8_weight is not None:
            self.q8_weight, self.q8_scales = place(self.q8_weight), place(self.q8_scales)

    @property
    def extra_bytes(self) -> int:
        """Memory of the oneDNN copy (not a registered tensor; the int8 copy is a submodule)."""
        return 0 if self.packed_fp32 is None else self.weight.numel() * 4

    def forward(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [S, hidden] -> float32 logits [S, vocab]; ``out``: a contiguous float32 [S, vocab]
        the native int8 path writes into (the other paths return a tensor of their own)."""
        if self.q8_weight is not None and hidden.dtype in qmatmul.DTYPES:
            return qmatmul.int8_matmul(hidden if hidden.stride(-1) == 1 else hidden.contiguous(),
                                       self.q8_weight, self.q8_scales, out_dtype=torch.float32, out=out)
        if self.small_rows is not None and hidden.shape[0] <= LM_HEAD_INT8_MAX_ROWS:
            return self.small_rows(hidden).float()
        if self.packed_fp32 is not None:
            out = torch._C._nn.mkldnn_linear(hidden.contiguous().to_mkldnn(), self.packed_fp32, None)
            return out.to_dense()
        return F.linear(hidden, self.weight).float()
