"""Converting a checkpoint's safetensors shards to another dtype (engine/cli/convert.py, engine.cli.validate)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open

from engine.cli.convert import convert_checkpoint
from engine.errors import EngineError
from engine.cli.validate import main


def shard_dtypes(directory) -> set[torch.dtype]:
    dtypes = set()
    for file in directory.glob("*.safetensors"):
        with safe_open(file, framework="pt") as shard:
            dtypes.update(shard.get_tensor(name).dtype for name in shard.keys())
    return dtypes


def size(directory) -> int:
    return sum(f.stat().st_size for f in directory.glob("*.safetensors"))


def test_bfloat16_conversion_rewrites_every_tensor_and_halves_the_shards(tiny_llama_dir, tmp_path):
    model = shutil.copytree(tiny_llama_dir, tmp_path / "m")
    assert shard_dtypes(model) == {torch.float32}
    steps = []

    converted = convert_checkpoint(model, "bfloat16", lambda step, p: steps.append((step, p)))

    assert shard_dtypes(model) == {torch.bfloat16}
    assert 0.45 < size(model) / size(tiny_llama_dir) < 0.55
    assert json.loads((model / "config.json").read_text())["torch_dtype"] == "bfloat16"
    with safe_open(tiny_llama_dir / "model.safetensors", framework="pt") as before, \
            safe_open(model / "model.safetensors", framework="pt") as after:
        assert converted == len(list(before.keys()))
        name = "model.embed_tokens.weight"
        assert torch.equal(after.get_tensor(name), before.get_tensor(name).to(torch.bfloat16))
    assert steps[-1] == ("converted to bfloat16", 1.0)
    assert not list(model.glob("*.converting"))


@pytest.mark.slow
def test_validate_with_convert_dtype_reports_the_converted_size_and_dtype(tiny_llama_dir, tmp_path, capsys):
    model = shutil.copytree(tiny_llama_dir, tmp_path / "m")

    assert main([str(model), "--convert-dtype", "float16"]) == 0

    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert records[0]["step"].startswith("converting model.safetensors to float16")
    progress = [r["progress"] for r in records[:-1]]
    assert progress == sorted(progress) and progress[-1] == 1.0
    final = records[-1]
    assert final["ok"] is True and final["dtype"] == "float16"
    assert final["size_bytes"] == sum(f.stat().st_size for f in model.iterdir())
    assert final["size_bytes"] < 0.6 * sum(f.stat().st_size for f in tiny_llama_dir.iterdir())
    assert shard_dtypes(model) == {torch.float16}


def test_a_gguf_file_is_not_converted(tmp_path, capsys):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))

    with pytest.raises(EngineError, match="GGUF file keeps the quantisation"):
        convert_checkpoint(gguf, "bfloat16", lambda step, p: None)
    assert main([str(gguf), "--convert-dtype", "bfloat16"]) == 1
    final = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert final["ok"] is False and "GGUF" in final["error"]
    assert gguf.read_bytes() == b"GGUF" + bytes(64)
