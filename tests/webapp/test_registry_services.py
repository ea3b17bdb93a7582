"""Registering, preparing and activating model versions."""

import json
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import IntegrityError

from webapp.registry.models import ModelVersion
from webapp.registry.selectors import modelversion_get_active, modelversion_list_active, modelversion_served
from webapp.registry.services import (bundled_model_path, model_create, model_register, modelversion_activate,
                                      modelversion_create, modelversion_deactivate)
from webapp.registry.tokenizers import load_tokenizer

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]


@pytest.fixture
def gguf_file(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"not really a gguf")
    return path


@pytest.fixture
def hf_dir(tmp_path):
    path = tmp_path / "hf"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def prepared(version, tokenizer_dir):
    """Mark a version's tokenizer as exported (the export itself is tested below, once)."""
    version.tokenizer_dir = str(tokenizer_dir)
    version.save()
    return version


def test_versions_are_numbered_per_model_and_their_format_is_detected(gguf_file, hf_dir):
    model = model_create(slug="tiny")

    first = modelversion_create(model=model, path=gguf_file)
    second = modelversion_create(model=model, path=hf_dir, engine_settings={"max_model_len": 256})

    assert (first.number, first.format) == (1, "gguf")
    assert (second.number, second.format) == (2, "hf")
    assert second.engine_settings == {"max_model_len": 256}
    assert first.status == second.status == ModelVersion.Status.REGISTERED


def test_a_path_that_is_no_checkpoint_is_refused(tmp_path):
    model = model_create(slug="tiny")
    (tmp_path / "weights.bin").write_bytes(b"x")

    with pytest.raises(ValidationError, match="neither a .gguf file nor"):
        modelversion_create(model=model, path=tmp_path / "weights.bin")
    with pytest.raises(ValidationError, match="neither"):
        modelversion_create(model=model, path=tmp_path / "missing")


@pytest.mark.parametrize(("engine_settings", "named"), [
    ({"max_model_length": 512}, "max_model_length"),
    ({"block_size": 12}, "block_size"),
    ({"dtype": "int3"}, "dtype"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"enable_prefix_caching": "yes"}, "enable_prefix_caching"),
])
def test_bad_engine_settings_are_refused_naming_the_setting(gguf_file, engine_settings, named):
    model = model_create(slug="tiny")

    with pytest.raises(ValidationError, match=named):
        modelversion_create(model=model, path=gguf_file, engine_settings=engine_settings)
    assert not ModelVersion.objects.exists()


def test_activating_a_version_retires_the_active_one(gguf_file, hf_dir, smollm2_tokenizer_dir):
    model = model_create(slug="tiny")
    first = prepared(modelversion_create(model=model, path=gguf_file), smollm2_tokenizer_dir)
    second = prepared(modelversion_create(model=model, path=hf_dir), smollm2_tokenizer_dir)

    modelversion_activate(version=first)
    modelversion_activate(version=second)

    first.refresh_from_db()
    assert first.status == ModelVersion.Status.INACTIVE
    assert modelversion_get_active(slug="tiny") == second
    modelversion_deactivate(version=second)
    assert modelversion_get_active(slug="tiny") is None


def test_the_database_refuses_two_active_versions_of_one_model(gguf_file, hf_dir):
    model = model_create(slug="tiny")
    modelversion_create(model=model, path=gguf_file)
    modelversion_create(model=model, path=hf_dir)

    with pytest.raises(IntegrityError):
        ModelVersion.objects.filter(model=model).update(status=ModelVersion.Status.ACTIVE)


def test_active_versions_are_listed_one_per_model(gguf_file, hf_dir, smollm2_tokenizer_dir):
    for slug in ("b-model", "a-model"):
        model = model_create(slug=slug)
        modelversion_activate(version=prepared(modelversion_create(model=model, path=gguf_file),
                                               smollm2_tokenizer_dir))
    modelversion_create(model=model_create(slug="c-idle"), path=hf_dir)

    assert [v.model.slug for v in modelversion_list_active()] == ["a-model", "b-model"]


@pytest.mark.slow
def test_a_checkpoint_whose_tokenizer_cannot_be_exported_is_marked_failed(gguf_file):
    with pytest.raises(ValidationError, match="tokenizer export failed"):
        model_register(slug="broken", path=gguf_file)

    version = ModelVersion.objects.get(model__slug="broken")
    assert version.status == ModelVersion.Status.FAILED
    assert "tokenizer export failed" in version.error
    assert modelversion_get_active(slug="broken") is None


@pytest.mark.slow
def test_ensure_bundled_model_registers_and_activates_smollm2_once(media_root, capsys):
    call_command("ensure_bundled_model")
    call_command("ensure_bundled_model")

    version = ModelVersion.objects.get()
    assert (version.model.slug, version.number, version.status) == ("smollm2", 1, ModelVersion.Status.ACTIVE)
    assert Path(version.path) == bundled_model_path() and version.format == "gguf"
    assert Path(version.tokenizer_dir).is_relative_to(media_root)
    meta = json.loads((Path(version.tokenizer_dir) / "tokenizer_config.json").read_text())
    assert meta["eos_token"] == "<|im_end|>"
    chat_ids = load_tokenizer(version.tokenizer_dir).apply_chat_template([{"role": "user", "content": "Hi"}])
    assert chat_ids[-4:] == load_tokenizer(version.tokenizer_dir).encode("<|im_start|>assistant\n")
    assert "smollm2 v1 active" in capsys.readouterr().out


def test_the_served_version_is_the_one_the_answering_worker_names():
    model = model_create(slug="swapper")
    v1, v2 = (ModelVersion.objects.create(model=model, number=n, path=f"/ckpt/{n}", format="hf") for n in (1, 2))
    other = ModelVersion.objects.create(model=model_create(slug="other"), number=3, path="/ckpt/o", format="hf")

    assert modelversion_served(admitted=v2, served_label=None) == v2  # an error before any worker answered
    assert modelversion_served(admitted=v2, served_label="2") == v2
    assert modelversion_served(admitted=v2, served_label="1") == v1  # admitted mid-switch, answered by v1
    assert modelversion_served(admitted=v2, served_label="3") == v2  # another model's number: not ours
    assert modelversion_served(admitted=v2, served_label="v9") == v2  # not a registry label
    assert other.number == 3


def _gguf(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + bytes(64))
    return path


@pytest.mark.parametrize("where", [
    "models/other/v1/m.gguf",  # a file inside another model's upload folder
    "models/reg/v1/m.gguf",  # even inside the folder its own upload would have had
    "models/m.gguf",  # at the top of the uploads tree
])
def test_deleting_a_registered_version_never_deletes_files_even_under_media_root(media_root, where):
    from webapp.registry.services import modelversion_delete, modelversion_register_path

    checkpoint = _gguf(Path(media_root) / where)
    neighbour = _gguf(checkpoint.parent / "neighbour.gguf")
    version = modelversion_register_path(model_slug="reg", path=str(checkpoint))

    modelversion_delete(version=version)

    assert not ModelVersion.objects.filter(pk=version.pk).exists()
    assert checkpoint.is_file() and neighbour.is_file()


def test_deleting_a_registered_directory_under_media_root_leaves_it(media_root, hf_dir):
    import shutil

    from webapp.registry.services import modelversion_delete

    folder = Path(media_root) / "models" / "reg"  # a model's whole uploads folder, registered as a checkpoint
    shutil.copytree(hf_dir, folder)
    upload = _gguf(folder / "v1" / "m.gguf")
    version = modelversion_create(model=model_create(slug="reg"), path=folder)

    modelversion_delete(version=version)

    assert (folder / "config.json").is_file() and upload.is_file()


def test_deleting_an_uploaded_version_removes_only_its_own_folder_and_tokenizer_export(media_root):
    from webapp.registry.services import modelversion_delete, tokenizer_dir_for, upload_dir_for

    model = model_create(slug="up")
    kept = ModelVersion.objects.create(model=model, number=1, format="gguf", is_uploaded=True,
                                       path=str(_gguf(Path(media_root) / "models/up/v1/a.gguf")))
    doomed = ModelVersion.objects.create(model=model, number=2, format="gguf", is_uploaded=True,
                                         path=str(_gguf(Path(media_root) / "models/up/v2/b.gguf")))
    export = tokenizer_dir_for(doomed)
    export.mkdir(parents=True)
    (export / "tokenizer.json").write_text("{}")

    modelversion_delete(version=doomed)

    assert not upload_dir_for(doomed).exists() and not export.exists()
    assert Path(kept.path).is_file()


def test_an_uploaded_version_whose_path_left_its_folder_deletes_nothing(media_root):
    from webapp.registry.services import modelversion_delete

    elsewhere = _gguf(Path(media_root) / "models/up/v7/c.gguf")  # another version's folder
    own_folder = _gguf(Path(media_root) / "models/up/v1/keep.gguf").parent
    version = ModelVersion.objects.create(model=model_create(slug="up"), number=1, format="gguf",
                                          is_uploaded=True, path=str(elsewhere))

    modelversion_delete(version=version)

    assert elsewhere.is_file() and (own_folder / "keep.gguf").is_file()
