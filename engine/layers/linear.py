"""Linear layers, each loading checkpoint tensors into its own layout (after nano-vllm's linear.py).

Every parameter carries ``weight_loader(param, loaded, shard_id=None)``: the generic model loader
(engine/models/loader.py) hands it a checkpoint tensor and, for a fused layer, which shard it is.
A new weight format or a parallel layout is a new class (or a pass replacing these modules, as
engine/quantization does), never an edit of the model file.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    """Copy a whole checkpoint tensor (parameters outside linear layers: norms, embeddings)."""
    if shard_id is not None:
        raise ValueError(f"this parameter has no shard {shard_id!r}")
    if param.shape != loaded.shape:
        raise ValueError(f"checkpoint shape {tuple(loaded.shape)} != model shape {tuple(param.shape)}")
    param.data.copy_(loaded)


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

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        """Copy a whole checkpoint tensor (``shard_id`` must be None: this layer is not fused)."""
        default_weight_loader(param, loaded, shard_id)


class MergedLinear(Linear):
    """Several projections of one input fused along the output (gate/up): shard i is rows
    ``sum(output_sizes[:i]) : + output_sizes[i]`` of the weight (and bias)."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False):
        super().__init__(in_features, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)

    def shard_index(self, shard_id) -> int:
        return shard_id

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if shard_id is None:
            return default_weight_loader(param, loaded)
        index = self.shard_index(shard_id)
        start, size = sum(self.output_sizes[:index]), self.output_sizes[index]
        if loaded.shape[0] != size:
            raise ValueError(f"shard {shard_id!r} has {loaded.shape[0]} rows, expected {size}")
        param.data[start:start + size].copy_(loaded.to(param.dtype))


class QKVLinear(MergedLinear):
    """Q, K and V fused: shards "q" [num_heads * head_dim] then "k" and "v" [num_kv_heads * head_dim]."""

    SHARDS = ("q", "k", "v")

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False):
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        super().__init__(hidden_size, [q_size, kv_size, kv_size], bias)

    def shard_index(self, shard_id) -> int:
        return self.SHARDS.index(shard_id)
