"""The import contracts in .importlinter hold, and they do catch the imports they forbid.

import-linter reads the source statically, so an engine module mid-construction that does not
import yet is still checked. Each run is a subprocess so that the planted trees below cannot
mix with the real packages already imported by this test process.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG = REPO_ROOT / ".importlinter"
RUN_LINTER = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))"
)


def contract_name(contract_id: str) -> str:
    parser = configparser.ConfigParser()
    parser.read(CONFIG)
    return parser[f"importlinter:contract:{contract_id}"]["name"]


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", RUN_LINTER, str(CONFIG)],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )


def plant_tree(root: Path, extra_lines: dict[str, str]) -> None:
    """A miniature engine/workers/webapp tree; ``extra_lines`` maps a module path to its code."""
    modules = {
        "engine/__init__.py": "",
        "engine/core.py": "import torch\nimport numpy\n",
        "engine/errors.py": "",
        "engine/config.py": "from engine import errors\n",
        "engine/bundled.py": "from engine import errors\n",
        "engine/sampling_params.py": "from engine import errors\n",
        "workers/__init__.py": "",
        "workers/engine_worker.py": "from engine import core\nimport redis\n",
        "webapp/__init__.py": "",
        "webapp/views.py": "import django\nfrom workers import engine_worker\n",
        "workers/schema.py": ("from engine.config import SETTINGS\nfrom engine.bundled import BUNDLED_MODELS\n"
                              "from engine.errors import InvalidParameterError\n"
                              "from engine.sampling_params import SAMPLING_LIMITS\n"),
        "webapp/engine_settings.py": "from workers.schema import SETTINGS, SAMPLING_LIMITS\n",
    }
    for path, code in {**modules, **extra_lines}.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(modules.get(path, "") + code)


def test_repository_keeps_its_import_contracts():
    result = lint(REPO_ROOT)

    assert result.returncode == 0, result.stdout + result.stderr


def test_allowed_flows_pass_including_webapp_reaching_engine_through_workers_and_its_schema(tmp_path):
    plant_tree(tmp_path, {})

    result = lint(tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("module", "line", "contract_id"),
    [
        ("engine/core.py", "import django.db\n", "engine-is-standalone"),
        ("engine/core.py", "from channels.layers import get_channel_layer\n", "engine-is-standalone"),
        ("engine/core.py", "import celery\n", "engine-is-standalone"),
        ("engine/core.py", "import redis\n", "engine-is-standalone"),
        ("engine/core.py", "from rest_framework import views\n", "engine-is-standalone"),
        ("engine/core.py", "from webapp import views\n", "engine-is-standalone"),
        ("engine/core.py", "import workers.engine_worker\n", "engine-is-standalone"),
        ("workers/engine_worker.py", "from webapp import views\n", "workers-do-not-import-webapp"),
        ("webapp/views.py", "import torch\n", "webapp-does-not-load-models"),
        ("webapp/views.py", "from engine.core import torch\n", "webapp-does-not-load-models"),
        ("webapp/engine_settings.py", "import engine.core\n", "webapp-does-not-load-models"),
    ],
)
def test_forbidden_import_breaks_its_contract(tmp_path, module, line, contract_id):
    plant_tree(tmp_path, {module: line})

    result = lint(tmp_path)

    assert result.returncode != 0
    assert f"{contract_name(contract_id)} BROKEN" in " ".join(result.stdout.split())


def test_the_schema_modules_the_webapp_may_import_load_no_torch():
    code = ("import sys, workers.schema; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))")

    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=120)

    assert result.returncode == 0, result.stderr
