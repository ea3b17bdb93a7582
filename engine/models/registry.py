"""Where a model name points on disk, what format it is in, and which architectures we run."""

from __future__ import annotations

import json
from pathlib import Path

from engine.bundled import BUNDLED_MODELS, bundled_model_path
from engine.errors import ModelLoadError

# Our model families: family -> (module in engine/models, class). One file per family; a new
# family is a new file and a line here (and, when its checkpoint differs, in the loaders).
FAMILIES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "mistral": ("llama", "LlamaForCausalLM"),
    "qwen2": ("llama", "LlamaForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
    "gemma3": ("gemma3", "Gemma3ForCausalLM"),
    "bert": ("bert", "BertModel"),
}
# Encoder families: embedding models, served by the pooling path (engine/embedding_engine.py,
# no KV cache) and configured by engine/models/encoder_config.py, never by LLMEngine. A decoder
# family's checkpoint is an embedding model too when it carries a sentence-transformers pooling
# config (is_embedding_checkpoint).
ENCODER_FAMILIES = frozenset({"bert"})
# HF `architectures[0]` / `model_type` -> our model family.
HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "llama": "llama",
    "MistralForCausalLM": "mistral", "mistral": "mistral",
    "Qwen2ForCausalLM": "qwen2", "qwen2": "qwen2",
    "Qwen3ForCausalLM": "qwen3", "qwen3": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "qwen3_moe": "qwen3_moe",
    "Phi3ForCausalLM": "phi3", "phi3": "phi3",
    "Gemma3ForCausalLM": "gemma3", "gemma3_text": "gemma3",
    "BertModel": "bert", "BertForMaskedLM": "bert", "BertForPreTraining": "bert", "bert": "bert",
}
# GGUF `general.architecture` -> our model family, for those whose GGUF tensors we map
# (engine/models/gguf_names.py). llama.cpp has no "mistral" GGUF architecture: it writes
# Mistral checkpoints as "llama".
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "gemma3": "gemma3"}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


def supported_architecture(name: str | None, *, where: str, gguf: bool = False) -> str:
    """Our family name for a checkpoint's architecture name; ModelLoadError, listing what we run
    from that format, if we cannot run it."""
    table = GGUF_ARCHITECTURES if gguf else HF_ARCHITECTURES
    if name in table:
        return table[name]
    known = ", ".join(sorted(table))
    raise ModelLoadError(f"unsupported architecture {name!r} in {where}; supported: {known}")


def has_pooling_config(directory: Path) -> bool:
    """Whether ``directory`` has a sentence-transformers modules.json naming a Pooling module: the
    one rule that makes a decoder checkpoint an embedding model. Never raises (a malformed file
    answers False here and fails at load, naming the file)."""
    try:
        modules = json.loads((Path(directory) / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(modules, list) and any(
        isinstance(m, dict) and isinstance(m.get("type"), str) and m["type"].startswith("sentence_transformers.")
        and m["type"].rpartition(".")[2] == "Pooling" for m in modules)


def is_embedding_checkpoint(path: str | Path) -> bool:
    """True for an embedding model, served by engine/embedding_engine.py: a Hugging Face directory
    whose config.json names an encoder family, or a decoder family's with a sentence-transformers
    pooling config (modules.json naming a Pooling module, Qwen3-Embedding style). A plain decoder
    checkpoint stays a generation model. Reads config.json and modules.json only."""
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict):
        return False
    names = config.get("architectures") or [config.get("model_type")]
    name = names[0] if isinstance(names, list) and names else None
    family = HF_ARCHITECTURES.get(name) if isinstance(name, str) else None
    if family is None:
        return False
    return family in ENCODER_FAMILIES or has_pooling_config(path)


def model_class(family: str):
    """The nn.Module class of a model family (imported on demand: this module imports no torch)."""
    from importlib import import_module

    module, name = FAMILIES[family]
    return getattr(import_module(f"engine.models.{module}"), name)


def resolve_model_path(name_or_path: str) -> Path:
    """A bundled model's name, a Hugging Face directory or a .gguf file -> the path to load."""
    name = str(name_or_path)
    if name.lower() in BUNDLED_MODELS:
        return bundled_model_path(name.lower())
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        raise ModelLoadError(
            f"model directory {str(path)!r} has no config.json; expected a Hugging Face "
            f"checkpoint directory (config.json + *.safetensors)")
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return path
        if path.suffix.lower() in PICKLE_SUFFIXES:
            raise _pickle_refused(path)
        raise ModelLoadError(
            f"model file {str(path)!r} is not a .gguf file; pass a .gguf file or a Hugging Face "
            f"directory containing config.json")
    bundled = ", ".join(BUNDLED_MODELS)
    raise ModelLoadError(
        f"model {name!r} not found: it is neither a bundled model ({bundled}), nor an existing "
        f"directory with config.json, nor an existing .gguf file")


def checkpoint_format(path: str | Path) -> str:
    """"hf" for a directory of safetensors shards, "gguf" for a .gguf file."""
    path = Path(path)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return "gguf"
    if path.is_dir():
        if any(path.glob("*.safetensors")):
            return "hf"
        pickles = sorted(p for p in path.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
        if pickles:
            raise _pickle_refused(pickles[0])
        raise ModelLoadError(f"model directory {str(path)!r} contains no *.safetensors weights")
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise _pickle_refused(path)
    raise ModelLoadError(
        f"{str(path)!r} is neither a Hugging Face directory nor a .gguf file")


def _pickle_refused(path: Path) -> ModelLoadError:
    # Unpickling runs arbitrary code from the file, so a served model must come as safetensors.
    return ModelLoadError(
        f"refusing pickle checkpoint {str(path)!r}: pickle files can execute code when loaded; "
        f"convert the weights to safetensors (or GGUF) first")
