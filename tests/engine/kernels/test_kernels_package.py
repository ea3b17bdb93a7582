import subprocess
import sys
from pathlib import Path

import torch

import engine.kernels
import engine.kernels.activation as activation
from engine.kernels import is_triton_usable

REPO_ROOT = Path(engine.kernels.__file__).resolve().parents[2]


def test_importing_the_engine_and_its_kernels_package_does_not_import_triton():
    code = "import sys, engine.kernels; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)


def test_kernels_are_interpreted_exactly_when_there_is_no_gpu():
    # Fails if a kernel module was built before the conftest set TRITON_INTERPRET.
    from triton.runtime.interpreter import InterpretedFunction

    interpreted = isinstance(activation._silu_and_mul_kernel, InterpretedFunction)
    assert interpreted == (not torch.cuda.is_available())
    assert is_triton_usable("cpu") == (not torch.cuda.is_available())
    assert is_triton_usable("cuda") == torch.cuda.is_available()
