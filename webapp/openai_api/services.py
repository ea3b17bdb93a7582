"""Turning an API call into an engine request, and accounting for it when it ends.

Everything here is synchronous (ORM); the async views call it through ``sync_to_async``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from webapp.keys.enforcement import LimitExceeded, apikey_admit, apikey_release
from webapp.keys.models import ApiKey
from webapp.keys.selectors import apikey_allows_model, apikey_get_usable
from webapp.keys.services import apikey_mark_used
from webapp.monitoring.metrics import observe_api_request
from webapp.openai_api import errors
from webapp.openai_api.serializers import (MAX_USER_LENGTH, ChatCompletionInputSerializer, CompletionInputSerializer,
                                          first_error)
from webapp.registry.models import Model, ModelVersion
from webapp.registry.selectors import modelversion_get_active, modelversion_served
from webapp.registry.tokenizers import ChatTemplateError, ModelTokenizer, load_tokenizer
from webapp.usage.models import UsageRecord
from webapp.usage.services import usage_record_create
from workers.protocol import Chunk, ErrorInfo, GenerateRequest

CHAT = UsageRecord.Endpoint.CHAT_COMPLETIONS
COMPLETIONS = UsageRecord.Endpoint.COMPLETIONS
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# Request field -> SamplingParams keyword (same name unless mapped), passed on when not null.
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                   "frequency_penalty", "seed", "stop", "ignore_eos")


def new_request_id(endpoint: str) -> str:
    return ("chatcmpl-" if endpoint == CHAT else "cmpl-") + uuid.uuid4().hex


@dataclass
class Generation:
    """An accepted request: who asked, for which model version, and what the engine gets."""

    request_id: str
    endpoint: str
    api_key: ApiKey
    model: Model
    version: ModelVersion
    tokenizer: ModelTokenizer
    prompt_token_ids: list[int]
    params: dict  # SamplingParams keyword arguments
    priority: int
    stream: bool
    include_usage: bool
    wants_logprobs: bool
    started: float  # time.monotonic() when the request arrived
    end_user: str = ""  # the request's ``user``, for the usage record only
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def prompt_param(self) -> str:
        return "messages" if self.endpoint == CHAT else "prompt"

    def engine_request(self) -> GenerateRequest:
        return GenerateRequest(request_id=self.request_id, model=self.model.slug,
                               prompt_token_ids=self.prompt_token_ids, params=self.params, priority=self.priority)


@dataclass
class Outcome:
    """What the chunks of one request added up to."""

    text: str = ""
    logprobs: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    time_to_first_token: float | None = None
    error: ErrorInfo | None = None
    finished: bool = False
    served_version: str | None = None  # the answering worker's version label

    def add(self, chunk: Chunk) -> None:
        self.served_version = chunk.version or self.served_version
        self.text += chunk.text
        self.logprobs.extend(chunk.logprobs or [])
        self.finished = chunk.finished
        self.error = chunk.error
        if chunk.error is None:
            self.num_prompt_tokens = chunk.num_prompt_tokens
            self.num_output_tokens = chunk.num_output_tokens
            self.num_cached_tokens = chunk.num_cached_tokens
            self.time_to_first_token = chunk.time_to_first_token
        if chunk.finished:
            self.finish_reason = chunk.finish_reason


def api_key_from_header(authorization: str | None) -> ApiKey:
    scheme, _, raw_key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not raw_key.strip():
        raise errors.invalid_api_key("You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.")
    api_key = apikey_get_usable(raw_key=raw_key.strip())
    if api_key is None:
        raise errors.invalid_api_key("Incorrect, revoked or expired API key provided.")
    return api_key


def generation_admit(*, api_key: ApiKey, request_id: str) -> None:
    """The key's limits let this request in (it then holds a concurrency slot until released)."""
    try:
        apikey_admit(api_key=api_key, request_id=request_id)
    except LimitExceeded as exc:
        raise errors.limit_exceeded(exc.code, exc.message, exc.retry_after) from exc


def _validated(serializer_class, data) -> dict:
    if not isinstance(data, dict):
        raise errors.invalid_parameter(None, "The request body must be a JSON object.")
    serializer = serializer_class(data=data)
    if not serializer.is_valid():
        param, message = first_error(serializer.errors)
        raise errors.invalid_parameter(param, f"Invalid value for {param!r}: {message}" if param else message)
    return serializer.validated_data


def _sampling_params(data: dict, max_tokens: int | None, logprobs: int | None) -> dict:
    params = {name: data[name] for name in SAMPLING_FIELDS if data.get(name) is not None}
    params["max_tokens"] = max_tokens
    if logprobs is not None:
        params["logprobs"] = logprobs
    return params


def _template_messages(messages: list[dict]) -> list[dict]:
    rendered = []
    for message in messages:
        role = "system" if message["role"] == "developer" else message["role"]
        entry = {"role": role, "content": message.get("content") or ""}
        if message.get("name"):
            entry["name"] = message["name"]
        rendered.append(entry)
    return rendered


def generation_prepare(*, request_id: str, endpoint: str, api_key: ApiKey, data, started: float) -> Generation:
    """Validate the body, resolve the model and tokenize; OpenAIError on any refusal."""
    is_chat = endpoint == CHAT
    values = _validated(ChatCompletionInputSerializer if is_chat else CompletionInputSerializer, data)
    slug = values["model"]
    version = modelversion_get_active(slug=slug)
    if version is None:
        raise errors.model_not_found(slug)
    if not apikey_allows_model(api_key=api_key, model=version.model):
        raise errors.model_not_allowed(slug)
    if not version.tokenizer_dir:
        raise errors.OpenAIError(503, f"the model {slug!r} is still being prepared", type="server_error",
                                 param="model", code="model_not_ready")
    tokenizer = load_tokenizer(version.tokenizer_dir)
    if is_chat:
        max_tokens = values.get("max_completion_tokens") or values.get("max_tokens")
        logprobs = (values.get("top_logprobs") or 0) if values.get("logprobs") else None
        try:
            prompt_ids = tokenizer.apply_chat_template(_template_messages(values["messages"]))
        except ChatTemplateError as exc:
            raise errors.invalid_parameter("messages", str(exc)) from exc
    else:
        max_tokens = values.get("max_tokens") or DEFAULT_COMPLETION_MAX_TOKENS
        logprobs = values.get("logprobs")
        prompt = values["prompt"]
        prompt_ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    apikey_mark_used(api_key=api_key)
    return Generation(
        request_id=request_id, endpoint=endpoint, api_key=api_key, model=version.model, version=version,
        tokenizer=tokenizer, prompt_token_ids=prompt_ids, params=_sampling_params(values, max_tokens, logprobs),
        priority=values.get("priority") or 0, stream=bool(values.get("stream")),
        include_usage=bool((values.get("stream_options") or {}).get("include_usage")),
        wants_logprobs=logprobs is not None, started=started, end_user=values.get("user") or "")


def generation_finish(*, generation: Generation, outcome: Outcome, aborted: bool = False,
                      error: errors.OpenAIError | None = None) -> UsageRecord:
    """Record usage (token counts as the engine reported them) and the web-side metrics."""
    if aborted or outcome.finish_reason == "abort":
        status = UsageRecord.Status.ABORTED
    elif error is not None or outcome.error is not None or not outcome.finished:
        status = UsageRecord.Status.ERROR
    else:
        status = UsageRecord.Status.OK
    error_code = error.code if error is not None else (outcome.error.code if outcome.error else None)
    latency = time.monotonic() - generation.started
    prompt_tokens = outcome.num_prompt_tokens
    if prompt_tokens is None:  # no chunk arrived: the engine never counted it
        prompt_tokens = 0 if error_code else len(generation.prompt_token_ids)
    apikey_release(api_key=generation.api_key, request_id=generation.request_id,
                   tokens=prompt_tokens + outcome.num_output_tokens)
    observe_api_request(model=generation.model.slug, endpoint=generation.endpoint, status=status,
                        latency=latency, time_to_first_token=outcome.time_to_first_token)
    return usage_record_create(
        request_id=generation.request_id, endpoint=generation.endpoint, status=status, latency=latency,
        api_key=generation.api_key, user=generation.api_key.owner, model=generation.model,
        version=modelversion_served(admitted=generation.version, served_label=outcome.served_version),
        model_name=generation.model.slug, prompt_tokens=prompt_tokens,
        completion_tokens=outcome.num_output_tokens, cached_prompt_tokens=outcome.num_cached_tokens,
        time_to_first_token=outcome.time_to_first_token,
        finish_reason=outcome.finish_reason if outcome.finished else None, error_code=error_code,
        end_user=generation.end_user)


def request_refused(*, request_id: str, endpoint: str, api_key: ApiKey, data, error: errors.OpenAIError,
                    started: float) -> UsageRecord:
    """Usage record of an authenticated request refused before reaching a worker."""
    model_name = data.get("model") if isinstance(data, dict) and isinstance(data.get("model"), str) else ""
    end_user = data.get("user") if isinstance(data, dict) and isinstance(data.get("user"), str) else ""
    model = Model.objects.filter(slug=model_name).first()
    apikey_release(api_key=api_key, request_id=request_id)  # no-op unless admitted
    latency = time.monotonic() - started
    # Metric labels only name registered models: a client's typo must not add a time series.
    observe_api_request(model=model.slug if model else "", endpoint=endpoint, status=UsageRecord.Status.ERROR,
                        latency=latency, time_to_first_token=None)
    return usage_record_create(
        request_id=request_id, endpoint=endpoint, status=UsageRecord.Status.ERROR, latency=latency,
        api_key=api_key, user=api_key.owner, model=model, model_name=model_name[:200],
        error_code=error.code or "invalid_request", end_user=end_user if len(end_user) <= MAX_USER_LENGTH else "")
