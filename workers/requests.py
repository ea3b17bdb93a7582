"""A GenerateRequest as the engine takes it, and an engine refusal as the client reads it.

The worker side of the message contract (workers/protocol.py): sampling parameters arrive as a
JSON object and become engine.SamplingParams (an unknown field is refused, naming it); a request's
``created_at`` (the client's wall clock) becomes engine time, so that latencies include queueing;
an exception while adding a request becomes the ErrorInfo its client receives.
"""

from __future__ import annotations

import dataclasses
import time

from engine.errors import ContextLengthExceededError, InvalidParameterError
from engine.sampling_params import SamplingParams
from workers.protocol import CONTEXT_LENGTH_EXCEEDED, INTERNAL_ERROR, INVALID_PARAMETER, ErrorInfo

MAX_QUEUE_CREDIT_S = 300.0  # queueing time counted into latencies (bounds clock skew)
FAILED_MESSAGE = "the worker failed while adding this request"  # what a client may read
_SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams) if f.init)


def sampling_params(params: object) -> SamplingParams:
    if not isinstance(params, dict):
        raise InvalidParameterError("params", "must be an object of sampling parameters")
    unknown = sorted(set(params) - _SAMPLING_FIELDS)
    if unknown:
        raise InvalidParameterError(unknown[0],
                                    f"unknown sampling parameter; known: {sorted(_SAMPLING_FIELDS)}")
    return SamplingParams(**params)


def error_info(exc: Exception) -> ErrorInfo:
    """A refusal meant for the client keeps its message; any other failure gets a stable one
    (the caller logs the exception)."""
    if isinstance(exc, ContextLengthExceededError):
        return ErrorInfo(CONTEXT_LENGTH_EXCEEDED, exc.message, exc.param)
    if isinstance(exc, InvalidParameterError):
        return ErrorInfo(INVALID_PARAMETER, exc.message, exc.param)
    return ErrorInfo(INTERNAL_ERROR, FAILED_MESSAGE)


def arrival_time(created_at: object) -> float:
    """created_at (wall clock, set by the client) as engine time, so latency includes queueing."""
    now = time.monotonic()
    if not isinstance(created_at, (int, float)) or isinstance(created_at, bool):
        return now
    return now - min(max(0.0, time.time() - created_at), MAX_QUEUE_CREDIT_S)
