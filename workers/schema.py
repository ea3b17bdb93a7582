"""The engine's torch-free schemas, as the web process reads them: engine settings, sampling
limits, bundled models, the memory estimate, where a model name or path points, and the errors
they raise.

The webapp imports these from here, never from ``engine`` itself, so the web side's one door
into the engine stays ``workers/``; every name comes from a module that loads no torch
(tests/test_architecture.py checks it).
"""

from engine.bundled import BUNDLED_MODELS, DEFAULT_BUNDLED_MODEL, bundled_model_path
from engine.config import CONVERT_DTYPES, SETTINGS_BY_NAME, check_settings
from engine.errors import InvalidParameterError, ModelLoadError
from engine.memory.estimate import estimate_memory
from engine.models.registry import resolve_model_path
from engine.sampling_params import MAX_INT32, SAMPLING_LIMITS, Limit
from engine.structured.spec import structured_grammar

__all__ = ["BUNDLED_MODELS", "CONVERT_DTYPES", "DEFAULT_BUNDLED_MODEL", "InvalidParameterError", "Limit",
           "MAX_INT32", "ModelLoadError", "SAMPLING_LIMITS", "SETTINGS_BY_NAME", "bundled_model_path",
           "check_settings", "estimate_memory", "resolve_model_path", "structured_grammar"]
