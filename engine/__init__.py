"""Pagoda's inference engine: paged KV cache, continuous batching, Llama-family models.

A pure library (PyTorch, Triton, transformers; no web framework)::

    from engine import LLM, SamplingParams
    llm = LLM("smollm2")
    print(llm.generate("Hello", SamplingParams(max_tokens=16))[0].text)

The names below are imported on first use, so ``import engine.config`` (the settings schema the
web process reads) does not load torch.
"""

import importlib

_EXPORTS = {
    "LLM": "engine.llm", "LLMEngine": "engine.llm_engine", "EngineStats": "engine.stats",
    "EngineConfig": "engine.config", "SamplingParams": "engine.sampling_params",
    "RequestOutput": "engine.outputs", "CompletionOutput": "engine.outputs",
    "TokenLogprob": "engine.outputs", "FinishReason": "engine.outputs",
    "EngineError": "engine.errors", "InvalidParameterError": "engine.errors",
    "ContextLengthExceededError": "engine.errors", "ModelLoadError": "engine.errors",
    "RequestNotFoundError": "engine.errors", "Tenant": "engine.tenancy",
    "LoRARequest": "engine.lora.request",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
