"""Uploading a checkpoint: safe unpacking, refusals with reasons, and validation in a child process.

Archives are built here from real files (the tiny random Llama of tests/conftest.py); the
validation task runs eagerly (no REDIS_URL) and starts the real ``python -m engine.cli.validate``.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.files import File
from safetensors import safe_open

from webapp.registry.models import Model, ModelVersion
from webapp.registry.services import modelversion_upload

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]


def zip_dir(directory: Path, archive: Path) -> Path:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        for file in sorted(directory.iterdir()):
            zf.write(file, file.name)
    return archive


def tar_dir(directory: Path, archive: Path, top: str = "tiny_llama") -> Path:
    with tarfile.open(archive, "w:gz", compresslevel=1) as tf:
        tf.add(directory, arcname=top)  # one top-level folder: the upload flattens it away
    return archive


def tar_with(archive: Path, members: list[tarfile.TarInfo], data: bytes = b"x") -> Path:
    with tarfile.open(archive, "w:gz") as tf:
        for member in members:
            if member.isfile():
                member.size = len(data)
                tf.addfile(member, io.BytesIO(data))
            else:
                tf.addfile(member)
    return archive


def upload(archive: Path, slug: str = "tiny"):
    with archive.open("rb") as handle:
        return modelversion_upload(model_slug=slug, uploaded_file=File(handle, name=archive.name),
                                   engine_settings={})


def safetensors_numel(directory: Path) -> int:
    total = 0
    for file in directory.glob("*.safetensors"):
        with safe_open(file, framework="pt") as shard:
            for name in shard.keys():
                numel = 1
                for dim in shard.get_slice(name).get_shape():
                    numel *= dim
                total += numel
    return total


@pytest.mark.slow
@pytest.mark.parametrize("pack", [zip_dir, tar_dir], ids=["zip", "tar.gz"])
def test_uploaded_checkpoint_validates_to_ready_with_the_safetensors_parameter_count(
        pack, tiny_llama_dir, tmp_path, media_root, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        version = upload(pack(tiny_llama_dir, tmp_path / ("upload.zip" if pack is zip_dir else "upload.tar.gz")))

    version.refresh_from_db()
    assert (version.status, version.error) == (ModelVersion.Status.READY, "")
    assert version.progress == 1.0
    assert version.validation["parameters"] == safetensors_numel(tiny_llama_dir)
    assert version.validation["context_length"] == json.loads(
        (tiny_llama_dir / "config.json").read_text())["max_position_embeddings"]
    stored = Path(version.path)
    assert stored == (media_root / "models" / "tiny" / "v1").resolve()
    assert (stored / "config.json").is_file()  # the single top-level folder was flattened
    assert version.validation["size_bytes"] == sum(f.stat().st_size for f in tiny_llama_dir.iterdir())
    assert len(version.validation["checksum"]) == 64


@pytest.mark.slow
def test_shape_mismatch_with_config_fails_validation_naming_the_tensor(
        tiny_llama_dir, tmp_path, django_capture_on_commit_callbacks):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    config["hidden_size"] = 32
    (broken / "config.json").write_text(json.dumps(config))

    with django_capture_on_commit_callbacks(execute=True):
        version = upload(zip_dir(broken, tmp_path / "broken.zip"))

    version.refresh_from_db()
    assert version.status == ModelVersion.Status.FAILED
    # The first mismatched tensor met (safetensors order) is named with its real shape.
    match = re.fullmatch(r"tensor '([\w.]+)' has shape (\(.*?\)) but config.json implies (\(.*?\))",
                         version.error)
    assert match, version.error
    name, shape, implied = match.groups()
    with safe_open(broken / "model.safetensors", framework="pt") as shard:
        assert shape == str(tuple(shard.get_slice(name).get_shape()))
    assert "64" in shape and "32" in implied and "64" not in implied


def assert_refused(archive: Path, media_root: Path, code: str) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        upload(archive)
    assert info.value.code == code
    assert not Model.objects.exists() and not ModelVersion.objects.exists()
    assert not any(p.name.startswith(".upload-") for p in (media_root / "models" / "tiny").iterdir())
    return info.value


def test_zip_member_climbing_out_with_dotdot_is_refused(tmp_path, media_root):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("config.json", "{}")
        zf.writestr("../evil", "pwned")

    error = assert_refused(archive, media_root, "unsafe_archive")

    assert "'../evil'" in error.message
    assert not (media_root / "models" / "tiny" / "evil").exists()


def test_tar_symlink_pointing_outside_is_refused(tmp_path, media_root):
    link = tarfile.TarInfo("model.safetensors")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    archive = tar_with(tmp_path / "link.tar.gz", [tarfile.TarInfo("config.json"), link])

    error = assert_refused(archive, media_root, "unsafe_archive")

    assert "link" in error.message and "/etc/passwd" in error.message


def test_tar_member_with_absolute_path_is_refused(tmp_path, media_root):
    target = tmp_path / "outside.txt"
    archive = tar_with(tmp_path / "abs.tar.gz", [tarfile.TarInfo(str(target))])

    error = assert_refused(archive, media_root, "unsafe_archive")

    assert "absolute path" in error.message
    assert not target.exists()


def test_checkpoint_with_a_pickle_file_is_refused(tiny_llama_dir, tmp_path, media_root):
    directory = tmp_path / "with_pickle"
    shutil.copytree(tiny_llama_dir, directory)
    (directory / "pytorch_model.bin").write_bytes(b"\x80\x04N.")  # pickle of None

    error = assert_refused(zip_dir(directory, tmp_path / "pickle.zip"), media_root, "pickle_checkpoint")

    assert "pytorch_model.bin" in error.message and "pickle" in error.message


def test_archive_unpacking_past_the_size_limit_is_refused(settings, tmp_path, media_root):
    settings.PAGODA_MAX_UPLOAD_BYTES = 100_000
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("config.json", "{}")
        zf.writestr("model.safetensors", bytes(1_000_000))  # compresses to about 1 kB
    assert archive.stat().st_size < settings.PAGODA_MAX_UPLOAD_BYTES

    error = assert_refused(archive, media_root, "upload_too_large")

    assert "PAGODA_MAX_UPLOAD_BYTES" in error.message


def test_model_name_that_is_not_a_slug_is_refused_before_touching_disk(tmp_path, media_root):
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF" + bytes(64))

    with pytest.raises(ValidationError), fake.open("rb") as handle:
        modelversion_upload(model_slug="../../escape", uploaded_file=File(handle, name=fake.name))

    assert not (media_root.parent / "escape").exists() and not Model.objects.exists()


def test_archive_with_too_many_members_is_refused(settings, tmp_path, media_root):
    settings.PAGODA_MAX_UPLOAD_MEMBERS = 3
    archive = tar_with(tmp_path / "many.tar.gz", [tarfile.TarInfo(f"f{i}.txt") for i in range(4)])

    assert_refused(archive, media_root, "too_many_members")


@pytest.mark.slow
def test_uploaded_gguf_is_stored_in_a_version_directory(tmp_path, media_root,
                                                        django_capture_on_commit_callbacks):
    fake = tmp_path / "not-really.gguf"
    fake.write_bytes(b"GGUF" + bytes(64))  # right magic, unreadable body: validation must fail

    with django_capture_on_commit_callbacks(execute=True):
        version = upload(fake)

    version.refresh_from_db()
    assert Path(version.path) == (media_root / "models" / "tiny" / "v1" / "not-really.gguf").resolve()
    assert version.format == ModelVersion.Format.GGUF
    assert version.status == ModelVersion.Status.FAILED and version.error
    assert Model.objects.get(slug="tiny").versions.count() == 1


@pytest.fixture
def staff_client(client):
    client.force_login(get_user_model().objects.create_user("admin", password="pw", is_staff=True))
    return client


def test_models_page_is_for_staff_only(client):
    for url in ("/console/models/", "/console/models.json"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=/console/")
    client.force_login(get_user_model().objects.create_user("bob", password="pw"))

    for url in ("/console/models/", "/console/models.json"):
        assert client.get(url).status_code == 403
    response = client.post("/console/models/", {"model_slug": "x"})
    assert response.status_code == 403 and not Model.objects.exists()


@pytest.mark.slow
def test_console_upload_form_shows_the_version_validated(staff_client, tiny_llama_dir, tmp_path,
                                                          django_capture_on_commit_callbacks):
    archive = zip_dir(tiny_llama_dir, tmp_path / "tiny.zip")
    with archive.open("rb") as handle, django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post("/console/models/", {"model_slug": "tiny", "file": handle,
                                                          "engine_settings": "{}"})
    assert response.status_code == 302

    [row] = staff_client.get("/console/models.json").json()["versions"]
    assert (row["model"], row["status"], row["progress"]) == ("tiny", "ready", 1.0)
    page = staff_client.get("/console/models/").content.decode()
    assert "Uploaded tiny v1" in page and "/console/models/versions/%d/activate/" % row["id"] in page


def test_console_refuses_a_bad_upload_with_its_reason(staff_client, tmp_path):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("../evil", "pwned")

    with archive.open("rb") as handle:
        response = staff_client.post("/console/models/", {"model_slug": "tiny", "file": handle}, follow=True)

    assert "Upload refused" in response.content.decode() and "../evil" in response.content.decode()
    assert not ModelVersion.objects.exists()


@pytest.mark.slow
def test_deleting_an_active_version_is_refused_until_deactivated(staff_client, tmp_path,
                                                                 django_capture_on_commit_callbacks):
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF" + bytes(64))
    with django_capture_on_commit_callbacks(execute=True):
        version = upload(fake)
    ModelVersion.objects.filter(pk=version.pk).update(status=ModelVersion.Status.ACTIVE)
    stored = Path(version.path)

    page = staff_client.post(f"/console/models/versions/{version.pk}/delete/", follow=True).content.decode()
    assert "Cannot delete tiny v1" in page and "deactivate it" in page
    assert ModelVersion.objects.filter(pk=version.pk).exists() and stored.is_file()

    staff_client.post(f"/console/models/versions/{version.pk}/deactivate/")
    staff_client.post(f"/console/models/versions/{version.pk}/delete/")
    assert not ModelVersion.objects.filter(pk=version.pk).exists()
    assert not stored.parent.exists()


@pytest.mark.parametrize("count, shown", [
    (0, "0"), (999, "999"), (1000, "1 K"), (6_365_504, "6.37 M"), (999_600, "1 M"), (125_000_000, "125 M"),
    (1_100_000_000, "1.1 B"), (70_553_706_496, "70.6 B")])
def test_parameter_counts_read_at_a_glance(count, shown):
    from webapp.console.model_views import human_count

    assert human_count(count) == shown


@pytest.mark.slow
def test_a_checkpoint_already_on_the_server_is_registered_in_place_and_validated(
        staff_client, tiny_llama_dir, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post("/console/models/", {"form": "register-path", "model_slug": "onsite",
                                                          "path": str(tiny_llama_dir)}, follow=True)

    version = ModelVersion.objects.get(model__slug="onsite")
    assert "Registered onsite v1" in response.content.decode()
    assert (version.status, version.format, version.path) == ("ready", "hf", str(Path(tiny_llama_dir).resolve()))
    assert version.validation["parameters"] == safetensors_numel(Path(tiny_llama_dir))
    staff_client.post(f"/console/models/versions/{version.pk}/delete/")
    assert not ModelVersion.objects.exists() and (Path(tiny_llama_dir) / "config.json").is_file()  # left in place


@pytest.mark.parametrize("path, reason", [
    ("relative/dir", "not an absolute path"),
    ("/no/such/checkpoint", "does not exist"),
    ("/etc", "neither a .gguf file nor a Hugging Face directory"),
])
def test_registering_a_bad_server_path_is_refused_naming_it(staff_client, path, reason):
    response = staff_client.post("/console/models/", {"form": "register-path", "model_slug": "onsite",
                                                      "path": path}, follow=True)
    page = response.content.decode()
    assert "Registration refused" in page and reason in page and path in page
    assert not ModelVersion.objects.exists()
