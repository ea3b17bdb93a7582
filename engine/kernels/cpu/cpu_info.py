"""What this machine's CPU computes fast and how much memory it has, read once at start-up.

bf16 is "fast" when the CPU multiplies it natively (AVX512-BF16 or AMX-BF16): there torch's bf16
GEMMs run 2.4-3.3x faster than fp32 (issue 12's measurements); elsewhere bf16 is emulated and
slower than fp32.

``PAGODA_MAX_CPU_ISA`` caps what the engine uses of the CPU, as ``ONEDNN_MAX_CPU_ISA`` does for
oneDNN: ``avx2`` runs it as on an AVX2-only CPU (no AVX-512, VNNI or AMX: fp32 by default, the
native kernels built for x86-64-v3), ``avx512`` as on one without AMX; unset or ``native``, all of
it. It measures or tests a smaller CPU's path on a bigger one; torch's own kernels take their caps
from the variables ``torch_cap_environment`` names, read before torch is imported.
"""

from __future__ import annotations

import os
from functools import lru_cache

FAST_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
NOTABLE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16",
                 "amx_int8", "amx_tile", "avx512_fp16")


# the flags each cap hides (prefixes), and torch's own names for the cap
ISA_CAPS = {"avx2": ("avx512", "amx", "avx_vnni"), "avx512": ("amx",)}
_TORCH_CAPS = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                        "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
               "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}}


def isa_cap() -> str | None:
    """PAGODA_MAX_CPU_ISA ("avx2", "avx512"), or None for the whole CPU; ValueError names a bad one."""
    value = os.environ.get("PAGODA_MAX_CPU_ISA", "").strip().lower()
    if value in ("", "native"):
        return None
    if value not in ISA_CAPS:
        raise ValueError(f"PAGODA_MAX_CPU_ISA={value!r}: expected one of native, {', '.join(ISA_CAPS)}")
    return value


def torch_cap_environment(cap: str | None) -> dict[str, str]:
    """The environment that caps torch, oneDNN and MKL at ``cap`` too (for a child process)."""
    return {"PAGODA_MAX_CPU_ISA": cap, **_TORCH_CAPS[cap]} if cap else {}


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The first processor's flags in /proc/cpuinfo (empty where there is none), less those
    PAGODA_MAX_CPU_ISA hides."""
    flags: frozenset[str] = frozenset()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = frozenset(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    hidden = ISA_CAPS.get(isa_cap() or "", ())
    return frozenset(f for f in flags if not f.startswith(hidden)) if hidden else flags


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
    cap = f" (capped at {isa_cap()} by PAGODA_MAX_CPU_ISA)" if isa_cap() else ""
    return f"torch {cpu_capability()}; flags {' '.join(notable) or 'none of note'}{cap}"


def total_memory_bytes() -> int:
    """Physical memory (MemTotal), 0 when unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0
