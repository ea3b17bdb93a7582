"""Compile the kernel sources beside this file (every ``*.c``, with ``pagoda_kernels.h``) into one
shared library once per sources, compiler and CPU, and load it with ctypes (native.py declares it).

The library goes to ``$PAGODA_KERNEL_CACHE`` (default ``~/.cache/pagoda/kernels``) under a name
hashed from every source and the header (names and text), the compiler's version and the CPU's
model and flags, so a changed file or another machine builds afresh and a cached file is never
one built for a different CPU. It links the OpenMP runtime torch itself loaded, so the kernels'
threads are torch's threads, not a second pool competing with them for the cores.
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

from engine.kernels.cpu.cpu_info import cpu_flags, isa_cap

logger = logging.getLogger(__name__)

HERE = pathlib.Path(__file__).resolve().parent
NAME = "pagoda_kernels"
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-fvisibility=hidden")
NATIVE = ("-march=native",)  # the instruction set of the machine that builds (and runs) it
# under PAGODA_MAX_CPU_ISA (engine.kernels.cpu.cpu_info): AVX2 + FMA + F16C + BMI2 only, or all but AMX
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


def sources(folder: pathlib.Path | None = None) -> list[pathlib.Path]:
    """The library's files in ``folder`` (default: here), sorted: the .c files it is compiled
    from and the header they include."""
    return sorted((folder or HERE).glob("*.[ch]"))


def units(folder: pathlib.Path | None = None) -> list[pathlib.Path]:
    """The .c files of ``folder`` (default: here), compiled and linked together."""
    return [p for p in sources(folder) if p.suffix == ".c"]


def _compile(files: list[pathlib.Path], target: pathlib.Path, compiler: str,
             arch: tuple[str, ...]) -> None:
    """``files`` (.c) compiled and linked together into the library ``target``."""
    gomp = _torch_openmp()
    link = [f"-Wl,-rpath,{gomp.parent}", str(gomp)] if gomp else []
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, *arch, *map(str, files), "-o", tmp, *link], check=True,
                       capture_output=True, text=True, timeout=120)
        os.replace(tmp, target)  # atomic: a concurrent build of the same name loses nothing
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def default_arch() -> tuple[str, ...]:
    """This machine's instruction set, or the part of it PAGODA_MAX_CPU_ISA leaves."""
    cap = isa_cap()
    return CAPPED[cap] if cap else NATIVE


def load(arch: tuple[str, ...] | None = None) -> ctypes.CDLL | None:
    """The library built from the sources here for ``arch`` (compiler flags; default:
    ``default_arch()``), undeclared (native.library() is the engine's, declared), or None
    (disabled, no compiler, build failed: logged once)."""
    arch = arch or default_arch()
    key = " ".join(arch)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        _loaded[key] = lib = _build_and_load(arch) if enabled() else None
        return lib


def _build_and_load(arch: tuple[str, ...]) -> ctypes.CDLL | None:
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        logger.info("no C compiler: native CPU kernels off, torch's kernels in use")
        return None
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
        target = cache_dir() / f"{NAME}-{digest(version, arch)}.so"
        if not target.exists():
            _compile(units(), target, compiler, arch)
            logger.info("built native CPU kernels %s", target)
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        logger.warning("native CPU kernels not built (%s): torch's kernels in use", detail)
        return None


def digest(compiler_version: str, arch: tuple[str, ...]) -> str:
    """The build's name in the cache: every source and the header (name and text), the compiler,
    the flags and the CPU."""
    files = [f"{p.name}\0{p.read_text()}" for p in sources()]
    return hashlib.sha256("\0".join(
        [NAME, *files, compiler_version, " ".join(FLAGS + arch), _cpu_identity()]
    ).encode()).hexdigest()[:16]
