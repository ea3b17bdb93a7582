"""A decoder embedding model (a tiny random Qwen3 with sentence-transformers' last-token pooling and
Normalize config, Qwen3-Embedding style) served at /v1/embeddings through a real Daphne with its
embedded workers, driven by the official openai client, beside the same decoder without the pooling
config ("qwen3-plain"), which stays a generation model."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from tests.e2e.sites import make_site
from tests.engine.tiny_decoder_embedding import save_tiny_decoder, save_tiny_decoder_embedding

pytestmark = pytest.mark.e2e

SENTENCES = ["the cat sat on the mat", "a", "pagoda serves embedding models of the river and the sea, "
             "and decoders answer with their last token's state after the final norm",
             "river and sea", "x7 is in the vector, 42!"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoder_embeddings")
    return save_tiny_decoder_embedding(root / "embed"), save_tiny_decoder(root / "plain")


@pytest.fixture(scope="module")
def site(tmp_path_factory, checkpoints):
    embed, plain = checkpoints
    site = make_site(tmp_path_factory.mktemp("decoder_embeddings_site"))
    # float32, as the parity bar is set for it (the CPU's default bf16 gave cosine 0.99997 here)
    site.manage("register_model", "qwen3-embed", str(embed), "--engine-settings", '{"dtype": "float32"}')
    site.manage("register_model", "qwen3-plain", str(plain), "--engine-settings",
                '{"num_kv_blocks": 64, "max_model_len": 128, "max_num_seqs": 8}')
    site.keys = {"all": site.create_key("all models")}
    try:
        site.start_embedded("embedded workers for qwen3-embed and qwen3-plain coming up")
        yield site
    finally:
        site.stop()


def client(site) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{site.url}/v1", api_key=site.keys["all"], max_retries=0)


def test_last_token_embeddings_match_sentence_transformers(site, checkpoints):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(checkpoints[0]), device="cpu")
    expected = reference.encode(SENTENCES, convert_to_tensor=True).float()

    response = client(site).embeddings.create(model="qwen3-embed", input=SENTENCES, encoding_format="float")
    as_base64 = client(site).embeddings.create(model="qwen3-embed", input=SENTENCES)  # the client's default

    got = torch.tensor([item.embedding for item in response.data])
    assert got.shape == (len(SENTENCES), 64) and response.model == "qwen3-embed"
    assert torch.nn.functional.cosine_similarity(got, expected).min().item() >= 0.99999
    assert [list(item.embedding) for item in as_base64.data] == [item.embedding for item in response.data]
    num_tokens = sum(len(reference.tokenizer(s)["input_ids"]) for s in SENTENCES)
    assert response.usage.prompt_tokens == response.usage.total_tokens == num_tokens


def test_the_same_decoder_without_a_pooling_config_is_a_generation_model_and_a_400(site):
    response = httpx.post(f"{site.url}/v1/embeddings", json={"model": "qwen3-plain", "input": "hello"},
                          timeout=60, headers={"Authorization": f"Bearer {site.keys['all']}"})

    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("model", "invalid_parameter")
    assert "'qwen3-plain' is a generation model" in error["message"]
    completion = client(site).completions.create(model="qwen3-plain", prompt="the cat", max_tokens=4)
    assert 1 <= completion.usage.completion_tokens <= 4  # it generates (a random model may end at once)


def test_completions_to_the_decoder_embedding_model_is_a_400_naming_it(site):
    with pytest.raises(openai.BadRequestError) as info:
        client(site).completions.create(model="qwen3-embed", prompt="the cat", max_tokens=4)
    assert info.value.body["param"] == "model" and "'qwen3-embed' is an embedding model" in info.value.body["message"]
