"""What a checkpoint is, from its headers alone (imports no torch): family, context, attention
pattern, experts, tensor types, and the KV capacity sliding-window freeing gives; and the GGUF
file's integrity (every tensor's bytes inside the file, shapes as its metadata says).

Used by ``python -m engine estimate`` and the upload's validation (engine/cli/validate.py).
"""

from __future__ import annotations

import json
import re
import struct
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.errors import ModelLoadError
from engine.memory.kv_pool_sizing import window_split
from engine.models.gguf_file import read_header
from engine.models.gguf_names import GGML_TYPES
from engine.models.registry import checkpoint_format, resolve_model_path, supported_architecture

GEMMA3_GGUF_PATTERN = 6  # llama.cpp's and our loader's: every 6th Gemma 3 layer is global
# GGUF tensor -> (its dims [in, out] as the metadata implies them), checked for every layer
_GGUF_SHAPES = {
    "attn_q": lambda m: [m["hidden"], m["heads"] * m["head_dim"]],
    "attn_k": lambda m: [m["hidden"], m["kv_heads"] * m["head_dim"]],
    "attn_v": lambda m: [m["hidden"], m["kv_heads"] * m["head_dim"]],
    "attn_output": lambda m: [m["heads"] * m["head_dim"], m["hidden"]],
    "ffn_gate": lambda m: [m["hidden"], m["ffn"]],
    "ffn_up": lambda m: [m["hidden"], m["ffn"]],
    "ffn_down": lambda m: [m["ffn"], m["hidden"]],
}


@dataclass(frozen=True)
class ModelFacts:
    architecture: str  # our family (engine/models/registry.py)
    context_length: int
    num_layers: int
    layer_windows: list  # per layer: its window in tokens, None for full attention
    tensor_types: dict  # stored tensor type -> count, e.g. {"Q4_K": 120, "Q6_K": 19, "F32": 97}
    experts: str | None = None  # "8 experts, 2 a token" for a mixture of experts

    @property
    def attention(self) -> str:
        """"15 local (512) / 3 global", or "18 global"."""
        local = Counter(w for w in self.layer_windows if w)
        num_global = self.num_layers - sum(local.values())
        parts = [f"{n} local ({w})" for w, n in sorted(local.items())]
        return " / ".join(parts + ([f"{num_global} global"] if num_global else []))

    def as_dict(self) -> dict:
        return {**asdict(self), "attention": self.attention}

    def describe(self) -> str:
        types = ", ".join(f"{k} x{n}" for k, n in sorted(self.tensor_types.items(), key=lambda i: -i[1]))
        experts = f", {self.experts}" if self.experts else ""
        return (f"{self.architecture}, context {self.context_length}, {self.num_layers} layers: "
                f"{self.attention}{experts}; tensors {types}")

    def window_capacity(self, *, kv_tokens: int, max_model_len: int, block_size: int,
                        max_num_batched_tokens: int, max_num_seqs: int):
        """kv_pool_sizing.WindowSplit of a pool of ``kv_tokens`` tokens (every layer), None when
        the model does not both mix window and full layers with one window, or when freeing
        would fit no more sequences (nothing is split then)."""
        windows = {w for w in self.layer_windows if w}
        if len(windows) != 1 or all(self.layer_windows):
            return None
        return window_split(kv_tokens // block_size * self.num_layers,
                            window_layers=[bool(w) for w in self.layer_windows], window=windows.pop(),
                            max_model_len=max_model_len, block_size=block_size,
                            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)


def model_facts(model: str) -> ModelFacts:
    """ModelLoadError naming the tensor, the offset or the architecture where the checkpoint
    cannot be what it says."""
    path = resolve_model_path(model)
    return _gguf_facts(path) if checkpoint_format(path) == "gguf" else _hf_facts(path)


def _gguf_facts(path: Path) -> ModelFacts:
    try:
        header = read_header(path)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"cannot read GGUF file {str(path)!r}: {exc}") from exc
    fields, infos, data_start = header.fields, header.tensors, header.data_start

    def field(key: str, default=None):
        value = fields.get(key, default)
        return value[0] if isinstance(value, list) else value

    name = field("general.architecture")
    family = supported_architecture(name, where=str(path), gguf=True)
    try:
        heads = int(field(f"{name}.attention.head_count"))
        meta = dict(hidden=int(field(f"{name}.embedding_length")), heads=heads,
                    kv_heads=int(field(f"{name}.attention.head_count_kv", heads)),
                    ffn=int(field(f"{name}.feed_forward_length")))
        meta["head_dim"] = int(field(f"{name}.attention.key_length", meta["hidden"] // heads))
        num_layers = int(field(f"{name}.block_count"))
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{str(path)!r}: GGUF metadata lacks or garbles {name}.*: {exc}") from exc
    _check_gguf_tensors(path, infos, data_start, meta, num_layers)
    window = field(f"{name}.attention.sliding_window") if family == "gemma3" else None
    windows = [window if window and (i + 1) % GEMMA3_GGUF_PATTERN else None for i in range(num_layers)]
    types = Counter(GGML_TYPES.get(t.kind, f"type {t.kind}") for t in infos)
    return ModelFacts(family, int(field(f"{name}.context_length", 2048)), num_layers, windows,
                      dict(types))


def _check_gguf_tensors(path: Path, infos, data_start: int, meta: dict, num_layers: int) -> None:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    size = path.stat().st_size
    for t_name, dims, kind, offset in ((t.name, t.dims, t.kind, t.offset) for t in infos):
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise ModelLoadError(f"tensor {t_name!r} has an unknown GGML type {kind}") from None
        numel = 1
        for d in dims:
            numel *= d
        start, end = data_start + offset, data_start + offset + numel // block * block_bytes
        if end > size:
            raise ModelLoadError(f"GGUF file truncated: tensor {t_name!r} needs bytes {start}..{end} "
                                 f"but the file ends at offset {size}")
        match = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", t_name)
        if match and int(match.group(1)) >= num_layers:
            raise ModelLoadError(f"tensor {t_name!r} is past the metadata's {num_layers} layers")
        if t_name == "token_embd.weight" and dims[0] != meta["hidden"]:
            raise ModelLoadError(f"tensor {t_name!r} has rows of {dims[0]} but the metadata's "
                                 f"embedding_length is {meta['hidden']}")
        if match and match.group(2) in _GGUF_SHAPES:
            expected = _GGUF_SHAPES[match.group(2)](meta)
            if list(dims) != expected:
                raise ModelLoadError(f"tensor {t_name!r} has dims {list(dims)} but the metadata "
                                     f"implies {expected}")


def _hf_facts(path: Path) -> ModelFacts:
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {str(path / 'config.json')!r}: {exc}") from exc
    family = supported_architecture((cfg.get("architectures") or [cfg.get("model_type")])[0],
                                    where=str(path / "config.json"))
    layers = int(cfg["num_hidden_layers"])
    window, types = cfg.get("sliding_window"), cfg.get("layer_types")
    if family == "gemma3" and not types:
        pattern = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if family in ("qwen3", "qwen3_moe") and not cfg.get("use_sliding_window"):
        window = None
    if family in ("mistral", "qwen2"):  # the loader cuts the context to the window instead
        window = None
    windows = ([window if t == "sliding_attention" else None for t in types] if types and window
               else [window] * layers)
    counts: Counter = Counter()
    for file in sorted(path.glob("*.safetensors")):
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        counts.update(v["dtype"] for k, v in header.items() if k != "__metadata__")
    experts = None
    if family == "qwen3_moe":
        experts = (f"{cfg.get('num_experts', cfg.get('num_local_experts'))} experts, "
                   f"{cfg['num_experts_per_tok']} a token")
    return ModelFacts(family, int(cfg.get("max_position_embeddings", 2048)), layers, windows,
                      dict(counts), experts)
