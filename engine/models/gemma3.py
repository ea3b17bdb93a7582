"""Gemma 3 text decoder (Gemma3ForCausalLM, model_type gemma3_text), from the shared Llama blocks.

What differs from Llama: embeddings scaled by sqrt(hidden); RMSNorm scaling by (1 + weight), in
float32; four norms a layer (before and after attention, before and after the MLP), the residual
added after the second of each pair; per-head Q/K norms; GeGLU (tanh GELU) MLP; attention scaled by
1 / sqrt(query_pre_attn_scalar); interleaved layers, most attending to the last ``sliding_window``
tokens with RoPE base ``rope_local_base_freq``, every few to everything with ``rope_theta`` (and its
scaling); a tied head whose logits may be soft-capped (LlamaForCausalLM.compute_logits).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.activation import GeluAndMul
from engine.layers.layernorm import GemmaRMSNorm
from engine.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, embedding, rotary
from engine.models.model_config import ModelConfig


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, use_triton: bool, rotary_emb, layer: int):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, use_triton, rotary_emb, cfg.sliding_window(layer),
                                        norm_class=GemmaRMSNorm)
        self.mlp = LlamaMLP(cfg, use_triton, act_class=GeluAndMul)
        norm = lambda: GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # noqa: E731
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()

    def forward(self, positions, x, kv_cache, meta, rope) -> torch.Tensor:
        h = self.self_attn.forward(positions, self.input_layernorm.forward(x), kv_cache, meta, rope)
        x = x + self.post_attention_layernorm.forward(h)
        h = self.mlp.forward(self.pre_feedforward_layernorm.forward(x))
        return x + self.post_feedforward_layernorm.forward(h)


class Gemma3Model(nn.Module):
    def __init__(self, cfg: ModelConfig, use_triton: bool):
        super().__init__()
        self.embed_tokens = embedding(cfg)
        self.hidden_size = cfg.hidden_size
        self.rotary_emb = rotary(cfg, use_triton)  # global layers: rope_theta and its scaling
        self.local_rotary_emb = rotary(cfg, use_triton, base=cfg.local_rope_theta)
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(cfg, use_triton, self.local_rotary_emb if cfg.sliding_window(i)
                               else self.rotary_emb, i) for i in range(cfg.num_hidden_layers))
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embeddings scaled by sqrt(hidden): transformers multiplies by it held as a float32
        tensor, cast to the dtype."""
        x = self.embed_tokens(input_ids)
        return x * torch.tensor(self.hidden_size ** 0.5, dtype=torch.float32).to(x.dtype)

    def forward(self, input_ids, positions, kv_caches, meta) -> torch.Tensor:
        x = self.embed(input_ids)
        ropes = {id(r): r.prepare(positions, x.dtype) for r in (self.rotary_emb, self.local_rotary_emb)}
        for layer, kv_cache in zip(self.layers, kv_caches):
            x = layer.forward(positions, x, kv_cache, meta, ropes[id(layer.self_attn.rotary_emb)])
        return self.norm.forward(x)


class Gemma3ForCausalLM(LlamaForCausalLM):
    packed_modules_mapping = LlamaForCausalLM.packed_modules_mapping
    model_class = Gemma3Model
