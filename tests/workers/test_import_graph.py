"""workers/ is layered: its modules import each other without a circle, and the transport is
chosen from configuration passed in, not from the environment read deep inside."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

WORKERS = Path(__file__).resolve().parents[2] / "workers"


def find_cycle(imports: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None; ``imports`` maps a module to what it imports."""
    state: dict[str, str] = {}  # module -> "open" (on the current path) or "done"
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for imported in sorted(imports.get(module, ())):
            if state.get(imported) == "open":
                return path[path.index(imported):] + [imported]
            if imported not in state and (cycle := visit(imported)):
                return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(imports):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_find_cycle_reports_a_circle_and_passes_a_layered_graph():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_workers_modules_import_each_other_without_a_circle():
    # grimp reads every import statement, those inside functions included.
    graph = grimp.build_graph("workers", cache_dir=None)
    imports = {module: {m for m in graph.find_modules_directly_imported_by(module)
                        if m.startswith("workers.")}
               for module in graph.modules if module.startswith("workers.")}

    assert "workers.transport" in imports and "workers.serving" in imports
    assert find_cycle(imports) is None


def test_only_the_worker_process_entry_reads_redis_url_from_the_environment():
    readers = []
    for path in sorted(WORKERS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == "REDIS_URL":
                readers.append(path.name)

    assert set(readers) <= {"__main__.py"}
