"""Architecture hyper-parameters of a decoder checkpoint, however it was stored (the families:
engine/models/registry.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    architecture: str  # our family name (engine/models/registry.py FAMILIES)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # HF form, e.g. {"rope_type": "llama3", "factor": 8.0, ...}
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str | None = None  # the dtype the checkpoint was saved in, if it says
    # A GGUF's rope_freqs tensor: each rotary frequency is divided by its factor (Llama 3.1).
    rope_freq_factors: list[float] | None = None
    qk_norm: bool = False  # RMSNorm over each query and key head before RoPE (Qwen3, Gemma 3)
    # Per layer: the number of most recent tokens it attends to, None for all; empty: all full.
    layer_sliding_windows: list[int | None] = field(default_factory=list)
    # Gemma 3: the RoPE base of the sliding-window layers, the attention scale's
    # 1 / sqrt(query_pre_attn_scalar), tanh soft-capping of the final logits.
    local_rope_theta: float | None = None
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None
    # Mixture of experts (Qwen3-MoE): experts, how many each token uses, each one's intermediate
    # size, whether the chosen weights are renormalised, and per layer whether its MLP is sparse.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.layer_sliding_windows and len(self.layer_sliding_windows) != self.num_hidden_layers:
            raise ValueError(f"{len(self.layer_sliding_windows)} layer windows for "
                             f"{self.num_hidden_layers} layers")
        if self.moe_layers and (len(self.moe_layers) != self.num_hidden_layers or not (
                0 < self.num_experts_per_tok <= self.num_experts)):
            raise ValueError(f"mixture of experts: {self.num_experts_per_tok} of {self.num_experts} "
                             f"experts a token, {len(self.moe_layers)} layer flags for "
                             f"{self.num_hidden_layers} layers")

    def sliding_window(self, layer: int) -> int | None:
        """How many most recent tokens layer ``layer`` attends to; None: all of them."""
        return self.layer_sliding_windows[layer] if self.layer_sliding_windows else None

    @property
    def kv_bytes_per_token_per_byte_of_dtype(self) -> int:
        """K and V elements stored per token across all layers (multiply by the dtype's size)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim
