"""The machine a figure was measured on, for the line every bench script prints beside it.

lscpu's model name, the CPU count and the flags that decide the engine's kernels (AVX2, FMA,
F16C, AVX-VNNI, every AVX-512 extension, AMX). The CPU changes between sessions here, so a
figure without this line cannot be compared with another.
"""

from __future__ import annotations

import os
import subprocess

KERNEL_FLAGS = ("avx2", "fma", "f16c", "avx_vnni")
KERNEL_FLAG_PREFIXES = ("avx512", "amx")


def lscpu() -> dict[str, str]:
    """lscpu's fields by name ({} where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {name.strip(): value.strip() for name, _, value in
            (line.partition(":") for line in out.splitlines()) if value}


def cpu_line() -> str:
    """``Intel(R) Xeon(R) Processor; 2 CPUs; flags avx2 fma ... amx_tile``."""
    fields = lscpu()
    flags = [f for f in fields.get("Flags", "").split()
             if f in KERNEL_FLAGS or f.startswith(KERNEL_FLAG_PREFIXES)]
    return (f"{fields.get('Model name', '?')}; {os.cpu_count()} CPUs; "
            f"flags {' '.join(flags) or 'none of avx2/avx512/amx'}")


def load_line() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
