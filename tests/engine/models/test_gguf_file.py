"""engine/models/gguf_file.py reads what gguf's own GGUFReader reads: every field that is not an
array of strings, every array's length, every tensor's type, shape and bytes."""

import gguf
import numpy as np
import pytest

from engine.errors import ModelLoadError
from engine.models.gguf_file import LIST_LIMIT, GGUFFile, read_header
from engine.models.gguf_loader import load_gguf_config
from tests.engine.tiny_gguf import write_every_kind


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
