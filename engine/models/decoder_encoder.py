"""A decoder family's model (engine/models/registry.py FAMILIES) run as a causal encoder, for a
decoder embedding checkpoint (Qwen3-Embedding style: engine/models/encoder_config.py
DecoderEmbeddingConfig): each input is one forward from position 0 with a causal mask, and the
final hidden states (after the final norm) go to the pooling (engine/models/pooling.py).

How: the family's own model, unchanged, through its own attention (engine/layers/attention.py
PagedAttention), with a throwaway KV workspace. Every input of the step is a prefill with no
earlier context (``PrefillSeq.context_slots`` None), which PagedAttention answers by attending
causally over the K/V rows it has just computed, never by reading the pool back. So one pool
of [num_tokens, 1, KVH, D] shared by every layer (each layer overwrites it) satisfies the write,
and nothing is kept between steps. Chosen over a separate cache-less attention path: the Q/K
norms, RoPE scaling, GQA, Gemma 3's sliding windows and MoE MLPs are then exactly the code that
generation runs (and that tests/engine/test_model_families.py holds to transformers), at the
cost of one K/V copy per layer. The LM head is dropped: the checkpoint's ``lm_head.weight``, if
any, is skipped, and a checkpoint saved from the bare model (``layers.0...`` with no ``model.``
prefix, as Qwen3-Embedding's is) is named as the family's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from engine.layers.attention import Workspace
from engine.layers.attention_metadata import AttentionMetadata, PrefillSeq
from engine.models.bert import PackedBatch
from engine.models.model_config import ModelConfig

LM_HEAD = "lm_head.weight"


class DecoderEncoder(nn.Module):
    """``causal_lm`` (a family's ...ForCausalLM) without its head: packed inputs -> final hidden
    states. Its parameters keep the family's names (``model.layers.0...``), so the family's
    loader mapping (packed_modules_mapping, checkpoint_target) loads it."""

    def __init__(self, causal_lm: nn.Module):
        super().__init__()
        self.model = causal_lm.model
        self.packed_modules_mapping = getattr(causal_lm, "packed_modules_mapping", {})
        target = getattr(causal_lm, "checkpoint_target", None)
        if target is not None:
            self.checkpoint_target = target
        first = self.model.layers[0].self_attn
        self.num_kv_heads, self.head_dim = first.num_kv_heads, first.head_dim
        self.num_layers = len(self.model.layers)
        self._workspace: Workspace | None = None

    def forward(self, input_ids: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """input_ids: [num_tokens], the step's inputs back to back -> [num_tokens, hidden]."""
        t = input_ids.shape[0]
        dtype = self.model.embed_tokens.weight.dtype
        if self._workspace is None or self._workspace.device != input_ids.device:
            self._workspace = Workspace(input_ids.device)
        kv = self._workspace.pair((t, 1, self.num_kv_heads, self.head_dim), dtype, name="embed-kv")
        prefills, start = [], 0
        for n in batch.lengths:
            prefills.append(PrefillSeq(query_start=start, query_len=n, context_len=n, context_slots=None))
            start += n
        meta = AttentionMetadata(slot_mapping=torch.arange(t, device=input_ids.device),
                                 num_prefill_tokens=t, num_decode_tokens=0, prefills=prefills,
                                 workspace=self._workspace)
        return self.model(input_ids, batch.positions, [kv] * self.num_layers, meta)


def decoder_weights(directory: Path, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors (engine/models/hf_loader.py SafetensorsWeights) named as
    DecoderEncoder's parameters: the LM head skipped, a bare model's names given ``model.``."""
    from engine.models.hf_loader import SafetensorsWeights

    for name, tensor in SafetensorsWeights(directory, config):
        if name == LM_HEAD:
            continue
        yield (name if name.startswith("model.") else f"model.{name}"), tensor
