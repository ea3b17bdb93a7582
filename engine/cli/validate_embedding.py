"""Validation of an embedding model (a sentence-transformers checkpoint of an encoder family, or a
decoder family's with a sentence-transformers pooling config, e.g. last-token pooling):
the steps of engine/cli/validate.py for the pooling path, reported the same way.

What it states: architecture, dimensions, pooling, normalisation and maximum sequence length
(``"embedding"`` in the final report), besides the parameters, size and checksum every upload gets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from engine.errors import EngineError

Report = Callable[[str, float], None]
SAMPLE_INPUTS = ("Pagoda validates this embedding model.", "A second, longer sentence to pool.")


def validate_embedding(path: Path, report: Report) -> dict:
    """Config, tokenizer, every tensor into the model, then a forward of two inputs whose vectors
    must have the stated dimensions, be finite, and have unit norm when the model normalises;
    the report's fields besides the size and checksum (validate.py adds those)."""
    from engine.config import EngineConfig
    from engine.embedding_engine import EmbeddingEngine, embedding_weights, load_embedding_config

    report("reading config", 0.0)
    config = load_embedding_config(path)
    report("loading weights", 0.1)
    num_parameters = sum(t.numel() for _name, t in embedding_weights(path, config))
    engine = EmbeddingEngine(EngineConfig.from_settings(str(path), {"device": "cpu", "dtype": "float32"}))
    report("running a forward pass", 0.7)
    vectors = engine.embed(list(SAMPLE_INPUTS))
    if tuple(vectors.shape) != (len(SAMPLE_INPUTS), config.dimensions):
        raise EngineError(f"the forward pass gave vectors of shape {tuple(vectors.shape)}, expected "
                          f"{(len(SAMPLE_INPUTS), config.dimensions)}")
    if not bool(vectors.isfinite().all()):
        raise EngineError("the forward pass gave non-finite values")
    norms = vectors.norm(dim=-1).tolist()
    if config.normalize and any(not math.isclose(n, 1.0, rel_tol=1e-3) for n in norms):
        raise EngineError(f"the Normalize module should give unit vectors; norms {norms}")
    return {"parameters": num_parameters, "context_length": config.max_seq_length,
            "embedding": config.describe()}
