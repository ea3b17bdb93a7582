"""Per-version engine settings on the console's models page, dtype conversion on upload, and
embedded mode's worker following activation, deactivation and settings edits.

Uploads run the real validation child (``python -m engine.cli.validate``) eagerly; the embedded
worker is the real engine loop in a thread of this process, over the in-memory broker.
"""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from safetensors import safe_open

from webapp.registry.models import ModelVersion
from webapp.registry.services import (model_create, modelversion_activate, modelversion_create,
                                      modelversion_deactivate, modelversion_update_settings)

pytestmark = pytest.mark.django_db
MIB = 1 << 20
TINY = {"num_kv_blocks": 64, "max_model_len": 256, "max_num_seqs": 8}


@pytest.fixture
def staff_client(client):
    client.force_login(get_user_model().objects.create_user("admin", password="pw", is_staff=True))
    return client


def zip_dir(directory: Path, archive: Path) -> Path:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        for file in sorted(directory.iterdir()):
            zf.write(file, file.name)
    return archive


def version_of(tiny_llama_dir, settings: dict | None = None) -> ModelVersion:
    model = model_create(slug="tiny")
    return modelversion_create(model=model, path=tiny_llama_dir, engine_settings=settings or {})


FORM = {"max_model_len": "256", "dtype": "float32", "block_size": "32", "kv_cache_memory": "1.5",
        "max_num_seqs": "4", "max_num_batched_tokens": "512", "tensor_parallel_size": "2"}


def test_the_settings_form_saves_each_field_keeping_settings_it_does_not_show(staff_client, tiny_llama_dir):
    version = version_of(tiny_llama_dir, {"num_kv_blocks": 64, "enable_prefix_caching": False})

    page = staff_client.post(f"/console/models/versions/{version.pk}/settings/", FORM, follow=True)

    assert "tiny v1: engine settings saved." in page.content.decode()
    version.refresh_from_db()
    assert version.engine_settings == {
        "block_size": 32, "dtype": "float32", "enable_prefix_caching": False, "kv_cache_memory": int(1.5 * MIB),
        "max_model_len": 256, "max_num_batched_tokens": 512, "max_num_seqs": 4, "num_kv_blocks": 64,
        "tensor_parallel_size": 2}
    # The edit form shows them back (the KV budget in MiB); an emptied field returns to the default.
    page = staff_client.get("/console/models/").content.decode()
    assert f'id="settings-{version.pk}"' in page and 'name="kv_cache_memory" value="1.5"' in page
    staff_client.post(f"/console/models/versions/{version.pk}/settings/", {**FORM, "max_model_len": ""})
    version.refresh_from_db()
    assert "max_model_len" not in version.engine_settings and version.engine_settings["max_num_seqs"] == 4


@pytest.mark.parametrize("field, value, named", [
    ("max_model_len", "lots", "max_model_len"),
    ("kv_cache_memory", "-3", "kv_cache_memory"),
    ("block_size", "7", "block_size"),
    ("dtype", "float8", "dtype"),
    ("max_num_seqs", "0", "max_num_seqs"),
    ("tensor_parallel_size", "0", "tensor_parallel_size"),
])
def test_bad_settings_are_refused_naming_the_field(staff_client, tiny_llama_dir, field, value, named):
    version = version_of(tiny_llama_dir, {"num_kv_blocks": 64})

    page = staff_client.post(f"/console/models/versions/{version.pk}/settings/", {**FORM, field: value},
                             follow=True).content.decode()

    assert "Cannot save the engine settings of tiny v1" in page
    message = page.split("Cannot save the engine settings of tiny v1")[1].split("</p>")[0]
    assert named in message and value in message
    version.refresh_from_db()
    assert version.engine_settings == {"num_kv_blocks": 64}


def test_a_draft_model_that_is_not_there_is_refused_naming_the_setting(tiny_llama_dir, tmp_path):
    from django.core.exceptions import ValidationError

    version = version_of(tiny_llama_dir)
    with pytest.raises(ValidationError, match=r"speculative_model.*nothing\.gguf"):
        modelversion_update_settings(version=version, engine_settings={"speculative_model": str(tmp_path / "nothing.gguf")})
    updated = modelversion_update_settings(version=version, engine_settings={"speculative_model": str(tiny_llama_dir)})
    assert updated.engine_settings == {"speculative_model": str(tiny_llama_dir)}


def test_the_form_sets_a_draft_model_and_refuses_one_that_is_not_there(staff_client, tiny_llama_dir, tmp_path):
    version = version_of(tiny_llama_dir, {"num_kv_blocks": 64})
    url = f"/console/models/versions/{version.pk}/settings/"

    page = staff_client.post(url, {"speculative_model": str(tmp_path / "nothing.gguf")}, follow=True).content.decode()
    assert "Cannot save the engine settings of tiny v1" in page and "speculative_model" in page
    staff_client.post(url, {"speculative_model": str(tiny_llama_dir), "speculative_tokens": "4"})
    version.refresh_from_db()
    assert version.engine_settings == {"num_kv_blocks": 64, "speculative_model": str(tiny_llama_dir),
                                       "speculative_tokens": 4}
    page = staff_client.get("/console/models/").content.decode()
    assert f'name="speculative_model" value="{tiny_llama_dir}" inputmode="text"' in page


@pytest.mark.slow
def test_upload_with_conversion_stores_bfloat16_shards_of_about_half_the_size(
        staff_client, tiny_llama_dir, tmp_path, django_capture_on_commit_callbacks):
    archive = zip_dir(tiny_llama_dir, tmp_path / "tiny.zip")
    with archive.open("rb") as handle, django_capture_on_commit_callbacks(execute=True):
        page = staff_client.post("/console/models/", {
            "model_slug": "tiny", "file": handle, "engine_settings": '{"num_kv_blocks": 64, "max_model_len": 256}',
            "convert_dtype": "bfloat16", "max_num_seqs": "4", "max_model_len": "", "dtype": ""},
            follow=True).content.decode()

    assert "Uploaded tiny v1; converting to bfloat16, then validating." in page
    version = ModelVersion.objects.get()
    assert (version.status, version.error) == (ModelVersion.Status.READY, "")
    # A field left empty keeps what the JSON box says; a filled one adds to it.
    assert version.engine_settings == {"max_model_len": 256, "max_num_seqs": 4, "num_kv_blocks": 64}
    with safe_open(Path(version.path) / "model.safetensors", framework="pt") as shard:
        assert {str(shard.get_tensor(name).dtype) for name in shard.keys()} == {"torch.bfloat16"}
    original = sum(f.stat().st_size for f in tiny_llama_dir.iterdir())
    assert version.validation["dtype"] == "bfloat16"
    assert 0.4 < version.validation["size_bytes"] / original < 0.6
    assert version.validation["size_bytes"] == sum(f.stat().st_size for f in Path(version.path).iterdir())


def test_converting_a_gguf_upload_is_refused_with_the_reason(staff_client, tmp_path):
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF" + bytes(64))
    with fake.open("rb") as handle:
        page = staff_client.post("/console/models/", {"model_slug": "tiny", "file": handle,
                                                      "convert_dtype": "float16"}, follow=True).content.decode()

    assert "Upload refused" in page and "GGUF file keeps the quantisation" in page
    assert not ModelVersion.objects.exists()


# ------------------------------------------------------------------ embedded mode follows the registry
@pytest.fixture
def embedded(monkeypatch):
    """This process as the embedded-mode server; its workers are stopped afterwards."""
    from workers.embedded import stop_embedded_workers
    from workers.memory_transport import MemoryEngineClient, default_broker

    monkeypatch.setenv("PAGODA_EMBEDDED_WORKERS", "1")
    monkeypatch.delenv("REDIS_URL", raising=False)
    yield MemoryEngineClient(default_broker())
    stop_embedded_workers(drain_timeout=5)


def wait_for(predicate, what: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout} s"
        time.sleep(0.05)
    return result


@pytest.mark.slow
def test_embedded_worker_follows_activation_settings_edits_and_deactivation(
        embedded, tiny_llama_dir, django_capture_on_commit_callbacks):
    version = version_of(tiny_llama_dir, TINY)

    with django_capture_on_commit_callbacks(execute=True):
        modelversion_activate(version=version)
    [worker] = wait_for(lambda: embedded.live_workers("tiny"), "the worker announcing itself")
    assert (worker.version, worker.max_num_seqs) == ("1", 8)

    with django_capture_on_commit_callbacks(execute=True):
        modelversion_update_settings(version=version, engine_settings={**TINY, "max_num_seqs": 3})
    # The new settings load in a second worker, which then takes over alone.
    [worker] = wait_for(lambda: [w for w in embedded.live_workers("tiny") if w.max_num_seqs == 3]
                        if len(embedded.live_workers("tiny")) == 1 else None, "the worker swapping settings")
    assert worker.version == "1" and not worker.draining

    with django_capture_on_commit_callbacks(execute=True):
        modelversion_deactivate(version=version)
    wait_for(lambda: embedded.live_workers("tiny") == [], "the worker leaving", timeout=15)


@pytest.mark.slow
def test_without_the_embedded_flag_activation_starts_no_worker(tiny_llama_dir, monkeypatch,
                                                               django_capture_on_commit_callbacks):
    from workers.memory_transport import MemoryEngineClient, default_broker

    monkeypatch.delenv("PAGODA_EMBEDDED_WORKERS", raising=False)
    version = version_of(tiny_llama_dir, TINY)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        modelversion_activate(version=version)

    assert len(callbacks) == 1  # the hook ran, and did nothing
    time.sleep(0.5)
    assert MemoryEngineClient(default_broker()).live_workers("tiny") == []
