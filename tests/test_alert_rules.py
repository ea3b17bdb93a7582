"""The Prometheus alert rules in deploy/prometheus/rules are valid (`promtool check rules`) and
fire, or stay quiet, as their unit tests say (`promtool test rules`) on series shaped like a
real Pagoda scrape (tests/test_dashboard.py checks those names and labels against one)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
RULES = REPO_ROOT / "deploy/prometheus/rules/pagoda.yml"
RULE_TESTS = REPO_ROOT / "deploy/prometheus/tests/pagoda.test.yml"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make system-deps installs "
                                                         "Debian's prometheus package, which has it)")
ALERTS = {"PagodaWebDown", "PagodaWorkerDown", "PagodaQueueGrowing", "PagodaKVCacheFull",
          "PagodaHighErrorRate", "PagodaTTFTOverSLO"}


def promtool(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_promtool_accepts_the_alert_rules():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_every_alert_fires_and_stays_quiet_as_its_promtool_test_says():
    import yaml

    tested = {case["alertname"] for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for case in test["alert_rule_test"]}
    result = promtool("test", "rules", str(RULE_TESTS))

    assert result.returncode == 0, result.stdout + result.stderr
    assert tested == ALERTS


def test_a_rule_with_a_wrong_threshold_fails_its_promtool_test(tmp_path):
    """The unit tests can fail: the KV alert moved to 99% misses the 97% worker they expect."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "rules/pagoda.yml").write_text(RULES.read_text().replace("> 0.95", "> 0.99"))
    (tmp_path / "tests/pagoda.test.yml").write_text(RULE_TESTS.read_text())
    result = promtool("test", "rules", "tests/pagoda.test.yml", cwd=tmp_path)

    assert result.returncode != 0 and "PagodaKVCacheFull" in result.stdout + result.stderr
