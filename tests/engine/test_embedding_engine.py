"""The pooling path (engine/embedding_engine.py, engine/models/bert.py) against sentence-transformers
on tiny random BERT checkpoints that sentence-transformers itself saved, one per pooling mode."""

import pytest
import torch
from sentence_transformers import SentenceTransformer  # imported at collection: seconds under load

from engine.config import EngineConfig
from engine.embedding_engine import EmbeddingEngine
from engine.errors import ContextLengthExceededError, InvalidParameterError, ModelLoadError
from tests.engine.tiny_bert import MAX_SEQ_LENGTH, save_tiny_sentence_bert

SENTENCES = ["the cat sat on the mat", "a dog", "pagoda serves embedding models of the river and the sea",
             "river", "x7 is in the vector, 42!", "the sea flows to a river"]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """pooling, normalize -> the checkpoint's directory (built once per variant)."""
    built = {}

    def get(pooling="mean", normalize=True):
        if (pooling, normalize) not in built:
            directory = tmp_path_factory.mktemp("bert") / f"{pooling}-{normalize}"
            built[pooling, normalize] = save_tiny_sentence_bert(directory, pooling=pooling,
                                                                normalize=normalize)
        return built[pooling, normalize]

    return get


def engine_for(path, **settings) -> EmbeddingEngine:
    return EmbeddingEngine(EngineConfig.from_settings(str(path), {"device": "cpu", "dtype": "float32",
                                                                  **settings}))


@pytest.mark.parametrize("pooling,normalize", [("mean", True), ("cls", False), ("lasttoken", True),
                                               ("max", False)])
def test_tiny_bert_embeddings_equal_sentence_transformers(tiny_bert, pooling, normalize):
    path = tiny_bert(pooling, normalize)
    expected = SentenceTransformer(str(path), device="cpu").encode(SENTENCES, convert_to_tensor=True)

    got = engine_for(path).embed(SENTENCES)  # mixed lengths in one packed batch

    assert got.shape == expected.shape == (len(SENTENCES), 32)
    torch.testing.assert_close(got, expected.float(), atol=2e-5, rtol=1e-4)
    if normalize:
        torch.testing.assert_close(got.norm(dim=-1), torch.ones(len(SENTENCES)))


def test_an_inputs_embedding_does_not_depend_on_its_neighbours(tiny_bert):
    engine = engine_for(tiny_bert())
    alone = torch.cat([engine.embed([s]) for s in SENTENCES])

    together = engine.embed(SENTENCES)

    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_a_step_batches_several_requests_within_the_token_budget(tiny_bert):
    engine = engine_for(tiny_bert(), max_num_batched_tokens=32, max_num_seqs=8)
    for i, sentence in enumerate(SENTENCES):
        engine.add_request(f"r{i}", [sentence, "a dog"])

    finished_per_step = []
    while engine.has_unfinished_requests():
        finished_per_step.append([out.request_id for out in engine.step()])

    assert sorted(r for step in finished_per_step for r in step) == [f"r{i}" for i in range(len(SENTENCES))]
    assert any(len(step) >= 2 for step in finished_per_step)  # several requests in one step
    assert len(finished_per_step) > 1  # 12 inputs (70 tokens) never fit 32 tokens at once


def test_token_id_inputs_are_embedded_as_given(tiny_bert):
    engine = engine_for(tiny_bert())
    ids = engine.tokenizer.encode(SENTENCES[0])

    torch.testing.assert_close(engine.embed([ids]), engine.embed([SENTENCES[0]]))


def test_an_input_longer_than_the_model_allows_is_refused_naming_its_index(tiny_bert):
    engine = engine_for(tiny_bert())
    assert engine.max_model_len == MAX_SEQ_LENGTH  # the checkpoint's sentence-transformers setting

    with pytest.raises(ContextLengthExceededError, match=r"input\[1\] has 49 tokens") as info:
        engine.add_request("long", ["a dog", [5] * (MAX_SEQ_LENGTH + 1)])

    assert info.value.param == "input"
    assert not engine.has_unfinished_requests()


def test_empty_and_out_of_vocabulary_inputs_are_refused(tiny_bert):
    engine = engine_for(tiny_bert())

    with pytest.raises(InvalidParameterError, match=r"input\[0\] is empty"):
        engine.add_request("empty", [[]])
    with pytest.raises(InvalidParameterError, match="token ids must be in"):
        engine.add_request("oov", [[10**6]])


def test_an_aborted_request_finishes_with_abort_and_no_vectors(tiny_bert):
    engine = engine_for(tiny_bert())
    engine.add_request("gone", SENTENCES)

    engine.abort_request("gone")
    (out,) = engine.step()

    assert (out.request_id, out.finish_reason, out.embeddings) == ("gone", "abort", None)
    assert not engine.has_unfinished_requests()


def test_the_generation_engine_refuses_an_embedding_checkpoint(tiny_bert):
    from engine.models.loader import load_model_config

    with pytest.raises(ModelLoadError, match="is an embedding model"):
        load_model_config(tiny_bert())


def test_a_pooling_mode_we_do_not_run_is_refused_naming_it(tiny_bert, tmp_path):
    import shutil

    path = shutil.copytree(tiny_bert(), tmp_path / "weighted")
    (path / "1_Pooling" / "config.json").write_text('{"pooling_mode": "weightedmean"}')

    with pytest.raises(ModelLoadError, match="pooling mode 'weightedmean' is not supported"):
        engine_for(path)


def test_a_dense_module_after_pooling_is_refused_naming_it(tiny_bert, tmp_path):
    import json
    import shutil

    path = shutil.copytree(tiny_bert(), tmp_path / "dense")
    modules = json.loads((path / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (path / "modules.json").write_text(json.dumps(modules))

    with pytest.raises(ModelLoadError, match="'sentence_transformers.models.Dense' is not supported"):
        engine_for(path)
