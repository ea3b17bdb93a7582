"""Compile a kernel source beside this file into a shared library once per source, compiler and
CPU, and load it with ctypes.

The library goes to ``$PAGODA_KERNEL_CACHE`` (default ``~/.cache/pagoda/kernels``) under a name
hashed from the source, the compiler's version and the CPU's model and flags, so a changed source
or another machine builds afresh and a cached file is never one built for a different CPU. It links
the OpenMP runtime torch itself loaded, so the kernels' threads are torch's threads, not a second
pool competing with them for the cores.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading

logger = logging.getLogger(__name__)

HERE = pathlib.Path(__file__).resolve().parent
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c11")
NATIVE = ("-march=native",)  # the instruction set of the machine that builds (and runs) it
# under PAGODA_MAX_CPU_ISA (engine.cpu_info): AVX2 + FMA + F16C + BMI2 only, or all but AMX
CAPPED = {"avx2": ("-march=x86-64-v3", "-mtune=native"),
          "avx512": ("-march=native", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")}
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}


def env_switch(name: str) -> bool:
    """An on-by-default switch of the environment: 0, false, no or off turn it off."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def enabled() -> bool:
    return env_switch("PAGODA_NATIVE_KERNELS")


def likely_available() -> bool:
    """Whether the native kernels should build and run here (on, a C compiler, AVX2 + FMA + F16C),
    without building them: for estimates made before anything loads."""
    if not enabled() or not (os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")):
        return False
    from engine.cpu_info import cpu_flags

    return {"avx2", "fma", "f16c"} <= cpu_flags()


def cache_dir() -> pathlib.Path:
    default = pathlib.Path.home() / ".cache" / "pagoda" / "kernels"
    return pathlib.Path(os.environ.get("PAGODA_KERNEL_CACHE") or default)


def _cpu_identity() -> str:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.uname().machine
    keep = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(keep)))


def _torch_openmp() -> pathlib.Path | None:
    import torch

    lib = pathlib.Path(torch.__file__).parent / "lib"
    found = sorted(lib.glob("libgomp*.so*"))
    return found[0] if found else None


def _compile(source: pathlib.Path, target: pathlib.Path, compiler: str, arch: tuple[str, ...]) -> None:
    gomp = _torch_openmp()
    link = [f"-Wl,-rpath,{gomp.parent}", str(gomp)] if gomp else []
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, *arch, str(source), "-o", tmp, *link], check=True,
                       capture_output=True, text=True, timeout=120)
        os.replace(tmp, target)  # atomic: a concurrent build of the same name loses nothing
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def default_arch() -> tuple[str, ...]:
    """This machine's instruction set, or the part of it PAGODA_MAX_CPU_ISA leaves."""
    from engine.cpu_info import isa_cap

    cap = isa_cap()
    return CAPPED[cap] if cap else NATIVE


def load(name: str, arch: tuple[str, ...] | None = None) -> ctypes.CDLL | None:
    """The library built from ``HERE / f"{name}.c"`` for ``arch`` (compiler flags; default:
    ``default_arch()``), or None (disabled, no compiler, build failed: logged once)."""
    arch = arch or default_arch()
    key = f"{name} {' '.join(arch)}"
    with _lock:
        if key in _loaded:
            return _loaded[key]
        _loaded[key] = lib = _build_and_load(name, arch) if enabled() else None
        return lib


def _build_and_load(name: str, arch: tuple[str, ...]) -> ctypes.CDLL | None:
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        logger.info("no C compiler: native CPU kernels off, torch's kernels in use")
        return None
    source = HERE / f"{name}.c"
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
        # every source here, since one may include another (decode_step.c includes qmatmul.c)
        sources = [p.read_text() for p in sorted(HERE.glob("*.[ch]"))]
        digest = hashlib.sha256("\0".join(
            [name, *sources, version, " ".join(FLAGS + arch), _cpu_identity()]
        ).encode()).hexdigest()[:16]
        target = cache_dir() / f"{name}-{digest}.so"
        if not target.exists():
            _compile(source, target, compiler, arch)
            logger.info("built native CPU kernel %s", target)
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        logger.warning("native CPU kernel %s not built (%s): torch's kernels in use", name, detail)
        return None
