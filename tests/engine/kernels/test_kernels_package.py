import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import engine.kernels
import engine.kernels.activation as activation
from engine.kernels import is_triton_usable

REPO_ROOT = Path(engine.kernels.__file__).resolve().parents[2]


def test_importing_the_engine_and_its_kernels_package_does_not_import_triton():
    code = "import sys, engine.kernels; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)


@pytest.mark.e2e
def test_kernels_compile_for_an_h200_without_a_gpu():
    # The interpreter runs programs the compiler would reject; compile each kernel to an sm_90
    # cubin in a process without TRITON_INTERPRET (ptxas ships with Triton; no GPU needed).
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    script = Path(__file__).with_name("sm90_compile.py")
    result = subprocess.run([sys.executable, str(script)], env=env, cwd=REPO_ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]


def test_kernels_are_interpreted_exactly_when_there_is_no_gpu():
    # Fails if a kernel module was built before the conftest set TRITON_INTERPRET.
    from triton.runtime.interpreter import InterpretedFunction

    on_gpu = torch.cuda.is_available()
    assert isinstance(activation._silu_and_mul_kernel, InterpretedFunction) == (not on_gpu)
    assert is_triton_usable("cpu") == (not on_gpu)
    if not on_gpu:
        assert not is_triton_usable("cuda")
