"""kv_cache_dtype through the console and to the worker: the version's settings form edits it,
its memory estimate counts the 8-bit pool's tokens, a bad value is refused naming it, and a
worker started with the saved settings builds its engine with it (as its heartbeat reports)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from webapp.registry.models import ModelVersion
from webapp.registry.services import model_create, modelversion_create
from workers import embedded

pytestmark = pytest.mark.django_db
MIB = 1 << 20
FORM = {"kv_cache_memory": "1", "max_num_seqs": "64", "max_model_len": "256", "dtype": "bfloat16"}


@pytest.fixture
def staff_client(client):
    client.force_login(get_user_model().objects.create_user("admin", password="pw", is_staff=True))
    return client


def test_the_settings_form_saves_kv_cache_dtype_and_the_estimate_counts_its_tokens(staff_client, tiny_llama_dir):
    version = modelversion_create(model=model_create(slug="tiny"), path=tiny_llama_dir, engine_settings={})
    url = f"/console/models/versions/{version.pk}"

    tokens = {kv: staff_client.get(f"{url}/estimate.json", {**FORM, "kv_cache_dtype": kv}).json()["kv_tokens"]
              for kv in ("auto", "int8")}
    staff_client.post(f"{url}/settings/", {**FORM, "kv_cache_dtype": "int8"})

    version.refresh_from_db()
    assert version.engine_settings["kv_cache_dtype"] == "int8"
    assert 'name="kv_cache_dtype"' in staff_client.get("/console/models/").content.decode()
    # head_dim 16 codes + a 4-byte scale against 16 bf16 values: 32 / 20 = 1.6x the tokens
    assert tokens["int8"] / tokens["auto"] == pytest.approx(1.6, rel=0.01)


def test_a_bad_kv_cache_dtype_is_refused_naming_it(staff_client, tiny_llama_dir):
    version = modelversion_create(model=model_create(slug="tiny"), path=tiny_llama_dir, engine_settings={})

    page = staff_client.post(f"/console/models/versions/{version.pk}/settings/",
                             {**FORM, "kv_cache_dtype": "int4"}, follow=True).content.decode()

    assert "Cannot save the engine settings of tiny v1" in page and "kv_cache_dtype" in page
    assert ModelVersion.objects.get().engine_settings == {}


@pytest.mark.slow
def test_a_worker_started_with_the_saved_setting_runs_its_engine_with_it(staff_client, tiny_llama_dir):
    settings = {"num_kv_blocks": 64, "max_model_len": 256, "max_num_seqs": 4, "kv_cache_dtype": "int8"}
    embedded.start_embedded_worker("tiny8", "1", str(tiny_llama_dir), settings)
    try:
        assert embedded.wait_for_embedded_worker("tiny8", timeout=60)
        row = next(w for w in staff_client.get("/console/workers.json").json()["workers"]
                   if w["model"] == "tiny8")
        assert row["engine_settings"]["kv_cache_dtype"] == "int8"
    finally:
        embedded.stop_embedded_workers(drain_timeout=5)
