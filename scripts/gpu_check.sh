#!/usr/bin/env bash
# One command on a machine with an NVIDIA GPU, under 8 minutes, no internet needed:
#   1. the GPU tests (tests/engine/gpu: parity with transformers on the device, CUDA graphs,
#      memory profiling), which skip themselves without CUDA;
#   2. bench/gpu.py: greedy parity on SmolLM2, decode tokens/s at batch 1/16/64/256 for a
#      Llama-3-8B-shaped random model and for SmolLM2, beside transformers, and the memory
#      bandwidth reached at batch 1.
# Usage: scripts/gpu_check.sh [extra bench/gpu.py arguments]
# The virtualenv is built with `make venv` only if it is missing; its torch must be a CUDA build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

[ -x .venv/bin/python ] || make venv
PY=.venv/bin/python
export PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false

"$PY" - <<'PYEOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device (CUDA build: "
             f"{torch.version.cuda}); install a CUDA build of torch into .venv")
print(f"gpu_check: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
PYEOF

status=0
echo "== GPU tests"
# -m gpu: only the tests that need the device; -s: the bf16 parity test prints its agreement.
timeout 210 "$PY" -m pytest -m gpu tests/engine/gpu -q -s -p no:cacheprovider || status=$?

echo "== bench/gpu.py"
timeout 240 "$PY" bench/gpu.py "$@" || status=$?

exit "$status"
