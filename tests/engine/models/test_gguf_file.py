"""engine/models/gguf_file.py reads what gguf's own GGUFReader reads: every field that is not an
array of strings, every array's length, every tensor's type, shape and bytes."""

import gguf
import numpy as np
import pytest
from gguf.quants import quantize

from engine.errors import ModelLoadError
from engine.models.gguf_file import LIST_LIMIT, GGUFFile, read_header
from engine.models.gguf_loader import load_gguf_config


def assert_reads_as_gguf_does(path):
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):  # the reader's own entries for the header's counts
            continue
        is_array = field.types[0] == gguf.GGUFValueType.ARRAY
        if is_array:
            assert ours.count(key) == len(field.data), key
        if is_array and field.types[-1] == gguf.GGUFValueType.STRING:
            assert ours.fields[key] is None, key  # counted, not kept
            continue
        value = ours.fields[key]
        expected = field.contents()
        if isinstance(value, np.ndarray):
            assert len(value) >= LIST_LIMIT and value.tolist() == expected, key
        else:
            assert value == expected and type(value) is type(expected), key
    assert set(ours.fields) == {k for k in theirs.fields if not k.startswith("GGUF.")}
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, theirs_t in zip(ours.tensors, theirs.tensors):
        assert mine.tensor_type == theirs_t.tensor_type
        assert mine.shape == tuple(theirs_t.shape.tolist())
        assert mine.data.dtype == theirs_t.data.dtype and mine.data.shape == theirs_t.data.shape, mine.name
        assert np.array_equal(mine.data, theirs_t.data), mine.name
        assert not mine.data.flags.writeable


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


def test_every_kind_of_field_and_tensor_reads_as_gguf_reads_it(tmp_path):
    path = tmp_path / "every.gguf"
    write_every_kind(path)
    assert_reads_as_gguf_does(path)
    ours = GGUFFile(path)
    assert ours.count("tokenizer.ggml.tokens") == 3000 and ours.field("missing", 5) == 5


@pytest.mark.slow
def test_the_bundled_model_reads_as_gguf_reads_it(smollm2_path):
    assert_reads_as_gguf_does(smollm2_path)


def test_a_cut_file_names_the_tensor_and_the_offset(tmp_path):
    path = tmp_path / "every.gguf"
    write_every_kind(path)
    data = path.read_bytes()
    header = read_header(path)
    last = max(header.tensors, key=lambda t: t.offset)
    (tmp_path / "cut.gguf").write_bytes(data[:header.data_start + last.offset + 4])
    with pytest.raises(ValueError, match=rf"tensor '{last.name}' needs bytes \d+\.\.\d+ but the file ends at offset"):
        GGUFFile(tmp_path / "cut.gguf")
    (tmp_path / "header.gguf").write_bytes(data[:200])  # inside the metadata
    with pytest.raises(ValueError):
        read_header(tmp_path / "header.gguf")
    with pytest.raises(ModelLoadError, match="cannot read GGUF file"):
        load_gguf_config(tmp_path / "header.gguf")
