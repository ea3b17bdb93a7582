"""Phi-3: the Llama layer, its checkpoint already fused (``self_attn.qkv_proj`` as [q; k; v] rows,
``mlp.gate_up_proj`` as [gate; up]), the layout of our QKVLinear and MergedLinear: each tensor
loads whole through the layer's weight_loader (shard None). LongRoPE ("su") scaling is a RoPE
table like any other (engine/layers/rope_scaling.py); a sliding_window applies to every layer."""

from __future__ import annotations

from engine.distributed import parallel_state
from engine.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    packed_modules_mapping = {}  # the checkpoint's names are our fused layers' own

    def __init__(self, cfg, use_triton: bool = False):
        tp = parallel_state.current()
        if tp is not None and tp.size > 1:  # a fused tensor would be split as one shard
            raise NotImplementedError("Phi-3 does not run tensor parallel yet")
        super().__init__(cfg, use_triton)
