"""A small GGUF with every kind of metadata value and a few tensor types, for the reader's tests."""

import gguf
import numpy as np
from gguf.quants import quantize

from engine.models.gguf_file import LIST_LIMIT


def write_every_kind(path, *, vocab=3000):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("t.u32", 7)
    writer.add_int32("t.i32", -7)
    writer.add_float32("t.f32", 0.1)
    writer.add_float64("t.f64", 0.1)
    writer.add_bool("t.bool", True)
    writer.add_uint64("t.u64", 2 ** 40)
    writer.add_string("t.text", "naïve ✓")
    writer.add_array("t.small", [1, 2, 3])
    writer.add_array("t.floats", [0.5] * (LIST_LIMIT + 5))
    writer.add_token_list([f"tok{i}" for i in range(vocab)])
    writer.add_token_scores([float(i) for i in range(vocab)])
    rng = np.random.default_rng(0)
    writer.add_tensor("f32", rng.standard_normal((3, 64), dtype=np.float32))
    writer.add_tensor("f16", rng.standard_normal((4, 32)).astype(np.float16))
    q8 = quantize(rng.standard_normal((8, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("i32", np.arange(10, dtype=np.int32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
