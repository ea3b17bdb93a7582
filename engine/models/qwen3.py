"""Qwen3: the Llama layer with an RMSNorm over each query and key head before RoPE (its weights
``self_attn.q_norm`` / ``self_attn.k_norm``; ModelConfig.qk_norm), no q/k/v biases. Its own class,
though the Llama one computes it, so that the family has its file and its name in the registry."""

from __future__ import annotations

from engine.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    pass
