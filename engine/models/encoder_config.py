"""Sentence-transformers checkpoints of an encoder family: the architecture (config.json), how its
token states become one vector (modules.json, 1_Pooling/config.json, the Normalize module,
sentence_bert_config.json's max_seq_length) and its tensors, Hugging Face-named.

A decoder checkpoint (Qwen3-Embedding style) with the same sentence-transformers files is an
embedding model too (registry.has_pooling_config): ``DecoderEmbeddingConfig`` wraps its decoder's
ModelConfig with the pooling it asks for (engine/models/decoder_encoder.py runs it).

Imports no torch at module level: the registry and the validator read the config first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelLoadError

POOLING_MODES = ("mean", "cls", "lasttoken", "max")
# Legacy 1_Pooling/config.json keys (sentence-transformers < 6) -> pooling mode; 6.x writes
# "pooling_mode": "<mode>" instead. Both are read.
_POOLING_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                 "pooling_mode_lasttoken": "lasttoken", "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                 "pooling_mode_weightedmean_tokens": "weightedmean"}
# modules.json types: "sentence_transformers.models.Pooling" (< 6) or
# "sentence_transformers.sentence_transformer.modules.pooling.Pooling" (6.x): the class name decides.
_KNOWN_MODULES = {"Transformer": "transformer", "Pooling": "pooling", "Normalize": "normalize"}
# Checkpoint tensors no embedding needs: BERT's pooler (sentence-transformers never uses it),
# task heads, and buffers the model recomputes.
_SKIPPED_PREFIXES = ("pooler.", "cls.", "classifier.", "qa_outputs.")
_SKIPPED_SUFFIXES = ("position_ids",)


@dataclass(frozen=True)
class EncoderConfig:
    architecture: str  # our family name: "bert"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0
    # How the checkpoint's sentence-transformers modules turn token states into one vector.
    pooling: str = "mean"  # one of POOLING_MODES
    normalize: bool = False  # L2-normalised (a Normalize module follows the pooling)
    max_seq_length: int = 512  # the longest input, in tokens ([CLS] and [SEP] included)
    torch_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"pooling {self.pooling!r} is not one of {', '.join(POOLING_MODES)}")
        if not 1 <= self.max_seq_length <= self.max_position_embeddings:
            raise ValueError(f"max_seq_length {self.max_seq_length} must be from 1 to "
                             f"max_position_embeddings ({self.max_position_embeddings})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def dimensions(self) -> int:
        """The length of one embedding."""
        return self.hidden_size

    def describe(self) -> dict:
        """What the console shows: architecture, dimensions, pooling, max sequence length."""
        return {"architecture": self.architecture, "dimensions": self.dimensions,
                "pooling": self.pooling, "normalize": self.normalize,
                "max_seq_length": self.max_seq_length}


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {str(path)!r}: {exc}") from exc
    if not isinstance(data, dict | list):
        raise ModelLoadError(f"{str(path)!r} is not a JSON object")
    return data


def sentence_transformer_modules(directory: Path) -> dict[str, Path]:
    """modules.json's modules as {"transformer" | "pooling" | "normalize": their folder}; {} when
    the directory has no modules.json. ModelLoadError for a module we do not run (Dense, ...)."""
    modules_file = directory / "modules.json"
    if not modules_file.is_file():
        return {}
    modules = _read_json(modules_file)
    if not isinstance(modules, list):
        raise ModelLoadError(f"{str(modules_file)!r} is not a list of modules")
    found: dict[str, Path] = {}
    for module in modules:
        type_name = module.get("type") if isinstance(module, dict) else None
        kind = None
        if isinstance(type_name, str) and type_name.startswith("sentence_transformers."):
            kind = _KNOWN_MODULES.get(type_name.rpartition(".")[2])
        if kind is None:
            raise ModelLoadError(f"{str(modules_file)!r}: module {type_name!r} is not supported "
                                 f"(supported: sentence-transformers' {', '.join(_KNOWN_MODULES)})")
        found[kind] = directory / str(module.get("path") or "")
    return found


def pooling_mode(pooling_dir: Path) -> str:
    """The one pooling mode a Pooling module's config.json turns on."""
    config_file = pooling_dir / "config.json"
    config = _read_json(config_file)
    modes = config.get("pooling_mode", [mode for key, mode in _POOLING_KEYS.items() if config.get(key)])
    modes = [modes] if isinstance(modes, str) else modes
    for mode in modes:
        if mode not in POOLING_MODES:
            raise ModelLoadError(f"{str(config_file)!r}: pooling mode {mode!r} is not supported "
                                 f"(supported: {', '.join(POOLING_MODES)})")
    if len(modes) != 1:
        raise ModelLoadError(f"{str(config_file)!r} turns on {len(modes)} pooling modes "
                             f"({', '.join(modes) or 'none'}); exactly one is supported")
    return modes[0]


# Pooling modes a causal decoder's states support: the first token's state sees only itself, so
# CLS pooling of a decoder is refused rather than served.
DECODER_POOLING_MODES = ("lasttoken", "mean", "max")


@dataclass(frozen=True)
class DecoderEmbeddingConfig:
    """A decoder checkpoint served as an embedding model: its ModelConfig and how its final
    hidden states (after the final norm) become one vector."""

    decoder: object  # engine.models.model_config.ModelConfig
    pooling: str = "lasttoken"
    normalize: bool = False
    max_seq_length: int = 512

    @property
    def architecture(self) -> str:
        return self.decoder.architecture

    @property
    def vocab_size(self) -> int:
        return self.decoder.vocab_size

    @property
    def dimensions(self) -> int:
        return self.decoder.hidden_size

    def describe(self) -> dict:
        """What the console shows, as EncoderConfig.describe()."""
        return {"architecture": self.architecture, "dimensions": self.dimensions,
                "pooling": self.pooling, "normalize": self.normalize,
                "max_seq_length": self.max_seq_length}


def load_decoder_embedding_config(directory: Path, decoder) -> DecoderEmbeddingConfig:
    """``decoder`` (the checkpoint's ModelConfig) with the pooling, normalisation and maximum
    input length its sentence-transformers files give; ModelLoadError without a Pooling module
    or with a mode a causal model cannot serve."""
    modules = sentence_transformer_modules(directory)
    if "pooling" not in modules:
        raise ModelLoadError(f"{str(directory)!r} is a {decoder.architecture} generation model, not an "
                             f"embedding model: it has no sentence-transformers Pooling module "
                             f"(modules.json + 1_Pooling/config.json)")
    pooling = pooling_mode(modules["pooling"])
    if pooling not in DECODER_POOLING_MODES:
        raise ModelLoadError(f"{str(modules['pooling'] / 'config.json')!r}: pooling mode {pooling!r} is "
                             f"not supported for a decoder (supported: {', '.join(DECODER_POOLING_MODES)})")
    return DecoderEmbeddingConfig(decoder, pooling, "normalize" in modules,
                                  _max_seq_length(directory, decoder.max_position_embeddings))


def _max_seq_length(directory: Path, max_positions: int) -> int:
    """The longest input sentence-transformers encodes: sentence_bert_config.json's max_seq_length
    (< 6), else the tokenizer's model_max_length (6.x), within the position table."""
    for file, key in (("sentence_bert_config.json", "max_seq_length"),
                      ("tokenizer_config.json", "model_max_length")):
        path = directory / file
        value = _read_json(path).get(key) if path.is_file() else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, max_positions)
    return max_positions


def load_encoder_config(directory: Path, architecture: str) -> EncoderConfig:
    """The encoder's EncoderConfig from config.json and its sentence-transformers files; without
    modules.json: CLS pooling, unnormalised (transformers' own sentence embedding of a BERT)."""
    config_file = directory / "config.json"
    config = _read_json(config_file)
    modules = sentence_transformer_modules(directory)
    pooling = pooling_mode(modules["pooling"]) if "pooling" in modules else "cls"
    max_positions = config.get("max_position_embeddings", 512)
    max_seq_length = _max_seq_length(directory, max_positions)
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ModelLoadError(f"{str(config_file)!r}: position_embedding_type "
                             f"{config['position_embedding_type']!r} is not supported (only 'absolute')")
    activation = config.get("hidden_act", "gelu")
    if activation not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise ModelLoadError(f"{str(config_file)!r}: hidden_act {activation!r} is not supported")
    try:
        return EncoderConfig(
            architecture=architecture, vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"], intermediate_size=config["intermediate_size"],
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=config["num_attention_heads"],
            max_position_embeddings=max_positions,
            type_vocab_size=config.get("type_vocab_size", 2),
            layer_norm_eps=config.get("layer_norm_eps", 1e-12), hidden_act=activation,
            pad_token_id=config.get("pad_token_id") or 0, pooling=pooling,
            normalize="normalize" in modules,
            max_seq_length=max_seq_length,
            torch_dtype=config.get("dtype") or config.get("torch_dtype"))
    except KeyError as exc:
        raise ModelLoadError(f"{str(config_file)!r} lacks {exc.args[0]!r}") from exc
    except ValueError as exc:
        raise ModelLoadError(f"{str(config_file)!r}: {exc}") from exc


def encoder_weights(directory: Path) -> Iterator[tuple[str, "torch.Tensor"]]:  # noqa: F821
    """The encoder's tensors named as engine/models/bert.py's parameters: a task model's
    ``bert.`` prefix stripped, the pooler, heads and recomputed buffers skipped."""
    from safetensors import safe_open

    from engine.models.hf_loader import weight_files

    by_file: dict[Path, list[str]] = {}
    for name, file in weight_files(directory).items():
        by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        with safe_open(file, framework="pt") as shard:
            for name in names:
                ours = name.removeprefix("bert.")
                if ours.startswith(_SKIPPED_PREFIXES) or ours.endswith(_SKIPPED_SUFFIXES):
                    continue
                yield ours, shard.get_tensor(name)
