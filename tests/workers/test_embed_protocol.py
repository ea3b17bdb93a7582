"""Embed requests in the workers' message contract: what a GenerateRequest of task "embed" must
carry, and the final chunk's vectors as base64 of their float32 bytes (OpenAI's base64 format)."""

import base64

import numpy as np
import pytest
import torch

from engine.outputs import RequestOutput
from workers.protocol import Chunk, GenerateRequest, ProtocolError
from workers.replies import InFlight


def embed_request(**fields) -> dict:
    return {"request_id": "embd-1", "model": "minilm", "prompt_token_ids": [], "params": {},
            "task": "embed", "inputs": [[101, 7, 102], [101, 102]], **fields}


def test_an_embed_request_round_trips_with_its_inputs():
    req = GenerateRequest.from_dict(embed_request())

    assert (req.task, req.inputs) == ("embed", [[101, 7, 102], [101, 102]])
    assert GenerateRequest.from_dict(req.to_dict()) == req
    assert GenerateRequest.from_dict({**embed_request(), "task": "generate", "inputs": None}).task == "generate"


@pytest.mark.parametrize("fields", [{"task": "classify"}, {"inputs": None}, {"inputs": []}, {"inputs": [[]] * 0},
                                    {"inputs": [["a"]]}, {"inputs": [[1, True]]}, {"inputs": [1, 2]}])
def test_a_malformed_embed_request_is_a_protocol_error(fields):
    with pytest.raises(ProtocolError):
        GenerateRequest.from_dict(embed_request(**fields))


def test_the_final_chunk_carries_each_vector_as_base64_float32_bytes():
    vectors = torch.tensor([[0.5, -1.25, 3.0], [1e-8, 2.0, -0.0]])
    inflight = InFlight(GenerateRequest.from_dict(embed_request()))
    inflight.add(RequestOutput("embd-1", "", [], True, "stop", 5, 0, 0, embeddings=vectors))

    chunk = Chunk.from_dict(inflight.take_chunk(0.0).to_dict())

    decoded = [np.frombuffer(base64.b64decode(e), dtype="<f4") for e in chunk.embeddings]
    assert np.array_equal(np.stack(decoded), vectors.numpy())
    assert (chunk.finished, chunk.num_prompt_tokens) == (True, 5)
