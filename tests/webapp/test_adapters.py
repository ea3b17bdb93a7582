"""LoRA adapters in the console and the API's model names: an upload is checked against the base's
active version by the real ``python -m engine.cli.validate_adapter`` (a misfit is refused naming the
module and the shapes), activated, listed by /v1/models, resolved from ``base:adapter`` or its own
name, and scoped on keys like a model; the engine request carries it to the base's workers."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.engine.lora.adapters import make_adapter
from webapp.keys.services import apikey_create
from webapp.openai_api.errors import OpenAIError
from webapp.openai_api.services import model_target_for_key
from webapp.registry.models import Adapter, Model, ModelVersion

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


@pytest.fixture(scope="module")
def adapter_zips(tmp_path_factory, tiny_llama_dir):
    """A zip of a PEFT adapter for tiny_llama_dir, and one made for a wider Llama."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("adapter_zips")
    fits = make_adapter(tiny_llama_dir, root / "fits", seed=1, r=4, lora_alpha=8,
                        target_modules=["q_proj", "v_proj"])
    wider = root / "wider_base"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=96, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2)).save_pretrained(wider)
    other = make_adapter(wider, root / "other", seed=2, r=4, lora_alpha=8, target_modules=["q_proj"])
    return {name: _zip(Path(folder), root / f"{name}.zip") for name, folder in (("fits", fits), ("other", other))}


def _zip(folder: Path, archive: Path) -> Path:
    with zipfile.ZipFile(archive, "w") as zf:
        for file in folder.iterdir():
            zf.write(file, f"adapter/{file.name}")  # one top folder: the upload flattens it
    return archive


@pytest.fixture
def staff_client(client, tiny_llama_dir):
    model = Model.objects.create(slug="tiny")
    ModelVersion.objects.create(model=model, number=1, path=str(tiny_llama_dir), format="hf",
                                status=ModelVersion.Status.ACTIVE, tokenizer_dir=str(tiny_llama_dir))
    client.force_login(get_user_model().objects.create_user("admin", password="pw", is_staff=True))
    return client


def post_adapter(client, archive: Path, name: str, base: str = "tiny"):
    upload = SimpleUploadedFile(archive.name, archive.read_bytes(), content_type="application/zip")
    return client.post("/console/models/adapters/", {"base": base, "name": name, "file": upload},
                       follow=True).content.decode()


def test_console_upload_checks_the_adapter_and_activates_it(staff_client, adapter_zips):
    page = post_adapter(staff_client, adapter_zips["fits"], "terse")
    assert "fits tiny and is served as" in page
    adapter = Adapter.objects.get(name="terse")
    assert (adapter.base.slug, adapter.rank, adapter.target_modules, adapter.is_active) == (
        "tiny", 4, ["q_proj", "v_proj"], True)
    assert (Path(adapter.path) / "adapter_model.safetensors").is_file()
    assert 'data-adapter="terse"' in staff_client.get("/console/models/").content.decode()


def test_an_adapter_for_another_base_is_refused_naming_module_and_shapes(staff_client, adapter_zips):
    page = post_adapter(staff_client, adapter_zips["other"], "stranger")
    assert "Adapter refused" in page
    assert ("model.layers.0.self_attn.q_proj: lora_A is [4, 96], the base&#x27;s q_proj takes [4, 64]"
            in page)
    assert not Adapter.objects.exists()
    assert "taken" in post_adapter(staff_client, adapter_zips["fits"], "tiny")  # a model's slug


def test_requests_name_an_adapter_and_keys_scope_it_like_a_model(staff_client, adapter_zips):
    post_adapter(staff_client, adapter_zips["fits"], "terse")
    adapter = Adapter.objects.get(name="terse")
    owner = get_user_model().objects.create_user("u")
    everything, _ = apikey_create(owner=owner, name="all")
    for name in ("terse", "tiny:terse"):
        version, found = model_target_for_key(api_key=everything, slug=name)
        assert (version.model.slug, found) == ("tiny", adapter)
    assert model_target_for_key(api_key=everything, slug="tiny")[1] is None
    base_only, _ = apikey_create(owner=owner, name="base", models=[adapter.base])
    only_adapter, raw = apikey_create(owner=owner, name="adapter")
    only_adapter.adapters.add(adapter)
    for key, slug, allowed in ((base_only, "terse", False), (base_only, "tiny", True),
                               (only_adapter, "tiny:terse", True), (only_adapter, "tiny", False)):
        try:
            model_target_for_key(api_key=key, slug=slug)
        except OpenAIError as exc:
            assert (allowed, exc.status, exc.code) == (False, 404, "model_not_found")
        else:
            assert allowed
    listed = staff_client.get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {raw}").json()["data"]
    assert [(m["id"], m.get("parent")) for m in listed] == [("terse", "tiny")]
