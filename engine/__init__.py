"""Pagoda's inference engine: paged KV cache, continuous batching, Llama-family models.

A pure library (PyTorch, Triton, transformers; no web framework)::

    from engine import LLM, SamplingParams
    llm = LLM("smollm2")
    print(llm.generate("Hello", SamplingParams(max_tokens=16))[0].text)
"""

from engine.config import EngineConfig
from engine.errors import (ContextLengthExceededError, EngineError, InvalidParameterError,
                           ModelLoadError, RequestNotFoundError)
from engine.llm import LLM
from engine.llm_engine import EngineStats, LLMEngine
from engine.outputs import CompletionOutput, FinishReason, RequestOutput, TokenLogprob
from engine.sampling_params import SamplingParams

__all__ = [
    "LLM", "LLMEngine", "EngineConfig", "EngineStats", "SamplingParams", "RequestOutput",
    "CompletionOutput", "TokenLogprob", "FinishReason", "EngineError", "InvalidParameterError",
    "ContextLengthExceededError", "ModelLoadError", "RequestNotFoundError",
]
