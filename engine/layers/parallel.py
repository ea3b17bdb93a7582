"""Tensor-parallel pieces of the model: how each rank takes its slice of a checkpoint tensor,
and the vocabulary-parallel embedding.

The parallel layers are the ordinary ones (engine/layers/linear.py) built with per-rank sizes
and carrying a ``tp_split``: the loader (engine/models/loader.load_weights) passes every
checkpoint tensor through it before the layer's weight_loader sees it, so float and quantized
layouts (Int4Linear / Int8Linear, swapped in before loading) shard the same way, before packing:

- ``ColumnSplit``: rank r keeps rows r*n/size : (r+1)*n/size of each fused shard (q, k, v,
  gate, up: whole heads and MLP columns) -- no communication; the output is this rank's slice.
- ``RowSplit``: rank r keeps the same slice of the input columns (o_proj, down_proj); the
  model all-reduces the partial outputs. An int8 layer quantizes the whole float weight first
  and slices its codes, so each row's scale is the one TP=1 computes; int4 groups never straddle
  a slice (checked), so slicing then quantizing is identical to TP=1.
- ``VocabSplit``: rows of the embedding and LM head, one vocabulary slice per rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.quantization.int4 import Int4Weight
from engine.quantization.int8 import Int8Weight, quantize_int8


def _slice(loaded, dim: int, rank: int, size: int, what: str):
    """Slice ``rank`` of ``size`` equal slices of a float tensor or an Int4/Int8Weight along dim."""
    total = loaded.shape[dim]
    if total % size:
        raise ValueError(f"{what}: {total} {'rows' if dim == 0 else 'columns'} do not divide by "
                         f"tensor_parallel_size {size}")
    n = total // size
    start = rank * n
    if isinstance(loaded, Int8Weight):
        if dim == 0:
            return loaded.map_rows(lambda t: t.narrow(0, start, n))
        return Int8Weight(loaded.q.narrow(1, start, n).contiguous(), loaded.scales)
    if isinstance(loaded, Int4Weight):
        if dim == 0:
            return loaded.map_rows(lambda t: t.narrow(0, start, n))
        g = loaded.group_size
        if n % g:
            raise ValueError(f"{what}: each of {size} ranks would hold {n} input columns, not a "
                             f"multiple of the int4 group size {g}")
        return Int4Weight(loaded.codes.narrow(1, start, n).contiguous(),
                          loaded.scales.narrow(1, start // g, n // g).contiguous(),
                          loaded.zeros.narrow(1, start // g, n // g).contiguous(), g)
    return loaded.narrow(dim, start, n).contiguous()


class ColumnSplit:
    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    def __call__(self, loaded, shard_id, module: nn.Module):
        shards = getattr(module, "shards", None) or getattr(module, "shard_table", {})
        if shard_id is None and len(shards) > 1:  # a whole fused weight: slice each of its parts
            if isinstance(loaded, (Int4Weight, Int8Weight)):
                raise ValueError("a whole fused quantized weight cannot be sharded; load its parts")
            sizes = [n * self.size for k, (_, n) in shards.items() if k is not None]
            return torch.cat([_slice(part, 0, self.rank, self.size, "fused weight")
                              for part in loaded.split(sizes, dim=0)], dim=0)
        return _slice(loaded, 0, self.rank, self.size, f"shard {shard_id!r}")


class RowSplit:
    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    def __call__(self, loaded, shard_id, module: nn.Module):
        if isinstance(loaded, torch.Tensor) and loaded.dim() == 1:
            raise ValueError("a row-parallel layer has no bias")
        from engine.layers.linear import Int8Linear
        if isinstance(module, Int8Linear) and not isinstance(loaded, (Int4Weight, Int8Weight)):
            loaded = Int8Weight(*quantize_int8(loaded))  # every row's scale over all its columns
        return _slice(loaded, 1, self.rank, self.size, "input columns")


class VocabSplit(ColumnSplit):
    """The embedding's (or untied LM head's) rows: one vocabulary slice per rank."""


class VocabParallelEmbedding(nn.Module):
    """Token ids [T] -> [T, hidden] from this rank's vocabulary slice, summed over the ranks."""

    def __init__(self, vocab_size: int, hidden_size: int, tp):
        super().__init__()
        self.tp = tp  # engine/distributed/parallel_state.TensorParallelGroup
        self.per_rank = vocab_size // tp.size
        self.start = tp.rank * self.per_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, hidden_size), requires_grad=False)
        self.tp_split = VocabSplit(tp.rank, tp.size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.per_rank)  # [T] ids another rank holds
        out = F.embedding(local.masked_fill(outside, 0), self.weight)  # [T, hidden]
        out.masked_fill_(outside[:, None], 0)
        return self.tp.all_reduce(out)
