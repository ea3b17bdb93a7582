"""bench/quant_matmul.py end to end under Triton's interpreter on its tiny shapes (a smoke run:
the GPU figures need a GPU), and that its error column holds what the kernels promise."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("bf16", "int4", "int4-dequant", "int8", "int8-dequant")


@pytest.mark.e2e
def test_quant_matmul_bench_prints_every_variant_within_bf16_rounding_on_cpu():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "bench/quant_matmul.py", "--device", "cpu", "--model", "tiny",
         "--rows", "1,17", "--repeats", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in result.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| rows")]
    assert sorted((r[0].strip(), r[1].strip()) for r in rows) == sorted(
        (str(n), v) for n in (1, 17) for v in VARIANTS)
    for row in rows:
        # bf16 outputs, one rounding (truncated under the interpreter): below 2^-7 of the largest
        assert float(row[5]) < 2.0 ** -7, row
