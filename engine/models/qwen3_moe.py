"""Qwen3-MoE: Qwen3's attention (per-head Q/K norms) with a sparse mixture-of-experts MLP.

Each token's router (``mlp.gate``, [experts, hidden]) scores every expert; the softmax's top-k
weight the chosen experts' SwiGLU outputs (renormalised to sum 1 when ``norm_topk_prob``).
Experts run batched per step: the step's (token, choice) pairs are sorted by expert, so each
expert multiplies all of its rows at once (one Python iteration per expert that has rows,
never per token). Layers listed in ``mlp_only_layers``, or off the ``decoder_sparse_step``,
keep a dense MLP (ModelConfig.moe_layers).

The checkpoint stores each expert as its own gate/up/down projections
(``mlp.experts.<e>.gate_proj.weight``); they load into one [experts, 2 * inter, hidden] and one
[experts, hidden, inter] tensor (``checkpoint_target``). Experts stay in the activation dtype:
the weight-only quantization passes apply to Linear layers (attention, dense MLPs) only.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from engine.distributed import parallel_state
from engine.layers.activation import SiluAndMul
from engine.layers.layernorm import RMSNorm
from engine.layers.linear import as_float
from engine.models.llama import (LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP,
                                 LlamaModel, embedding, rotary)
from engine.models.model_config import ModelConfig

_EXPERT = re.compile(r"^(.*\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, use_triton: bool):
        super().__init__()
        e, inter, hidden = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
        self.top_k, self.norm_topk_prob, self.inter = cfg.num_experts_per_tok, cfg.norm_topk_prob, inter
        self.gate = nn.Linear(hidden, e, bias=False)  # the router: a torch Linear, never quantized
        self.gate.weight.requires_grad_(False)
        self.gate_up = nn.Parameter(torch.empty(e, 2 * inter, hidden), requires_grad=False)
        self.down = nn.Parameter(torch.empty(e, hidden, inter), requires_grad=False)
        self.gate_up.weight_loader = self.down.weight_loader = self._load_expert
        self.act = SiluAndMul(use_triton)

    def _load_expert(self, param: nn.Parameter, loaded, shard_id) -> None:
        """shard_id: (expert, "gate" | "up" | "down")."""
        expert, part = shard_id
        rows = {"gate": slice(0, self.inter), "up": slice(self.inter, 2 * self.inter),
                "down": slice(None)}[part]
        target = param.data[expert, rows]
        loaded = as_float(loaded)
        if target.shape != loaded.shape:
            raise ValueError(f"expert {expert} {part}: checkpoint shape {tuple(loaded.shape)} != "
                             f"model shape {tuple(target.shape)}")
        target.copy_(loaded)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, hidden] -> (weights [T, k] in x's dtype, experts [T, k]), each row's experts in
        ascending order (the order transformers sums them in)."""
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)  # [T, E]
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        experts, order = experts.sort(dim=-1)
        return weights.gather(-1, order).to(x.dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        t, k = x.shape[0], self.top_k
        weights, experts = self.route(x)
        flat = experts.flatten()  # [T * k], token-major
        by_expert = torch.argsort(flat, stable=True)  # pair indices grouped by expert
        counts = torch.bincount(flat, minlength=self.gate.out_features).tolist()
        rows = x[by_expert // k]  # [T * k, hidden]
        out = torch.empty_like(rows)
        start = 0
        for expert, n in enumerate(counts):
            if n:
                part = slice(start, start + n)
                h = self.act.forward(F.linear(rows[part], self.gate_up[expert]))  # [n, inter]
                out[part] = F.linear(h, self.down[expert])
                start += n
        pairs = torch.empty_like(out)
        pairs[by_expert] = out
        pairs = pairs.view(t, k, -1) * weights[..., None]  # [T, k, hidden]
        total = pairs[:, 0]
        for j in range(1, k):  # in expert order, as transformers adds them
            total = total + pairs[:, j]
        return total


class Qwen3MoeDecoderLayer(LlamaDecoderLayer):
    def __init__(self, cfg: ModelConfig, use_triton: bool, rotary_emb, layer: int):
        nn.Module.__init__(self)  # LlamaDecoderLayer's own would build a dense MLP to drop
        self.self_attn = LlamaAttention(cfg, use_triton, rotary_emb, cfg.sliding_window(layer))
        self.mlp = (SparseMoeBlock(cfg, use_triton) if cfg.moe_layers[layer]
                    else LlamaMLP(cfg, use_triton))
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, use_triton)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, use_triton)


class Qwen3MoeModel(LlamaModel):
    def __init__(self, cfg: ModelConfig, use_triton: bool):
        nn.Module.__init__(self)
        self.embed_tokens = embedding(cfg)
        self.rotary_emb = rotary(cfg, use_triton)
        self.layers = nn.ModuleList(Qwen3MoeDecoderLayer(cfg, use_triton, self.rotary_emb, i)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, use_triton)


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    model_class = Qwen3MoeModel  # experts: engine/models/fused_decode.py's C step declines them

    def __init__(self, cfg: ModelConfig, use_triton: bool = False):
        tp = parallel_state.current()
        if tp is not None and tp.size > 1:
            raise NotImplementedError("Qwen3-MoE does not run tensor parallel yet")
        super().__init__(cfg, use_triton)

    @staticmethod
    def checkpoint_target(name: str) -> tuple[str, tuple[int, str]] | None:
        """An expert's HF tensor -> (our parameter, (expert, part)); None for any other tensor."""
        match = _EXPERT.match(name)
        if match is None:
            return None
        prefix, expert, projection = match.groups()
        part = projection.removesuffix("_proj")
        return f"{prefix}.{'down' if part == 'down' else 'gate_up'}", (int(expert), part)
