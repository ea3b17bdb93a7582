"""BERT-family encoders (BERT, MiniLM, ...) for embeddings: one forward over a packed batch, no KV cache.

The step's sequences are packed back to back ([num_tokens, hidden], no padding) for every GEMM
and norm; only attention sees them padded ([num_seqs, heads, max_len, head_dim], the padded keys
masked), so a batch of mixed lengths does no projection work on padding. Q/K/V are fused into one
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
    """Where each sequence of a step lies in the packed token dimension, and its padded view.

    ``gather``: [num_seqs * max_len] packed row of each padded slot (a pad slot repeats its
    sequence's first token, masked out as a key); ``scatter``: [num_tokens] padded slot of each
    packed row; ``key_mask``: [num_seqs, 1, 1, max_len], True where a key is a real token. All
    None when every sequence has the same length (the packed tensor is the padded one then).
    """

    lengths: list[int]
    max_len: int
    positions: torch.Tensor  # [num_tokens]
    gather: torch.Tensor | None = None
    scatter: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None

    @classmethod
    def build(cls, lengths: list[int], device: torch.device) -> PackedBatch:
        max_len = max(lengths)
        positions = torch.cat([torch.arange(n) for n in lengths]).to(device)
        if all(n == max_len for n in lengths):
            return cls(lengths, max_len, positions)
        starts = torch.tensor([0] + lengths[:-1]).cumsum(0)  # [num_seqs]
        lens = torch.tensor(lengths)
        slot = torch.arange(max_len)
        valid = slot[None, :] < lens[:, None]  # [num_seqs, max_len]
        gather = torch.where(valid, starts[:, None] + slot[None, :], starts[:, None]).flatten()
        scatter = (torch.arange(len(lengths))[:, None] * max_len + slot[None, :])[valid]
        return cls(lengths, max_len, positions, gather.to(device), scatter.to(device),
                   valid[:, None, None, :].to(device))


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.qkv_proj = QKVLinear(cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads,
                                  cfg.num_attention_heads, bias=True)
        self.output = BertOutput(cfg.hidden_size, cfg.hidden_size, cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        qkv = project(self.qkv_proj, x)  # [T, 3 * H * D]
        b, n, h, d = len(batch.lengths), batch.max_len, self.num_heads, self.head_dim
        padded = qkv if batch.gather is None else qkv.index_select(0, batch.gather)
        q, k, v = padded.view(b, n, 3, h, d).permute(2, 0, 3, 1, 4)  # [B, heads, max_len, D] each
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=batch.key_mask)
        o = o.transpose(1, 2).reshape(b * n, h * d)  # [B * max_len, H * D]
        if batch.scatter is not None:
            o = o.index_select(0, batch.scatter)  # [T, H * D]
        return self.output(o, x)


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
