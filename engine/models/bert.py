"""BERT-family encoders (BERT, MiniLM, ...) for embeddings: one forward over a packed batch, no KV cache.

The step's sequences are packed back to back ([num_tokens, hidden], no padding) for every GEMM
and norm, and attention runs on each sequence's own rows, so a batch of mixed lengths does no
work on padding. Q/K/V are fused into one
matrix; ``packed_modules_mapping`` tells the loader (engine/models/loader.py) where each Hugging
Face tensor goes. Parameter names follow transformers' ``BertModel`` (no ``bert.`` prefix:
engine/models/encoder_config.py strips it, and skips the pooler and task heads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.linear import Linear, QKVLinear
from engine.models.encoder_config import EncoderConfig


def project(linear: Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)`` in the weight's dtype, back in x's: the residual stream, norms and softmax
    stay float32 while a bf16 model multiplies in bf16 (min cosine to float32 over 256 MiniLM
    sentences 0.99994 with everything in bf16, see the commit that made this)."""
    return linear(x.to(linear.weight.dtype)).to(x.dtype)


@dataclass
class PackedBatch:
    """The step's sequences back to back in the token dimension: each one's length, and every
    token's position within its sequence."""

    lengths: list[int]
    positions: torch.Tensor  # [num_tokens]

    @classmethod
    def build(cls, lengths: list[int], device: torch.device) -> PackedBatch:
        return cls(lengths, torch.cat([torch.arange(n) for n in lengths]).to(device))


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.qkv_proj = QKVLinear(cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads,
                                  cfg.num_attention_heads, bias=True)
        self.output = BertOutput(cfg.hidden_size, cfg.hidden_size, cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        qkv = project(self.qkv_proj, x)  # [T, 3 * H * D]
        h, d = self.num_heads, self.head_dim
        # One attention call per sequence, on its own rows: no padding, no mask. Against one
        # padded call with a key mask: 28-41 ms vs 115-123 ms for 32 sentences of 10-142 tokens
        # (MiniLM's heads, 1 thread), the padded call paying for the longest sentence 32 times.
        outs = []
        for part in qkv.split(batch.lengths):  # [L, 3 * H * D]
            q, k, v = part.view(1, -1, 3, h, d).permute(2, 0, 3, 1, 4)  # [1, H, L, D] each
            o = F.scaled_dot_product_attention(q, k, v)
            outs.append(o[0].transpose(0, 1).reshape(-1, h * d))
        return self.output(torch.cat(outs) if len(outs) > 1 else outs[0], x)


class BertOutput(nn.Module):
    """dense, then LayerNorm over (dense + residual): BERT's post-norm sublayer end."""

    def __init__(self, in_features: int, hidden_size: int, eps: float):
        super().__init__()
        self.dense = Linear(in_features, hidden_size, bias=True)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(project(self.dense, x) + residual)


class BertLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.attention = BertSelfAttention(cfg)
        self.intermediate = nn.Module()
        self.intermediate.dense = Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.output = BertOutput(cfg.intermediate_size, cfg.hidden_size, cfg.layer_norm_eps)
        self.approximate = "tanh" if cfg.hidden_act in ("gelu_new", "gelu_pytorch_tanh") else "none"

    def forward(self, x: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        x = self.attention(x, batch)
        hidden = F.gelu(project(self.intermediate.dense, x), approximate=self.approximate)
        return self.output(hidden, x)


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # One segment: token type 0 throughout, as sentence-transformers encodes a single text.
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.LayerNorm(x + self.token_type_embeddings.weight[0])


class BertModel(nn.Module):
    packed_modules_mapping = {
        "attention.self.query": ("attention.qkv_proj", "q"),
        "attention.self.key": ("attention.qkv_proj", "k"),
        "attention.self.value": ("attention.qkv_proj", "v"),
    }

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """input_ids: [num_tokens], the step's sequences back to back -> [num_tokens, hidden]."""
        x = self.embeddings(input_ids, batch.positions)
        for layer in self.encoder.layer:
            x = layer(x, batch)
        return x
