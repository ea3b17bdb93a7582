"""What this machine's CPU computes fast and how much memory it has, read once at start-up.

bf16 is "fast" when the CPU multiplies it natively (AVX512-BF16 or AMX-BF16): there torch's bf16
GEMMs run 2.4-3.3x faster than fp32 (issue 12's measurements); elsewhere bf16 is emulated and
slower than fp32.
"""

from __future__ import annotations

import os
from functools import lru_cache

FAST_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
NOTABLE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16",
                 "amx_int8", "amx_tile", "avx512_fp16")


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The first processor's flags in /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_capability() -> str:
    """torch's dispatch level for CPU kernels ("AVX512", "AVX2", "DEFAULT", ...)."""
    import torch
    try:
        return torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        return "unknown"


def has_fast_bf16() -> bool:
    return any(flag in cpu_flags() for flag in FAST_BF16_FLAGS)


def describe() -> str:
    """'torch AVX512; flags avx512f avx512_bf16 ...' for logs and benchmark tables."""
    notable = [f for f in NOTABLE_FLAGS if f in cpu_flags()]
    return f"torch {cpu_capability()}; flags {' '.join(notable) or 'none of note'}"


def total_memory_bytes() -> int:
    """Physical memory (MemTotal), 0 when unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0
