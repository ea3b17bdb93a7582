"""The engine's CPU kernels as one native library (engine/kernels/cpu/*.c, pagoda_kernels.h): its
switches reach every entry point, the fused decode step's included; the ctypes signatures
native.py declares are the header's prototypes (a mismatch fails here instead of crashing a
call); and its cached build is named by every source and the header."""

from __future__ import annotations

import ctypes
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from engine.kernels.cpu import build, decode_step, native

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
HEADER = build.HERE / "pagoda_kernels.h"
SCALARS = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "float": ctypes.c_float}
STRUCTS = {"pg_proj": native.Proj, "pg_layer": native.Layer, "pg_shape": native.Shape}

needs_library = pytest.mark.skipif(native.library() is None,
                                   reason="no C compiler or no AVX2/FMA/F16C here")


def _header() -> str:
    """The header without comments and preprocessor lines."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", HEADER.read_text(), flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _ctype(declaration: str):
    """'const uint16_t *d' -> (name, the ctypes type a caller must pass: c_void_p for a pointer,
    POINTER(struct) for a pointer to one of STRUCTS, the struct or scalar itself otherwise)."""
    words = declaration.replace("*", " * ").split()
    words = [w for w in words if w != "const"]
    name, base, pointers = words[-1], words[0], words.count("*")
    if pointers:
        return name, ctypes.POINTER(STRUCTS[base]) if base in STRUCTS else ctypes.c_void_p
    return name, STRUCTS.get(base) or SCALARS[base]


def _prototypes() -> dict[str, tuple[list, object]]:
    found = {}
    for ret, name, params in re.findall(r"PAGODA_API\s+(\w+)\s+(\w+)\s*\(([^)]*)\)\s*;", _header()):
        args = [] if params.strip() == "void" else [_ctype(p)[1] for p in params.split(",")]
        found[name] = (args, None if ret == "void" else SCALARS[ret])
    return found


def _structs() -> dict[str, list]:
    found = {}
    for body, name in re.findall(r"typedef\s+struct\s*\{(.*?)\}\s*(\w+)\s*;", _header(), flags=re.S):
        fields = []
        for decl in filter(str.strip, body.split(";")):
            first, *more = decl.split(",")
            base = first.replace("*", " ").split()
            base = [w for w in base if w != "const"][0]
            fields += [_ctype(first)] + [_ctype(f"{base} {d}") for d in more]
        found[name] = fields
    return found


def test_every_entry_point_is_declared_as_the_header_prototypes_it():
    prototypes = _prototypes()
    assert prototypes and set(prototypes) == set(native.SIGNATURES)
    for name, (argtypes, restype) in native.SIGNATURES.items():
        assert (argtypes, restype) == prototypes[name], name


def test_the_structs_python_fills_have_the_headers_fields():
    structs = _structs()
    for c_name, struct in STRUCTS.items():
        assert struct._fields_ == structs[c_name], c_name


@needs_library
def test_one_library_exports_every_entry_point_and_nothing_else():
    lib = native.library()
    assert decode_step.library() is lib  # the products and the fused step: one library
    for name in native.SIGNATURES:
        assert hasattr(lib, name), name
    for internal in ("pg_matmul_team", "pg_attend_item", "pg_vnni_products", "pg_amx_on"):
        assert not hasattr(lib, internal), internal


def _run(script: str, **env: str) -> str:
    return subprocess.run([sys.executable, "-c", script], env={**os.environ, **env}, cwd=REPO_ROOT,
                          capture_output=True, text=True, check=True).stdout


@needs_library
@pytest.mark.e2e  # two engine processes
def test_pagoda_amx_off_reaches_the_fused_decode_step():
    if not native.library().pagoda_q4_amx():
        pytest.skip("no AMX here (or the kernel did not grant the tile state)")
    script = ("from engine.kernels.cpu import decode_step, qmatmul;"
              "print(qmatmul.library().pagoda_q4_amx(), decode_step.library().pagoda_q4_amx())")
    # the products and the fused step's products both off AMX, or both on
    assert _run(script, PAGODA_AMX="0").split() == ["0", "0"]
    assert _run(script, PAGODA_AMX="1").split() == ["1", "1"]


def test_the_cached_build_is_named_by_every_source_and_the_header(tmp_path, monkeypatch):
    for path in build.sources():
        shutil.copy(path, tmp_path)
    monkeypatch.setattr(build, "HERE", tmp_path)
    files = build.sources()
    assert "pagoda_kernels.h" in [p.name for p in files] and len(files) >= 6
    names = {build.digest("cc 1.0", build.NATIVE)}
    for path in files:
        text = path.read_text()
        path.write_text(text + "\n/* changed */\n")
        names.add(build.digest("cc 1.0", build.NATIVE))
        path.write_text(text)
    assert build.digest("cc 1.0", build.NATIVE) in names
    (tmp_path / "extra.c").write_text("/* a new source */\n")
    names.add(build.digest("cc 1.0", build.NATIVE))
    assert len(names) == len(files) + 2  # each change, and the new file, a build of its own
