"""Architecture hyper-parameters of a Llama-family checkpoint, however it was stored."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    architecture: str  # "llama", "mistral", "qwen2"
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

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")

    @property
    def kv_bytes_per_token_per_byte_of_dtype(self) -> int:
        """K and V elements stored per token across all layers (multiply by the dtype's size)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim
