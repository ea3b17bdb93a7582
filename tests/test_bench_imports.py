"""Every name a bench script imports from the engine, the workers or another bench script exists:
the scripts run by hand, never under pytest, so a moved module (engine.cpu_info after the
engine's regrouping, a bench helper moved to bench/machine.py) would otherwise break `make bench`
unnoticed."""

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
CHECKED = ("engine", "workers", "bench")


def _imports(script: Path) -> list[tuple[str, str]]:
    found = []
    for node in ast.walk(ast.parse(script.read_text(), str(script))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in CHECKED:
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.split(".")[0] in CHECKED]
    return found


@pytest.mark.slow  # importing a script's modules loads torch, transformers and the native kernels
@pytest.mark.parametrize("script", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_a_bench_scripts_engine_and_worker_imports_exist(script):
    for module, name in _imports(script):
        imported = importlib.import_module(module)
        if name and not hasattr(imported, name):
            importlib.import_module(f"{module}.{name}")  # a submodule: raises, naming it, if missing
