"""Triton kernels, one module per kernel family, each with a plain-torch `*_ref` beside it.

Importing this package imports neither Triton nor any kernel, so the CPU path never pays for
them. Under TRITON_INTERPRET=1 (set before a kernel module is first imported) the
kernels run on CPU tensors through Triton's interpreter, which is how they are tested without
a GPU.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def is_triton_usable(device: torch.device | str) -> bool:
    """Whether the kernels can run on tensors of `device`: compiled on CUDA (sm80+), interpreted
    on CPU."""
    import torch

    device = torch.device(device)
    if importlib.util.find_spec("triton") is None:
        return False
    if device.type == "cuda":  # bfloat16 tensor-core dots need Ampere (sm80) or newer
        return torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (8, 0)
    from engine.kernels.common import is_interpreting

    return device.type == "cpu" and is_interpreting()
