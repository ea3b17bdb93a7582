"""A LoRA adapter through a real server with the official openai client: uploaded with
``manage.py register_adapter`` for the active model "tiny", listed by /v1/models, and answered by
name (``tiny:terse`` and ``terse``) token for token as the engine answers it, which equals peft's
merged model (fp32); the base keeps its own answer in the same server."""

from __future__ import annotations

import json
import sqlite3
import zipfile

import pytest
import torch

from engine import LLM, LoRARequest, SamplingParams
from tests.e2e.sites import TINY_SETTINGS, make_site
from tests.engine.lora.adapters import make_adapter, merged_reference
from tests.engine.test_hf_parity import hf_greedy

pytestmark = pytest.mark.e2e
SETTINGS = {**TINY_SETTINGS, "dtype": "float32", "quantization": "none"}
PROMPT = [1 + (j * 11) % 4000 for j in range(20)]
NUM_TOKENS = 16


@pytest.fixture(scope="module")
def lora_site(tmp_path_factory, tiny_llama_dir):
    root = tmp_path_factory.mktemp("lora_site")
    adapter_dir = make_adapter(tiny_llama_dir, root / "terse", seed=3, r=8, lora_alpha=16,
                               target_modules=["q_proj", "v_proj", "o_proj", "down_proj"])
    archive = root / "terse.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for file in (root / "terse").iterdir():
            zf.write(file, file.name)
    site = make_site(root / "site")
    site.manage("register_model", "tiny", str(tiny_llama_dir), "--engine-settings", json.dumps(SETTINGS))
    site.manage("register_adapter", "tiny", "terse", str(archive))
    site.key = site.create_key("all models")
    try:
        site.start_embedded("the embedded worker for tiny coming up")
        yield site, adapter_dir
    finally:
        site.stop()


def test_openai_client_names_the_adapter(lora_site, tiny_llama_dir):
    from openai import OpenAI

    site, adapter_dir = lora_site
    client = OpenAI(base_url=f"{site.url}/v1", api_key=site.key, max_retries=0)
    assert sorted(m.id for m in client.models.list()) == ["terse", "tiny"]
    assert client.models.retrieve("tiny:terse").id == "terse"

    reference = hf_greedy(merged_reference(tiny_llama_dir, adapter_dir), PROMPT, NUM_TOKENS, [-1])
    engine = LLM(str(tiny_llama_dir), **SETTINGS)
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
    ours = engine.generate([PROMPT], params, adapters=LoRARequest("terse", adapter_dir))[0]
    base = engine.generate([PROMPT], params)[0]
    assert ours.token_ids == reference != base.token_ids

    for name, expected in (("tiny:terse", ours), ("terse", ours), ("tiny", base)):
        response = client.completions.create(model=name, prompt=PROMPT, temperature=0,
                                             max_tokens=NUM_TOKENS, extra_body={"ignore_eos": True})
        assert response.choices[0].text == expected.text, name
        assert response.usage.completion_tokens == NUM_TOKENS
    with sqlite3.connect(site.db_path) as db:  # usage says what each request ran as
        names = sorted(row[0] for row in db.execute("SELECT model_name FROM usage_usagerecord"))
    assert names == ["tiny", "tiny:terse", "tiny:terse"]
