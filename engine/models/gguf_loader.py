"""GGUF files (llama.cpp): metadata -> ModelConfig, tensors -> HF layout: float32, or kept in
their own precision (Q4_0/Q4_1/Q4_K -> Int4Weight; Q8_0, Q5_0 -> Int8Weight in blocks of 32 as
they are, other 5- and 6-bit types rounded into such blocks) for the tensors the loader asks."""

from __future__ import annotations

from functools import lru_cache
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from gguf.quants import dequantize

from engine.errors import ModelLoadError
from engine.models.model_config import ModelConfig
from engine.models.registry import supported_architecture
from engine.models.gguf_file import GGUFFile
from engine.models.gguf_names import NATIVE_LAYOUTS, hf_name
from engine.quantization.gguf import int8_blocks, q4_k_to_int4, q4_to_int4
from engine.quantization.int4 import Int4Weight
from engine.quantization.int8 import Int8Weight

# llama.cpp's converter reorders Q/K rows for its interleaved RoPE only for these architectures.
PERMUTED_QK_ARCHITECTURES = ("llama",)
ROPE_FREQS = "rope_freqs.weight"
# What llama.cpp's Gemma 3 graph fixes rather than stores: every sixth layer global, the others
# attending to `attention.sliding_window` tokens with RoPE base 10,000 (transformers' GGUF load
# takes the same from Gemma3TextConfig's defaults).
GEMMA3_SLIDING_WINDOW_PATTERN = 6
GEMMA3_LOCAL_ROPE_THETA = 10_000.0


def hf_tensor_name(gguf_name: str, architecture: str | None = None) -> str:
    name = hf_name(gguf_name, architecture)
    if name is None:
        raise ModelLoadError(f"GGUF tensor {gguf_name!r} has no counterpart in our models")
    return name


def _open(path: Path) -> GGUFFile:
    try:
        return _cached_reader(str(path.resolve()), path.stat().st_mtime_ns)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read GGUF file {str(path)!r}: {exc}") from exc


@lru_cache(maxsize=1)
def _cached_reader(path: str, mtime_ns: int) -> GGUFFile:
    # Config and weights loading both read it; forget_readers() drops its memory map once the
    # model is loaded.
    return GGUFFile(path)


def forget_readers() -> None:
    _cached_reader.cache_clear()


def _field(reader: GGUFFile, key: str, default=None):
    return reader.field(key, default)


def _float(value) -> float:
    """GGUF stores float32; the shortest decimal that round-trips it (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(value)))


def _single(value, key: str) -> int:
    """Per-layer arrays (e.g. head_count_kv) are allowed when every layer agrees."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ModelLoadError(f"GGUF {key} varies per layer ({value}); not supported")
        value = value[0]
    return int(value)


def _rope_scaling(reader: GGUFFile, arch: str) -> dict | None:
    kind = _field(reader, f"{arch}.rope.scaling.type")
    factor = _field(reader, f"{arch}.rope.scaling.factor")
    if kind is None and _field(reader, f"{arch}.rope.scale_linear") is not None:
        kind, factor = "linear", _field(reader, f"{arch}.rope.scale_linear")
    if kind in (None, "none"):
        return None
    scaling = {"rope_type": kind, "factor": _float(factor)}
    original = _field(reader, f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    if kind not in ("linear", "yarn"):
        raise ModelLoadError(f"GGUF rope scaling type {kind!r} is not supported")
    return scaling


def load_gguf_config(path: Path) -> ModelConfig:
    reader = _open(path)
    gguf_arch = _field(reader, "general.architecture")
    architecture = supported_architecture(gguf_arch, where=f"GGUF file {str(path)!r}", gguf=True)
    tensor_names = {tensor.name for tensor in reader.tensors}

    if "blk.0.attn_output.bias" in tensor_names:
        raise ModelLoadError(f"GGUF file {str(path)!r}: an attn_output bias is not supported")

    def key(name: str, default=None):
        value = _field(reader, f"{gguf_arch}.{name}", default)
        if value is None:
            raise ModelLoadError(f"GGUF file {str(path)!r} lacks {gguf_arch}.{name}")
        return value

    hidden_size = int(key("embedding_length"))
    num_heads = _single(key("attention.head_count"), "attention.head_count")
    num_kv_heads = _single(key("attention.head_count_kv", num_heads), "attention.head_count_kv")
    head_dim = int(key("attention.key_length", hidden_size // num_heads))
    rotary_dim = int(key("rope.dimension_count", head_dim))
    if rotary_dim != head_dim:
        raise ModelLoadError(
            f"GGUF file {str(path)!r}: partial rotary ({rotary_dim} of {head_dim}) not supported")
    vocab_size = _field(reader, f"{gguf_arch}.vocab_size") or reader.count("tokenizer.ggml.tokens")
    if vocab_size is None:
        vocab_size = int(next(t.shape[-1] for t in reader.tensors if t.name == "token_embd.weight"))
    # A chat model's end-of-turn token (Llama 3's <|eot_id|>) stops generation like eos does.
    # Llama 3.1's rope scaling comes as precomputed per-frequency factors (each frequency is
    # divided by its factor, as llama.cpp does), not as the HF rope_scaling parameters.
    freqs = next((t for t in reader.tensors if t.name == ROPE_FREQS), None)
    freq_factors = None if freqs is None else [
        float(f) for f in dequantize(freqs.data, freqs.tensor_type).reshape(-1)]
    if freq_factors is not None and len(freq_factors) != rotary_dim // 2:
        raise ModelLoadError(f"GGUF file {str(path)!r}: {ROPE_FREQS} has {len(freq_factors)} "
                             f"factors for {rotary_dim // 2} rotary frequencies")
    eos_ids = [_field(reader, f"tokenizer.ggml.{name}_token_id") for name in ("eos", "eot", "eom")]
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    try:
        return ModelConfig(
            architecture=architecture,
            vocab_size=int(vocab_size),
            hidden_size=hidden_size,
            intermediate_size=_single(key("feed_forward_length"), "feed_forward_length"),
            num_hidden_layers=int(key("block_count")),
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_float(key("attention.layer_norm_rms_epsilon")),
            rope_theta=_float(key("rope.freq_base", 10000.0)),
            rope_scaling=_rope_scaling(reader, gguf_arch),
            max_position_embeddings=int(key("context_length")),
            tie_word_embeddings="output.weight" not in tensor_names,
            attention_bias="blk.0.attn_q.bias" in tensor_names,
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=list(dict.fromkeys(int(i) for i in eos_ids if i is not None)),
            torch_dtype=None,  # tensors are quantized; we dequantize to float32
            rope_freq_factors=freq_factors,
            **_gemma3_fields(key, int(key("block_count")), head_dim) if gguf_arch == "gemma3" else {},
        )
    except ValueError as exc:
        raise ModelLoadError(f"GGUF file {str(path)!r}: {exc}") from exc


def _gemma3_fields(key, num_layers: int, head_dim: int) -> dict:
    window = int(key("attention.sliding_window"))
    pattern = GEMMA3_SLIDING_WINDOW_PATTERN
    return dict(qk_norm=True, local_rope_theta=GEMMA3_LOCAL_ROPE_THETA,
                layer_sliding_windows=[window if (i + 1) % pattern else None for i in range(num_layers)],
                query_pre_attn_scalar=head_dim)  # llama.cpp scales by 1/sqrt(head_dim)


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's convert_hf_to_gguf `permute` of Q/K rows (same as transformers' GGUF loader).

    llama.cpp stores each head's rows as interleaved (x0, x1) rotary pairs; HF keeps the two
    rotary halves contiguous. weight: [num_heads * head_dim, ...] (a bias is [num_heads * head_dim]).
    """
    half = weight.shape[0] // num_heads // 2
    # [num_heads, half, 2, ...] -> [num_heads, 2, half, ...]
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


class GGUFWeights:
    """Tensors of a GGUF file, each dequantized to float32 only when iterated."""

    def __init__(self, path: Path, config: ModelConfig):
        self._reader = _open(path)
        self._config = config
        self._permutes_qk = _field(self._reader, "general.architecture") in PERMUTED_QK_ARCHITECTURES
        # rope_freqs is part of the config (load_gguf_config), not a weight
        arch = _field(self._reader, "general.architecture")
        self._tensors = [(hf_tensor_name(t.name, arch), t) for t in self._reader.tensors
                         if t.name != ROPE_FREQS]
        # llama.cpp stores Gemma's norm weights plus one (its norms scale by the weight itself)
        self._norms_plus_one = arch == "gemma3"

    def __len__(self) -> int:
        return len(self._tensors)

    def native_layouts(self) -> dict[str, tuple]:
        """HF weight name -> ("int4", 32) or ("int8", None) for each 2-D tensor stored in blocks
        that load into our layouts as they are; other tensors are absent (float)."""
        return {name: NATIVE_LAYOUTS[t.tensor_type.name] for name, t in self._tensors
                if t.tensor_type.name in NATIVE_LAYOUTS and name.endswith(".weight")
                and len(t.shape) == 2}

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.iterate()

    def iterate(self, keep_quantized: frozenset[str] = frozenset()
                ) -> Iterator[tuple[str, torch.Tensor | Int4Weight | Int8Weight]]:
        """Every tensor in HF layout: those named in ``keep_quantized`` (a subset of
        native_layouts()) as Int4Weight / Int8Weight straight from their blocks, the rest
        dequantized to float32."""
        for name, tensor in self._tensors:
            # GGUF shapes list the fastest-varying dimension first; HF's [out, in] is the reverse.
            shape = tuple(reversed(tensor.shape))
            qtype = tensor.tensor_type.name
            if name in keep_quantized:
                if qtype == "Q4_K":
                    weight = Int4Weight(*q4_k_to_int4(tensor.data, shape), 32)
                elif NATIVE_LAYOUTS[qtype][0] == "int4":
                    weight = Int4Weight(*q4_to_int4(tensor.data, shape, qtype), 32)
                else:
                    weight = Int8Weight(*int8_blocks(tensor.data, shape, qtype))
                yield name, weight.map_rows(lambda rows: self._unpermuted(name, rows))
                continue
            array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
            if not array.flags.writeable:  # a view into the read-only memory map
                array = array.copy()
            weight = torch.from_numpy(array).reshape(shape)
            if self._norms_plus_one and name.endswith("norm.weight"):
                weight = weight - 1
            yield name, self._unpermuted(name, weight).contiguous()

    def _unpermuted(self, name: str, rows: torch.Tensor) -> torch.Tensor:
        """llama.cpp's Q/K row order -> HF's (whole rows move: codes, scales, zeros alike)."""
        if self._permutes_qk and ".self_attn.q_proj." in name:
            return unpermute_qk(rows, self._config.num_attention_heads).contiguous()
        if self._permutes_qk and ".self_attn.k_proj." in name:
            return unpermute_qk(rows, self._config.num_key_value_heads).contiguous()
        return rows
