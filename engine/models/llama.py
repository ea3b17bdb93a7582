"""Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM2) over a flattened token batch, and
the blocks the other families build from (attention with optional per-head Q/K norms and a
sliding window, gated MLP, embedding, LM head with soft-capping; engine/models/registry.py).

Q/K/V and gate/up projections are fused into one matrix each, so a layer runs four GEMMs;
``packed_modules_mapping`` tells the loader (engine/models/loader.py) which fused layer and shard
each Hugging Face tensor goes to, and the layer's ``weight_loader`` places it (engine/layers/linear.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.attention_metadata import AttentionMetadata
from engine.distributed import parallel_state
from engine.layers.activation import SiluAndMul
from engine.layers.attention import PagedAttention
from engine.layers.layernorm import RMSNorm
from engine.layers.linear import LMHead, Linear, MergedLinear, QKVLinear, embedding_weight_loader
from engine.layers.parallel import ColumnSplit, RowSplit, VocabParallelEmbedding, VocabSplit
from engine.layers.rotary import RotaryEmbedding
from engine.models.model_config import ModelConfig

KVCache = tuple[torch.Tensor, torch.Tensor]

class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, use_triton: bool, rotary_emb: RotaryEmbedding,
                 sliding_window: int | None = None, norm_class: type[nn.Module] = RMSNorm):
        super().__init__()
        # Tensor parallel: this rank's heads (engine/layers/parallel.py); size 1: all of them.
        self.tp = tp = parallel_state.current()
        self.tp_size, rank = (tp.size, tp.rank) if tp else (1, 0)
        self.num_heads = cfg.num_attention_heads // self.tp_size
        self.num_kv_heads = cfg.num_key_value_heads // self.tp_size
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVLinear(cfg.hidden_size, self.head_dim, self.num_heads, self.num_kv_heads,
                                  bias=cfg.attention_bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, cfg.hidden_size)
        if self.tp_size > 1:
            self.qkv_proj.tp_split, self.o_proj.tp_split = ColumnSplit(rank, self.tp_size), RowSplit(
                rank, self.tp_size)
        self.rotary_emb = rotary_emb  # the model's one table, shared by every layer
        # Qwen3, Gemma 3: each query and key head normalised before RoPE.
        self.q_norm = norm_class(self.head_dim, cfg.rms_norm_eps, use_triton) if cfg.qk_norm else None
        self.k_norm = norm_class(self.head_dim, cfg.rms_norm_eps, use_triton) if cfg.qk_norm else None
        scale = cfg.query_pre_attn_scalar ** -0.5 if cfg.query_pre_attn_scalar else None
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, use_triton,
                                   scale=scale, sliding_window=sliding_window)
        self.split = self.qkv_proj.output_sizes  # [q, kv, kv]
        self.qk_heads = self.num_heads + self.num_kv_heads

    def forward(self, positions: torch.Tensor, x: torch.Tensor, kv_cache: KVCache,
                meta: AttentionMetadata, rope: torch.Tensor | None) -> torch.Tensor:
        """rope: this step's rotary tables (RotaryEmbedding.prepare), None on the Triton path."""
        qkv = self.qkv_proj(x)  # [T, (H + 2 KVH) * D]
        t, h, d = x.shape[0], self.num_heads, self.head_dim
        if self.q_norm is not None:
            q, k, v = self._normed_rotated(positions, qkv.view(t, -1, d), rope)
        elif rope is None:
            q, k, v = qkv.split(self.split, dim=-1)  # [T, H*D], [T, KVH*D] x2
            q, k = self.rotary_emb(positions, q.contiguous(), k.contiguous())
            q, k, v = q.view(t, h, d), k.view(t, -1, d), v.contiguous().view(t, -1, d)
        else:
            # Q and K heads rotated together; q, k, v stay views of the two outputs.
            heads = qkv.view(t, -1, d)  # [T, H + 2 KVH, D]
            qk = self.rotary_emb.rotate(heads[:, :self.qk_heads], rope)  # [T, H + KVH, D]
            q, k, v = qk[:, :h], qk[:, h:], heads[:, self.qk_heads:]
        o = self.attn.forward(q, k, v, kv_cache, meta)  # [T, H, D]
        out = self.o_proj(o.view(t, -1))  # [T, hidden], this rank's part when tensor parallel
        return self.tp.all_reduce(out) if self.tp_size > 1 else out

    def _normed_rotated(self, positions, heads: torch.Tensor, rope):
        """heads: [T, H + 2 KVH, D] -> q [T, H, D], k [T, KVH, D] normalised then rotated, v."""
        t, h, d = heads.shape[0], self.num_heads, self.head_dim
        q = self.q_norm.forward(heads[:, :h].reshape(-1, d)).view(t, h, d)
        k = self.k_norm.forward(heads[:, h:self.qk_heads].reshape(-1, d)).view(t, -1, d)
        v = heads[:, self.qk_heads:]
        if rope is None:
            q, k = self.rotary_emb(positions, q.view(t, -1), k.view(t, -1))
            return q.view(t, h, d), k.view(t, -1, d), v.contiguous()
        return self.rotary_emb.rotate(q, rope), self.rotary_emb.rotate(k, rope), v


class LlamaMLP(nn.Module):
    """down(act(gate) * up); act: SiLU (Llama) or tanh-approximated GELU (Gemma)."""

    def __init__(self, cfg: ModelConfig, use_triton: bool, act_class: type[nn.Module] = SiluAndMul):
        super().__init__()
        self.tp = tp = parallel_state.current()
        self.tp_size, rank = (tp.size, tp.rank) if tp else (1, 0)
        inter = cfg.intermediate_size // self.tp_size
        self.gate_up_proj = MergedLinear(cfg.hidden_size, [inter, inter])
        self.down_proj = Linear(inter, cfg.hidden_size)
        self.act = act_class(use_triton)
        if self.tp_size > 1:
            self.gate_up_proj.tp_split, self.down_proj.tp_split = ColumnSplit(
                rank, self.tp_size), RowSplit(rank, self.tp_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(self.act.forward(self.gate_up_proj(x)))  # [T, hidden]
        return self.tp.all_reduce(out) if self.tp_size > 1 else out


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, use_triton: bool, rotary_emb: RotaryEmbedding, layer: int):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, use_triton, rotary_emb, cfg.sliding_window(layer))
        self.mlp = LlamaMLP(cfg, use_triton)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, use_triton)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, use_triton)

    def forward(self, positions, x, residual, kv_cache, meta, rope):
        # The layer, its norms, attention and MLP are called through .forward (so is the layer):
        # nn.Module.__call__ costs ~0.5 us, 8 a layer a step. The projections keep __call__, so
        # hooks on them (tests, debugging) still see every product.
        if residual is None:
            residual = x
            x = self.input_layernorm.forward(x)
        else:
            x, residual = self.input_layernorm.forward(x, residual)
        x = self.self_attn.forward(positions, x, kv_cache, meta, rope)
        x, residual = self.post_attention_layernorm.forward(x, residual)
        return self.mlp.forward(x), residual


def embedding(cfg: ModelConfig) -> nn.Module:
    """The token embedding: this rank's vocabulary slice when tensor parallel."""
    tp = parallel_state.current()
    if tp is not None:
        return VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
    # the table the checkpoint fills (not N(0, 1) first: 1.1 s for Gemma 3's 262,144 x 640)
    embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
    embed.weight.requires_grad_(False)
    embed.weight.weight_loader = embedding_weight_loader
    return embed


def rotary(cfg: ModelConfig, use_triton: bool, base: float | None = None,
           scaling: dict | None = None) -> RotaryEmbedding:
    """The model's RoPE table: by default with the checkpoint's base, scaling and GGUF factors;
    given a base (Gemma's local layers), with that base and ``scaling`` only."""
    if base is not None:
        return RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, base, scaling, use_triton)
    return RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                           cfg.rope_scaling, use_triton, freq_factors=cfg.rope_freq_factors)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, use_triton: bool):
        super().__init__()
        self.embed_tokens = embedding(cfg)
        self.rotary_emb = rotary(cfg, use_triton)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, use_triton, self.rotary_emb, i)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, use_triton)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The tokens' embeddings as the first layer takes them (engine/models/fused_decode.py too)."""
        return self.embed_tokens(input_ids)

    def forward(self, input_ids, positions, kv_caches: list[KVCache], meta) -> torch.Tensor:
        x = self.embed(input_ids)
        rope = self.rotary_emb.prepare(positions, x.dtype)  # once per step, not per layer
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            x, residual = layer.forward(positions, x, residual, kv_cache, meta, rope)
        x, _ = self.norm(x, residual)
        return x


class LlamaForCausalLM(nn.Module):
    # HF projection name -> (our fused layer, its shard)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }
    model_class: type[nn.Module] = LlamaModel

    def __init__(self, cfg: ModelConfig, use_triton: bool = False):
        super().__init__()
        self.config = cfg
        self.model = self.model_class(cfg, use_triton)
        tied = self.model.embed_tokens.weight if cfg.tie_word_embeddings else None
        self.tp = tp = parallel_state.current()
        self.tp_size = tp.size if tp else 1
        # Tensor parallel: this rank's vocabulary slice, its logits gathered on rank 0.
        self.lm_head = LMHead(cfg.hidden_size, cfg.vocab_size // self.tp_size, tied)
        if tp is not None and tied is None:
            self.lm_head.tp_split = VocabSplit(tp.rank, tp.size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[KVCache], meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: [T] -> hidden states [T, hidden]."""
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden: [S, hidden] -> float32 logits [S, vocab] (engine/layers/linear.LMHead); tensor
        parallel: on rank 0, None on the others. Soft-capped (Gemma) as cap * tanh(x / cap).
        ``out``: a float32 [S, vocab] the head may write into (LMHead.forward), not tensor parallel."""
        if self.tp_size > 1:
            logits = self.tp.gather_vocab(self.lm_head(hidden))
        else:
            logits = self.lm_head(hidden, out=out)
        cap = self.config.final_logit_softcapping
        if cap and logits is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits
