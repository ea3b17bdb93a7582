"""A decoder checkpoint with a sentence-transformers pooling config (Qwen3-Embedding style) as an
embedding model (engine/models/decoder_encoder.py): its vectors against sentence-transformers' and
transformers' own on tiny random checkpoints in float32, several inputs of different lengths
batched together; a plain decoder stays a generation model."""

import json
import shutil

import pytest
import torch
import torch.nn.functional as F

from sentence_transformers import SentenceTransformer  # imported at collection: seconds under load
from transformers import AutoModel

from engine.config import EngineConfig
from engine.embedding_engine import EmbeddingEngine
from engine.errors import ModelLoadError
from engine.models.registry import is_embedding_checkpoint
from tests.engine.tiny_decoder_embedding import save_tiny_decoder, save_tiny_decoder_embedding, write_pooling_config

# From 1 to ~30 tokens: the last-token states come from differently long causal contexts.
SENTENCES = ["the cat sat on the mat", "a", "pagoda serves embedding models of the river and the sea, "
             "and decoders answer with their last token's state after the final norm",
             "river and sea", "x7 is in the vector, 42!", "the sea flows to a river and on"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """family, pooling, normalize -> the checkpoint's directory (built once per variant)."""
    built = {}

    def get(family="qwen3", pooling="lasttoken", normalize=True):
        key = family, pooling, normalize
        if key not in built:
            built[key] = save_tiny_decoder_embedding(tmp_path_factory.mktemp("dec") / "-".join(map(str, key)),
                                                     family=family, pooling=pooling, normalize=normalize)
        return built[key]

    get()  # the default one now, in the shared setup (not in the first test's own time)
    return get


def engine_for(path, **settings) -> EmbeddingEngine:
    return EmbeddingEngine(EngineConfig.from_settings(str(path), {"device": "cpu", "dtype": "float32",
                                                                  **settings}))


@pytest.mark.parametrize("family,pooling,normalize", [("qwen3", "lasttoken", True), ("llama", "lasttoken", False),
                                                      ("qwen3", "mean", True)])
def test_decoder_embeddings_equal_sentence_transformers(checkpoint, family, pooling, normalize):
    path = checkpoint(family, pooling, normalize)
    assert is_embedding_checkpoint(path)
    expected = SentenceTransformer(str(path), device="cpu").encode(SENTENCES, convert_to_tensor=True).float()
    engine = engine_for(path)
    assert engine.model_config.describe() == {"architecture": family, "dimensions": 64, "pooling": pooling,
                                              "normalize": normalize, "max_seq_length": 96}
    assert len({len(ids) for ids in engine.encode_inputs(SENTENCES)}) >= 5

    got = engine.embed(SENTENCES)  # every input in one packed step

    assert got.shape == expected.shape == (len(SENTENCES), 64)
    cosine = F.cosine_similarity(got, expected)
    assert cosine.min().item() >= 0.99999, cosine
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "mistral", "phi3", "gemma3"])
def test_last_token_vectors_are_transformers_last_hidden_state_normalised(checkpoint, family):
    path = checkpoint(family)
    engine = engine_for(path)
    model = AutoModel.from_pretrained(str(path)).eval()
    expected = []
    with torch.no_grad():
        for ids in engine.encode_inputs(SENTENCES):  # one at a time: no padding in the reference
            expected.append(F.normalize(model(torch.tensor([ids])).last_hidden_state[0, -1], dim=-1))

    got = engine.embed(SENTENCES)

    assert F.cosine_similarity(got, torch.stack(expected)).min().item() >= 0.99999
    alone = torch.cat([engine.embed([s]) for s in SENTENCES])  # neighbours change nothing
    torch.testing.assert_close(got, alone, atol=1e-5, rtol=1e-5)


def test_a_checkpoint_saved_from_the_bare_model_loads_too(checkpoint, tmp_path):
    """Qwen3-Embedding's tensors are the bare Qwen3Model's (``layers.0...``, no ``model.``, no head)."""
    full = checkpoint()
    bare = tmp_path / "bare"
    AutoModel.from_pretrained(str(full)).save_pretrained(bare)
    config = json.loads((bare / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen3ForCausalLM"]}))
    for item in full.iterdir():
        if not (bare / item.name).exists():
            (shutil.copytree if item.is_dir() else shutil.copy)(item, bare / item.name)

    torch.testing.assert_close(engine_for(bare).embed(SENTENCES), engine_for(full).embed(SENTENCES))


def test_a_plain_decoder_stays_a_generation_model(tmp_path):
    path = save_tiny_decoder(tmp_path / "plain")
    assert not is_embedding_checkpoint(path)
    with pytest.raises(ModelLoadError, match="qwen3 generation model, not an embedding model.*modules.json"):
        engine_for(path)


def test_cls_pooling_of_a_decoder_is_refused(tmp_path):
    path = save_tiny_decoder(tmp_path / "cls")
    write_pooling_config(path, pooling="cls")
    assert is_embedding_checkpoint(path)
    with pytest.raises(ModelLoadError, match="pooling mode 'cls' is not supported for a decoder"):
        engine_for(path)


def test_validation_states_a_decoder_embedding_model(checkpoint):
    from engine.cli.validate import validate

    steps = []
    final = validate(checkpoint(), lambda step, progress: steps.append(step))

    assert final["ok"] and final["embedding"] == {"architecture": "qwen3", "dimensions": 64,
                                                  "pooling": "lasttoken", "normalize": True,
                                                  "max_seq_length": 96}
    assert final["context_length"] == 96 and final["parameters"] > 0
    assert "running a forward pass" in steps


def test_the_exported_tokenizer_and_the_worker_route_it_as_an_embedding_model(checkpoint, tmp_path):
    from engine.cli.tokenizer_export import export_tokenizer
    from workers.embedding_worker import EmbeddingWorker, worker_class
    from workers.engine_worker import EngineWorker

    meta = json.loads((export_tokenizer(str(checkpoint()), tmp_path / "tok") / "tokenizer_config.json").read_text())
    assert meta["embedding"]["pooling"] == "lasttoken" and meta["chat_template"] is None
    assert worker_class(str(checkpoint())) is EmbeddingWorker
    plain = save_tiny_decoder(tmp_path / "plain")
    assert worker_class(str(plain)) is EngineWorker
    assert "embedding" not in json.loads((export_tokenizer(str(plain), tmp_path / "plain-tok")
                                          / "tokenizer_config.json").read_text())
