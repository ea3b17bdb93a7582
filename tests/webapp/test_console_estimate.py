"""The console's models page shows the memory estimate for the engine settings being edited:
estimate.json answers with engine/memory/estimate.py's figures for the form's values over the saved
settings, and names a bad field."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from engine.memory.estimate import estimate_memory
from webapp.registry.services import model_create, modelversion_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client):
    client.force_login(get_user_model().objects.create_user("admin", password="pw", is_staff=True))
    return client


@pytest.fixture
def version(tiny_llama_dir):
    return modelversion_create(model=model_create(slug="tiny"), path=tiny_llama_dir,
                               engine_settings={"num_kv_blocks": 64, "max_model_len": 256})


def test_the_settings_form_carries_its_estimate_url(staff_client, version):
    page = staff_client.get("/console/models/").content.decode()
    assert f'data-url="/console/models/versions/{version.id}/estimate.json"' in page


def test_the_estimate_follows_the_values_being_edited(staff_client, version, tiny_llama_dir):
    url = f"/console/models/versions/{version.id}/estimate.json"
    saved = staff_client.get(url).json()
    edited = staff_client.get(url, {"quantization": "int8", "max_num_batched_tokens": "512", "dtype": "float32"}).json()

    assert saved["total_bytes"] == estimate_memory(str(tiny_llama_dir), {"num_kv_blocks": 64,
                                                                          "max_model_len": 256}).total_bytes
    expected = estimate_memory(str(tiny_llama_dir), {"num_kv_blocks": 64, "max_model_len": 256, "quantization": "int8",
                                                     "max_num_batched_tokens": 512, "dtype": "float32"})
    assert (edited["weights_bytes"], edited["activation_bytes"]) == (expected.weights_bytes, expected.activation_bytes)
    assert edited["layouts"]["int8"] == 14 and "MiB per rank" in edited["text"]  # 2 layers x 7 projections


def test_a_bad_value_is_named(staff_client, version):
    url = f"/console/models/versions/{version.id}/estimate.json"
    assert staff_client.get(url, {"max_num_seqs": "many"}).json() == {
        "ok": False, "error": "Max running requests (max_num_seqs) must be a whole number, got 'many'"}
    answer = staff_client.get(url, {"max_num_seqs": "0"})
    assert answer.status_code == 400 and answer.json()["error"].startswith("max_num_seqs:")


def test_the_estimate_is_for_staff_only(client, version):
    assert client.get(f"/console/models/versions/{version.id}/estimate.json").status_code in (302, 403)
