"""How much memory a model takes with given settings, before anything loads (imports no torch).

``estimate_memory(model, settings)`` reads only the checkpoint's header (GGUF metadata and tensor
table, safetensors headers and config.json) and returns an ``Estimate`` per tensor-parallel rank:

- weights: each tensor in the layout it will load into (engine/models/loader.py's plan): float
  projections, norms and the embedding in the activation dtype; int4 projections 0.5 byte a
  weight plus a bf16 scale and zero per group (0.625 for groups of 32); int8 1 byte plus a
  scale per row; the dense bf16 copies of ``quantization_dense_rows``; the LM head's extra copy
  on the CPU (when anything is quantized: with the native kernels an int8 table that a tied
  embedding shares, its float table freed, in bf16 or fp32; else in bf16 torch's int8 copy;
  else in fp32 oneDNN's copy); the RoPE table;
- KV cache, sized as the runner sizes its pool (engine/memory/kv_pool_sizing.py): 2 x layers x KV
  heads / TP x (head dim x bytes per element, or for an int8 / fp8 kv_cache_dtype head dim + a
  4-byte scale) x tokens, where tokens is num_kv_blocks x block_size, or what kv_cache_memory
  holds, or the CPU default (max_num_seqs x max_model_len tokens within a tenth of memory); on
  CUDA without either, what gpu_memory_utilization leaves of ``device_memory_bytes`` (when given);
- activations: the workspace of one step of max_num_batched_tokens (hidden states, QKV, the MLP's
  gate/up/activation), the logits and sampling buffers of max_num_seqs rows, and the attention
  workspace (one layer's K and V gathered for every token of the pool). Transient: freed after
  each step, so a process's resident memory between steps is about weights + used KV blocks.

Used by ``python -m engine estimate``, the console's model page and the validation job.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engine.kernels.cpu import cpu_info
from engine.kernels.cpu import build as native_kernels
from engine.config import (EngineConfig, draft_settings, resolve_kv_cache_dtype, resolve_quantization,
                           resolve_use_triton)
from engine.errors import InvalidParameterError, ModelLoadError
from engine.memory.kv_pool_sizing import KV_SCALE_BYTES, kv_bytes_per_token, num_kv_blocks
from engine.models.gguf_file import read_header
from engine.models.gguf_names import GGML_TYPES, NATIVE_LAYOUTS, hf_name
from engine.models.registry import checkpoint_format, resolve_model_path

MiB = 2**20
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ROW_PARALLEL = ("o_proj", "down_proj")  # split along the input columns; the rest along rows
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                     "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
# Float32 copies of a step's logits the sampler holds at once (logits, probabilities, the sorted
# values of top-k/top-p, log-probabilities).
LOGITS_COPIES = 4


@dataclass(frozen=True)
class Estimate:
    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    reader_bytes: int  # the checkpoint's parsed metadata while loading (GGUF: its numeric arrays), freed after
    tokenizer_bytes: int  # the engine's tokenizer (vocabulary and merges), resident
    kv_tokens: int
    dtype: str
    tensor_parallel_size: int
    layouts: dict  # "float" | "int4" | "int8" -> projections per rank in that layout
    draft_bytes: int = 0  # speculative_model's engine, resident: its weights, KV pool and tokenizer

    @property
    def resident_bytes(self) -> int:
        """Between steps with every KV block in use: what stays resident (the metadata the load
        parsed is given back once it is done: engine/memory/host_memory.py)."""
        return self.weights_bytes + self.kv_cache_bytes + self.tokenizer_bytes + self.draft_bytes

    @property
    def total_bytes(self) -> int:
        """At the peak of the largest step."""
        return self.resident_bytes + self.activation_bytes

    def as_dict(self) -> dict:
        return {**asdict(self), "resident_bytes": self.resident_bytes, "total_bytes": self.total_bytes}

    def describe(self) -> str:
        return (f"{self.total_bytes / MiB:.1f} MiB per rank: weights {self.weights_bytes / MiB:.1f} MiB "
                f"({', '.join(f'{n} {k}' for k, n in self.layouts.items() if n)} projections), KV cache "
                f"{self.kv_cache_bytes / MiB:.1f} MiB for {self.kv_tokens} tokens, tokenizer "
                f"{self.tokenizer_bytes / MiB:.1f} MiB, activations up to "
                f"{self.activation_bytes / MiB:.1f} MiB"
                f"{f', draft model {self.draft_bytes / MiB:.1f} MiB' if self.draft_bytes else ''} ({self.dtype}, "
                f"tensor_parallel_size {self.tensor_parallel_size})")


@dataclass(frozen=True)
class _Tensor:
    name: str  # Hugging Face name, e.g. model.layers.0.self_attn.q_proj.weight
    shape: tuple[int, ...]  # [out, in] for a matrix
    native: tuple | None = None  # ("int4", group) | ("int8", None) when stored quantized


@dataclass(frozen=True)
class _Arch:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position: int
    rope_tables: int = 1  # Gemma 3: its local layers' base has a table of its own


def estimate_memory(model: str, settings: dict | None = None, *, device: str | None = None,
                    device_memory_bytes: int | None = None) -> Estimate:
    """The memory ``model`` needs with ``settings`` (engine settings), per tensor-parallel rank.

    InvalidParameterError for a bad setting, ModelLoadError for a checkpoint it cannot read.
    ``device``: "cpu" or "cuda" (default: the settings' device, auto meaning cpu here).
    """
    config = EngineConfig.from_settings(model, dict(settings or {}))
    device = device or ("cuda" if config.device.startswith("cuda") else "cpu")
    tp = getattr(config, "tensor_parallel_size", 1)
    path = resolve_model_path(model)
    arch, tensors, reader_bytes = (_read_gguf(path) if checkpoint_format(path) == "gguf"
                                   else _read_safetensors(path))
    for name, count in (("num_attention_heads", arch.num_heads), ("num_key_value_heads", arch.num_kv_heads)):
        if count % tp:
            raise InvalidParameterError("tensor_parallel_size", f"{name} ({count}) is not divisible by {tp}")
    dtype = _activation_dtype(config.dtype, device)
    elem = DTYPE_BYTES[dtype]
    quantization = resolve_quantization(config.quantization, device)
    dense_rows = (config.quantization_dense_rows if device == "cpu" and dtype == "bfloat16"
                  and cpu_info.has_fast_bf16() else None)

    weights, layouts, any_quantized = 0, {"float": 0, "int4": 0, "int8": 0}, False
    for tensor in tensors:
        numel = 1
        for n in tensor.shape:
            numel *= n
        leaf = tensor.name.split(".")[-2] if tensor.name.endswith(".weight") else ""
        if leaf in PROJECTIONS and len(tensor.shape) == 2:
            out_f, in_f = tensor.shape
            out_f, in_f = (out_f, in_f // tp) if leaf in ROW_PARALLEL else (out_f // tp, in_f)
            layout = _layout(tensor.native, quantization, config.quantization_group_size, out_f, in_f)
            layouts[layout[0]] += 1
            weights += _projection_bytes(layout, out_f, in_f, elem, dense_rows)
            any_quantized |= layout[0] != "float"
        elif tensor.name in ("model.embed_tokens.weight", "lm_head.weight"):
            weights += numel // tp * elem  # vocabulary-parallel
            any_quantized |= tensor.native is not None and quantization not in (None, "none")
        else:  # norms and biases, replicated
            weights += numel * elem
    if device == "cpu":  # LMHead.prepare's extra product, over the (tied) embedding's rows
        vocab_rows = arch.vocab_size // tp
        int8_head = quantization not in (None, "none") and (any_quantized or quantization != "auto")
        if int8_head and dtype in ("bfloat16", "float32") and tp == 1 \
                and native_kernels.likely_available() \
                and arch.hidden_size % 32 == 0 and vocab_rows % 16 == 0:
            # the native kernel's int8 table, fp16 scale per 32 (engine/kernels/cpu/qmatmul.py);
            # a tied embedding reads it and its float table is freed (engine/layers/int8_embedding.py)
            weights += vocab_rows * arch.hidden_size * 17 // 16
            if not any(t.name == "lm_head.weight" for t in tensors):
                weights -= vocab_rows * arch.hidden_size * elem
        elif int8_head and dtype == "bfloat16" and arch.hidden_size % 16 == 0:
            weights += vocab_rows * arch.hidden_size + vocab_rows * elem
        elif dtype == "float32":
            weights += vocab_rows * arch.hidden_size * 4
    # the float32 RoPE tables, [max_position, head_dim] each (cos and sin of the half-frequencies)
    weights += arch.rope_tables * arch.max_position * arch.head_dim * 4

    max_model_len = min(config.max_model_len or arch.max_position, arch.max_position)
    kv_cache_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, dtype, device,
                                            quantized=layouts["int4"] + layouts["int8"] > 0,
                                            use_triton=resolve_use_triton(config.use_triton, device))
    kv_per_token = kv_bytes_per_token(kv_cache_dtype, num_layers=arch.num_layers,
                                      num_kv_heads=arch.num_kv_heads // tp, head_dim=arch.head_dim,
                                      elem=elem)
    kv_tokens = _kv_tokens(config, device, kv_per_token, max_model_len, device_memory_bytes,
                           weights)
    kv_bytes = kv_tokens * kv_per_token
    activations = _activation_bytes(config, kv_cache_dtype, arch, tp, elem, kv_tokens)
    return Estimate(weights_bytes=int(weights), kv_cache_bytes=int(kv_bytes),
                    activation_bytes=int(activations), reader_bytes=int(reader_bytes),
                    tokenizer_bytes=arch.vocab_size * TOKENIZER_BYTES_PER_TOKEN,
                    kv_tokens=int(kv_tokens), dtype=dtype, tensor_parallel_size=tp, layouts=layouts,
                    draft_bytes=_draft_bytes(config, settings or {}, device, max_model_len))


def _draft_bytes(config: EngineConfig, settings: dict, device: str, max_model_len: int) -> int:
    """What speculative_model's engine holds resident, with the settings LLMEngine gives it
    (config.draft_settings)."""
    if not config.speculative_model:
        return 0
    draft = dict(settings, **draft_settings(config, max_model_len))
    return estimate_memory(draft.pop("model"), draft, device=device).resident_bytes


def _activation_dtype(name: str, device: str) -> str:
    if name != "auto":
        return name
    return "bfloat16" if device != "cpu" or cpu_info.has_fast_bf16() else "float32"


def _layout(native: tuple | None, quantization: str | None, group_size: int, out_f: int, in_f: int) -> tuple:
    """loader.plan_layouts for one projection: ("float",) | ("int4", group) | ("int8", None)."""
    if quantization in (None, "none"):
        return ("float", None)
    if quantization == "auto":
        layout = native or ("float", None)
    elif quantization == "int4":
        layout = native if native is not None and native[0] == "int4" else ("int4", group_size)
    else:
        layout = ("int8", None)
    if layout[0] == "int4" and (in_f % layout[1] or out_f % 16):
        return ("float", None)  # a shape the int4 kernel refuses stays float
    return layout


def _projection_bytes(layout: tuple, out_f: int, in_f: int, elem: int, dense_rows: int | None) -> int:
    kind, group = layout
    if kind == "float":
        return out_f * in_f * elem
    dense = out_f * in_f * 2 if dense_rows else 0
    if kind == "int4":  # packed nibbles + a bf16 scale and zero per group
        return out_f * in_f // 2 + 2 * out_f * (in_f // group) * 2 + dense
    return out_f * in_f + out_f * elem + dense  # int8 codes + a scale per row


def _kv_tokens(config: EngineConfig, device: str, kv_per_token: int, max_model_len: int,
               device_memory_bytes: int | None, weights: int) -> int:
    """The runner's pool (engine/memory/kv_pool_sizing.py); on a GPU what gpu_memory_utilization leaves
    beside the weights, or without device_memory_bytes the most the scheduler could use."""
    def device_budget() -> int | None:
        if device_memory_bytes is None:
            return None
        return int(config.gpu_memory_utilization * device_memory_bytes) - weights

    try:
        blocks = num_kv_blocks(config, device_type=device, max_model_len=max_model_len,
                               bytes_per_block=kv_per_token * config.block_size,
                               device_budget=device_budget)
    except MemoryError:  # the budget holds no block
        blocks = 0
    return blocks * config.block_size


def _activation_bytes(config: EngineConfig, kv_cache_dtype: str, arch: _Arch, tp: int, elem: int,
                      kv_tokens: int) -> int:
    tokens, rows = config.max_num_batched_tokens, min(config.max_num_seqs, config.max_num_batched_tokens)
    heads, kv_heads = arch.num_heads // tp, arch.num_kv_heads // tp
    per_token = (3 * arch.hidden_size  # residual, normed input, attention/MLP output
                 + (heads + 2 * kv_heads) * arch.head_dim  # fused QKV
                 + heads * arch.head_dim  # attention output
                 + 3 * arch.intermediate_size // tp)  # gate/up, activated
    logits = rows * arch.vocab_size * 4 * LOGITS_COPIES
    gathered = min(kv_tokens, tokens + rows * config.block_size) * kv_heads
    attention = 2 * gathered * arch.head_dim * elem
    if kv_cache_dtype == "bfloat16" and elem != 2:  # gathered in bf16, then widened
        attention += 2 * gathered * arch.head_dim * 2
    elif kv_cache_dtype not in ("auto", "bfloat16"):  # the gathered codes and scales, before dequantizing
        attention += 2 * gathered * (arch.head_dim + KV_SCALE_BYTES)
    return tokens * per_token * elem + logits + attention


# ----------------------------------------------------------------- checkpoint headers
def _read_gguf(path: Path) -> tuple[_Arch, list[_Tensor], int]:
    """The architecture, the tensor table, and the bytes the loader's reader keeps for the file's
    metadata while it loads (engine/models/gguf_file.py: its numeric arrays; strings are skipped)."""
    try:
        header = read_header(path)
    except (OSError, ValueError, struct.error) as exc:
        raise ModelLoadError(f"cannot read GGUF file {str(path)!r}: {exc}") from exc
    fields = header.fields

    def field(key: str, default=None):
        value = fields.get(key, default)
        return value[0] if isinstance(value, list) else value

    name = field("general.architecture")
    hidden = int(field(f"{name}.embedding_length"))
    heads = int(field(f"{name}.attention.head_count"))
    tensors = [_Tensor(hf_name(t.name) or t.name, tuple(reversed(t.dims)),
                       NATIVE_LAYOUTS.get(GGML_TYPES.get(t.kind)))
               for t in header.tensors]  # GGUF lists dims [in, out]
    vocab = next(t.shape[0] for t in tensors if t.name == "model.embed_tokens.weight")
    arch = _Arch(vocab_size=vocab, hidden_size=hidden,
                 intermediate_size=int(field(f"{name}.feed_forward_length")),
                 num_layers=int(field(f"{name}.block_count")), num_heads=heads,
                 num_kv_heads=int(field(f"{name}.attention.head_count_kv", heads)),
                 head_dim=int(field(f"{name}.attention.key_length", hidden // heads)),
                 max_position=int(field(f"{name}.context_length", 2048)),
                 rope_tables=2 if name == "gemma3" else 1)
    return arch, tensors, sum(v.nbytes for v in fields.values() if isinstance(v, np.ndarray))


# The engine's own tokenizer (transformers' fast tokenizer: vocabulary, merges, added tokens), in
# RssAnon after malloc_trim: 34.7 and 35.8 MB for SmolLM2's 49,152 tokens in two configurations.
TOKENIZER_BYTES_PER_TOKEN = 720


def _read_safetensors(path: Path) -> tuple[_Arch, list[_Tensor], int]:
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {str(path / 'config.json')!r}: {exc}") from exc
    heads = int(cfg["num_attention_heads"])
    arch = _Arch(vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]),
                 intermediate_size=int(cfg["intermediate_size"]), num_layers=int(cfg["num_hidden_layers"]),
                 num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                 head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
                 max_position=int(cfg.get("max_position_embeddings", 2048)),
                 rope_tables=2 if cfg.get("model_type") in ("gemma3", "gemma3_text") else 1)
    quant = cfg.get("quantization_config") or {}
    native = (("int4", int(quant.get("group_size", 32))) if quant.get("bits") == 4 else
              ("int8", None) if quant.get("bits") == 8 else None)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors file in {str(path)!r}")
    tensors = []
    for file in files:
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if native is not None and name.endswith(".qweight"):  # a quantized projection
                base = name.removesuffix(".qweight")
                tensors.append(_Tensor(base + ".weight", _quantized_shape(base, arch), native))
            elif native is not None and name.rsplit(".", 1)[-1] in ("scales", "zeros", "qzeros", "g_idx"):
                continue
            else:
                tensors.append(_Tensor(name, tuple(info["shape"])))
    return arch, tensors, 0  # safetensors headers are read and dropped


def _quantized_shape(base: str, arch: _Arch) -> tuple[int, int]:
    """[out, in] of a projection from the architecture (its packed tensors hide the shape)."""
    leaf = base.split(".")[-1]
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    return {"q_proj": (q, arch.hidden_size), "k_proj": (kv, arch.hidden_size),
            "v_proj": (kv, arch.hidden_size), "o_proj": (arch.hidden_size, q),
            "gate_proj": (arch.intermediate_size, arch.hidden_size),
            "up_proj": (arch.intermediate_size, arch.hidden_size),
            "down_proj": (arch.hidden_size, arch.intermediate_size)}[leaf]
