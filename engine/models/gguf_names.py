"""GGUF's names against ours: ggml type ids, the block types that load into our int4/int8 layouts
as they are, and GGUF tensor names -> Hugging Face ones. Imports no torch: the loader
(gguf_loader.py) and the memory estimate (engine/memory/estimate.py) read the same tables."""

from __future__ import annotations

import re

# A tensor info's ggml type id -> gguf's name of it (GGMLQuantizationType), for the types we read.
GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K",
              13: "Q5_K", 14: "Q6_K", 30: "BF16"}
# GGUF block type -> the layout it loads into without a float weight, ("int4", group) or
# ("int8", None) (Q4_K: its 32-column sub-blocks are groups of 32; 5- and 6-bit types: int8,
# engine/quantization/gguf.py).
NATIVE_LAYOUTS = {"Q4_0": ("int4", 32), "Q4_1": ("int4", 32), "Q4_K": ("int4", 32),
                  "Q8_0": ("int8", None), "Q5_0": ("int8", None), "Q5_1": ("int8", None),
                  "Q5_K": ("int8", None), "Q6_K": ("int8", None)}
# GGUF tensor name (after "blk.N.") -> HF name (after "model.layers.N.").
LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Per architecture, where its names differ from (or add to) LAYER_TENSORS: Gemma's ffn_norm is
# the norm before the MLP, its post_* norms follow attention and the MLP; both have Q/K norms.
ARCHITECTURE_LAYER_TENSORS = {
    "gemma3": {
        "ffn_norm": "pre_feedforward_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
    },
}
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(gguf_name: str, architecture: str | None = None) -> str | None:
    """The Hugging Face name of a GGUF tensor (of a GGUF ``general.architecture``); None for one
    our models have no counterpart of."""
    if gguf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[gguf_name]
    layer_tensors = {**LAYER_TENSORS, **ARCHITECTURE_LAYER_TENSORS.get(architecture, {})}
    match = LAYER_NAME.fullmatch(gguf_name)
    if match is None or match.group(2) not in layer_tensors:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{layer_tensors[part]}.{kind}"
