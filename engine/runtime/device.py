"""Where a model runs and in what dtype: ``device`` and ``dtype`` settings resolved for this machine."""

from __future__ import annotations

import logging
import threading

import torch

from engine.kernels.cpu import cpu_info

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on CUDA and on CPUs that multiply bf16 natively (logged), else float32."""
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16
    dtype = torch.bfloat16 if cpu_info.has_fast_bf16() else torch.float32
    logger.info("dtype auto on CPU: %s (%s; bf16 needs one of %s)", str(dtype).removeprefix("torch."),
                cpu_info.describe(), "/".join(cpu_info.FAST_BF16_FLAGS))
    return dtype


class default_dtype:
    """torch's default dtype is ``dtype`` inside the block (what a model's layers are built in).

    The default dtype is the process's, not the thread's, so one block runs at a time: the
    embedded server loads its models on threads of their own, and two loads overlapping had one
    model's later layers (its final norm) built in the other's dtype, and the process left in
    bf16 after both. Seen as a served model whose greedy answers differed from the same model
    loaded alone (its fused step took float32 attention for a bf16 cache)."""

    _lock = threading.RLock()

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def __enter__(self):
        self._lock.acquire()
        self.previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        try:
            torch.set_default_dtype(self.previous)
        finally:
            self._lock.release()
