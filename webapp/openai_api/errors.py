"""Errors as OpenAI error objects: ``{"error": {"message", "type", "param", "code"}}`` + status.

Clients see stable codes and messages: a failure of ours never shows its exception's class, text
or traceback (those go to the log).
"""

from __future__ import annotations

import logging
import math

from django.http import JsonResponse
from rest_framework.exceptions import ValidationError

from workers.protocol import (CONTEXT_LENGTH_EXCEEDED, ERROR_CODES, INTERNAL_ERROR, INVALID_PARAMETER,
                              NO_WORKER, QUEUE_TIMEOUT, QUEUE_UNAVAILABLE, REQUEST_TIMEOUT, SERVER_OVERLOADED,
                              WORKER_LOST, ErrorInfo)

INVALID_REQUEST = "invalid_request_error"
logger = logging.getLogger(__name__)


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, *, type: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def to_dict(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JsonResponse:
        response = JsonResponse(self.to_dict(), status=self.status)
        for name, value in self.headers.items():
            response[name] = value
        return response


def invalid_api_key(message: str = "Incorrect API key provided.") -> OpenAIError:
    return OpenAIError(401, message, code="invalid_api_key")


def invalid_parameter(param: str | None, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="invalid_parameter")


def from_validation_error(exc: ValidationError) -> OpenAIError:
    """An InputSerializer's refusal: 400 invalid_parameter naming the first bad parameter."""
    param, message = first_error(exc.detail)
    return invalid_parameter(param, f"Invalid value for {param!r}: {message}" if param else message)


def first_error(detail, prefix: str = "") -> tuple[str | None, str]:
    """The first problem in a DRF error detail as (param path like "messages[1].content", message)."""
    if isinstance(detail, dict):
        key, value = next(iter(detail.items()))
        if key == "non_field_errors":
            return first_error(value, prefix)
        if isinstance(key, int):  # a list serializer's errors, by item index
            return first_error(value, f"{prefix}[{key}]")
        return first_error(value, f"{prefix}.{key}" if prefix else str(key))
    if isinstance(detail, list):
        for index, item in enumerate(detail):
            if item:  # many=True lists hold {} for the valid items
                return first_error(item, f"{prefix}[{index}]" if isinstance(item, (dict, list)) else prefix)
    return prefix or None, str(detail)


def internal_error(exc: BaseException) -> OpenAIError:
    """A failure of ours: logged with its traceback, the client only learns that it happened."""
    logger.exception("generation failed", exc_info=exc)
    return OpenAIError(500, "The server had an error while processing your request.", type="server_error",
                       code="internal_error")


def server_shutting_down() -> OpenAIError:
    return OpenAIError(503, "The server is shutting down; try again shortly.", type="server_error",
                       code="server_shutting_down")


def model_not_found(name: str) -> OpenAIError:
    """Also the answer for a model outside the key's scope: a key learns nothing of models it may not use."""
    return OpenAIError(404, f"The model {name!r} does not exist or is not being served.", param="model",
                       code="model_not_found")


def url_not_found(method: str, path: str) -> OpenAIError:
    """Any /v1/ path no view serves (OpenAI's own words)."""
    return OpenAIError(404, f"Invalid URL ({method} {path[:200]})", code="unknown_url")


def method_not_allowed(method: str, allowed: list[str]) -> OpenAIError:
    return OpenAIError(405, f"Method {method} is not allowed; use {' or '.join(allowed)}.",
                       code="method_not_allowed", headers={"Allow": ", ".join(allowed)})


def from_error_info(info: ErrorInfo, *, prompt_param: str) -> OpenAIError:
    """A worker-side failure as the client sees it; ``prompt_param`` is "messages" or "prompt".

    Only refusals meant for the client (a parameter, the context length, no worker) keep the
    worker's message; a failure of ours gets a stable message, the worker's text goes to the log.
    """
    if info.code == CONTEXT_LENGTH_EXCEEDED:
        return OpenAIError(400, info.message, param=prompt_param, code=CONTEXT_LENGTH_EXCEEDED)
    if info.code == INVALID_PARAMETER:
        param = prompt_param if info.param == "prompt" else info.param
        return invalid_parameter(param, info.message)
    if info.code == NO_WORKER:
        return OpenAIError(503, f"{info.message}; try again shortly", type="server_error", param="model",
                           code=NO_WORKER)
    if info.code in SHED_MESSAGES:
        return shed(info)
    logger.error("request failed on the worker side: %s: %s", info.code, info.message)
    if info.code == WORKER_LOST:
        return OpenAIError(503, "The worker serving this request stopped before it finished; try again.",
                           type="server_error", code=WORKER_LOST)
    code = info.code if info.code in ERROR_CODES else INTERNAL_ERROR
    return OpenAIError(500, "The server had an error while processing your request.", type="server_error",
                       code=code)


# Load shed by workers.transport.Admission (the queue bound, the deadlines) or a Redis outage: 503 with
# Retry-After, so that clients (the openai library among them) back off and retry.
SHED_MESSAGES = {
    SERVER_OVERLOADED: "The server is overloaded: too many requests are waiting for this model; try again shortly.",
    QUEUE_TIMEOUT: "The request waited too long for a worker to start it; try again shortly.",
    REQUEST_TIMEOUT: "The request did not finish within the server's time limit.",
    QUEUE_UNAVAILABLE: "The server cannot reach its request queue; try again shortly.",
}


def shed(info: ErrorInfo) -> OpenAIError:
    retry_after = max(1, math.ceil(info.retry_after or 1))
    return OpenAIError(503, SHED_MESSAGES[info.code], type="server_error", code=info.code,
                       headers={"Retry-After": str(retry_after)})


LIMITS_UNAVAILABLE_MESSAGE = "The server cannot reach the store of its rate limits; try again shortly."
LIMITS_UNAVAILABLE_RETRY_AFTER_S = 5  # as the queue's: the time a Redis restart takes


def limits_unavailable() -> OpenAIError:
    """The limit store (Redis, distributed mode) is unreachable: the request cannot be checked
    against its key's limits, so it is shed like a queue outage. The same code as the queue's on
    purpose: it is the same Redis (REDIS_URL) and the same remedy (retry after Retry-After); the
    message tells them apart."""
    return OpenAIError(503, LIMITS_UNAVAILABLE_MESSAGE, type="server_error", code=QUEUE_UNAVAILABLE,
                       headers={"Retry-After": str(LIMITS_UNAVAILABLE_RETRY_AFTER_S)})


def limit_exceeded(code: str, message: str, retry_after: int | None) -> OpenAIError:
    """429 for a key over one of its limits (webapp.keys.enforcement); Retry-After when waiting helps."""
    error_type = "insufficient_quota" if code == "budget_exhausted" else "rate_limit_exceeded"
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    return OpenAIError(429, message, type=error_type, code=code, headers=headers)
