"""A GGUF file as the engine reads it: the header in one buffered pass, each tensor's bytes a view
into one read-only memory map.

gguf's own GGUFReader keeps a numpy view per part of every metadata field (a vocabulary string is
two): for Gemma 3 270M's 262,144-token vocabulary that was 10 s and ~470 MiB of Python objects on
every load, before a single weight was read. Here an array of strings is counted, not kept (the
tokenizer is transformers' conversion, made once and cached: engine/text/tokenizer.py); numeric
arrays come back as lists, as numpy arrays from ``LIST_LIMIT`` items. A tensor's ``data`` is what
GGUFReader hands out for it (F32, F16, F64 and the integer types as their values; every other
type as its raw blocks, uint8 rows of ``gguf.quants.quant_shape_to_byte_shape``), so gguf's
dequantization takes it as it is.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

LIST_LIMIT = 1024
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_VALUE_TYPES = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
                GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
                GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
                GGMLQuantizationType.I64: np.int64}


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as the header lists it: ``dims`` in GGUF's order (the fastest-varying first),
    its GGML type's number and the offset of its bytes from the data section's start."""

    name: str
    dims: tuple[int, ...]
    kind: int
    offset: int


@dataclass(frozen=True)
class GGUFHeader:
    fields: dict[str, object]
    counts: dict[str, int] = field(default_factory=dict)  # each array field's number of items
    tensors: list[TensorInfo] = field(default_factory=list)
    data_start: int = 0  # the tensor data's offset in the file (aligned)


def read_header(path: Path | str) -> GGUFHeader:
    """GGUF v2/v3 metadata and tensor table; ValueError (or struct.error, UnicodeDecodeError on a
    cut or garbled file) where it cannot be read."""
    with open(path, "rb", buffering=1 << 20) as f:
        def read(fmt: str):
            size = struct.calcsize(fmt)
            data = f.read(size)
            if len(data) != size:
                raise ValueError(f"the header ends early, at offset {f.tell()}")
            return struct.unpack(fmt, data)[0]

        def string() -> str:
            return f.read(read("<Q")).decode("utf-8")

        if f.read(4) != b"GGUF" or read("<I") < 2:
            raise ValueError("not a GGUF v2/v3 file")
        num_tensors, num_fields = read("<Q"), read("<Q")
        fields: dict[str, object] = {}
        counts: dict[str, int] = {}

        def value(key: str, kind: int):
            if kind == _STRING:
                return string()
            if kind != _ARRAY:
                return read(_SCALARS[kind])
            item_kind, count = read("<I"), read("<Q")
            counts[key] = count
            if item_kind == _STRING:
                for _ in range(count):  # skipped: a vocabulary is transformers' to read
                    f.seek(read("<Q"), 1)
                return None
            if item_kind not in _SCALARS:
                raise ValueError(f"field {key!r}: arrays of type {item_kind} are not supported")
            fmt = _SCALARS[item_kind]
            data = f.read(struct.calcsize(fmt) * count)
            array = np.frombuffer(data, dtype=np.dtype(fmt))
            if len(array) != count:
                raise ValueError(f"field {key!r}: the file ends inside it")
            return array.tolist() if count < LIST_LIMIT else array

        for _ in range(num_fields):
            key = string()
            fields[key] = value(key, read("<I"))
        tensors = []
        for _ in range(num_tensors):
            name = string()
            dims = tuple(read("<Q") for _ in range(read("<I")))
            tensors.append(TensorInfo(name, dims, read("<I"), read("<Q")))
        alignment = int(fields.get("general.alignment") or 32)
        data_start = -(-f.tell() // alignment) * alignment
    return GGUFHeader(fields, counts, tensors, data_start)


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # GGUF's order: the fastest-varying dimension first
    tensor_type: GGMLQuantizationType
    data: np.ndarray  # a read-only view into the file (see the module's docstring)


class GGUFFile:
    """The header's fields and the tensors of ``path``, whose bytes are read only when used."""

    def __init__(self, path: Path | str):
        header = read_header(path)
        self.fields, self._counts = header.fields, header.counts
        memory = np.memmap(path, mode="r")
        self.tensors: list[GGUFTensor] = []
        names = set()
        for info in header.tensors:
            if info.name in names:
                raise ValueError(f"tensor {info.name!r} is listed twice")
            names.add(info.name)
            self.tensors.append(_tensor(memory, header.data_start, info))

    def field(self, key: str, default=None):
        value = self.fields.get(key)
        return default if value is None else value

    def count(self, key: str) -> int | None:
        """The number of items of an array field (a vocabulary's tokens), None if absent."""
        return self._counts.get(key)


def _tensor(memory: np.memmap, data_start: int, info: TensorInfo) -> GGUFTensor:
    try:
        kind = GGMLQuantizationType(info.kind)
        block, block_bytes = GGML_QUANT_SIZES[kind]
    except (ValueError, KeyError):
        raise ValueError(f"tensor {info.name!r} has an unknown GGML type {info.kind}") from None
    numel = int(np.prod(info.dims, dtype=np.int64)) if info.dims else 1
    start = data_start + info.offset
    end = start + numel // block * block_bytes
    if end > len(memory):
        raise ValueError(f"tensor {info.name!r} needs bytes {start}..{end} but the file ends at "
                         f"offset {len(memory)}")
    shape = tuple(reversed(info.dims))
    if kind in _VALUE_TYPES:
        data = memory[start:end].view(_VALUE_TYPES[kind]).reshape(shape)
    else:
        data = memory[start:end].reshape(quant_shape_to_byte_shape(shape, kind))
    return GGUFTensor(info.name, info.dims, kind, data)
