"""Turning a validated API call into an engine request, and accounting for it when it ends; the
/tokenize and /detokenize answers, with the same served model's tokenizer.

Everything here is synchronous (ORM); the async views call it through ``sync_to_async``.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field

from webapp.keys.enforcement import (LimitExceeded, PriorityNotAllowed, apikey_admit, apikey_priority,
                                     apikey_release, apikey_reserve, worst_case_tokens)
from webapp.keys.limits import LimitStoreUnavailable
from webapp.keys.models import ApiKey
from webapp.chat.prefix_sharing import shared_prefix_len
from webapp.keys.selectors import apikey_allows_adapter, apikey_allows_model, apikey_get_usable
from webapp.keys.services import apikey_mark_used
from webapp.keys.tenancy import user_tenant
from webapp.monitoring.metrics import observe_api_request
from webapp.openai_api import errors
from webapp.openai_api.completion_extras import fim_prompt
from webapp.openai_api.serializers import MAX_MODEL_LENGTH, MAX_USER_LENGTH, prompt_list
from webapp.openai_api.tool_calls import ToolPlan, template_messages
from webapp.registry.adapters import adapter_resolve
from webapp.registry.models import Adapter, Model, ModelVersion
from webapp.registry.chat_templates import add_turn_ends
from webapp.registry.selectors import modelversion_get_active, modelversion_tokenizer
from webapp.registry.tokenizers import ChatTemplateError, ModelTokenizer
from webapp.usage.models import UsageRecord
from webapp.usage.outcome import Outcome
from webapp.usage.services import usage_record_build, usage_record_close, usage_record_finish, usage_record_start
from workers.protocol import GenerateRequest

CHAT = UsageRecord.Endpoint.CHAT_COMPLETIONS
COMPLETIONS = UsageRecord.Endpoint.COMPLETIONS
EMBEDDINGS = UsageRecord.Endpoint.EMBEDDINGS
logger = logging.getLogger(__name__)
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# Request field -> SamplingParams keyword (same name unless mapped), passed on when not null.
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                   "frequency_penalty", "seed", "stop", "ignore_eos", "structured_outputs",
                   "min_tokens", "stop_token_ids", "logit_bias")


MESSAGES = UsageRecord.Endpoint.MESSAGES
RESPONSES = UsageRecord.Endpoint.RESPONSES
ID_PREFIXES = {CHAT: "chatcmpl-", MESSAGES: "msg_", RESPONSES: "resp_"}
PROMPT_PARAMS = {COMPLETIONS: "prompt", RESPONSES: "input"}  # else "messages"


def new_request_id(endpoint: str) -> str:
    return {**ID_PREFIXES, EMBEDDINGS: "embd-"}.get(endpoint, "cmpl-") + uuid.uuid4().hex


@dataclass
class Generation:
    """An accepted request: who asked, for which model version, and what the engine gets."""

    request_id: str
    endpoint: str
    api_key: ApiKey
    model: Model
    version: ModelVersion
    tokenizer: ModelTokenizer
    prompt_token_ids: list[int]  # the prompt (the first of ``prompts``)
    params: dict  # SamplingParams keyword arguments
    priority: int
    stream: bool
    include_usage: bool
    wants_logprobs: bool
    started: float  # time.monotonic() when the request arrived
    end_user: str = ""  # the request's ``user``, for the usage record only
    created: int = field(default_factory=lambda: int(time.time()))
    n: int = 1  # samples of each prompt
    prompts: list[list[int]] | None = None  # a completion's list of prompts (None: just prompt_token_ids)
    tools: ToolPlan | None = None  # chat: the tools the model may call (webapp/openai_api/tool_calls.py)
    shared_prefix_len: int = 0  # leading prompt tokens of a staff-shared system prompt (webapp/chat/prefix_sharing.py)
    adapter: Adapter | None = None  # a LoRA adapter of the model, which its workers serve

    values: dict = field(default_factory=dict)  # the internal request, for the API's renderer

    @property
    def prompt_param(self) -> str:
        return PROMPT_PARAMS.get(self.endpoint, "messages")

    @property
    def all_prompts(self) -> list[list[int]]:
        return self.prompts or [self.prompt_token_ids]

    @property
    def num_prompts(self) -> int:
        return len(self.all_prompts)

    @property
    def num_choices(self) -> int:
        """The engine's samples in all, prompt by prompt: choice index = prompt index x n + sample index."""
        return self.num_prompts * self.n

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.all_prompts)

    def engine_request_ids(self) -> list[str]:
        """One engine request per prompt: the request's own id when it has one prompt."""
        if self.num_prompts == 1:
            return [self.request_id]
        return [f"{self.request_id}-{index}" for index in range(self.num_prompts)]

    def engine_requests(self) -> list[GenerateRequest]:
        return [self.engine_request(ids, request_id)
                for ids, request_id in zip(self.all_prompts, self.engine_request_ids())]

    def engine_request(self, prompt_token_ids: list[int] | None = None,
                       request_id: str | None = None) -> GenerateRequest:
        # The key's owner, never the body: the engine scopes its prefix cache to this tenant and
        # shares itself between tenants at the key's weight.
        return GenerateRequest(request_id=request_id or self.request_id, model=self.model.slug,
                               prompt_token_ids=self.prompt_token_ids if prompt_token_ids is None else prompt_token_ids,
                               params=self.params, priority=self.priority,
                               n=self.n, tenant=user_tenant(self.api_key.owner_id),
                               tenant_weight=self.api_key.fair_share_weight, shared_prefix_len=self.shared_prefix_len,
                               adapter=self.adapter.name if self.adapter else "",
                               adapter_path=self.adapter.path if self.adapter else "")


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
    except LimitStoreUnavailable as exc:
        logger.warning("request %s refused: %s", request_id, exc)
        raise errors.limits_unavailable() from exc


def _sampling_params(data: dict, max_tokens: int | None, logprobs: int | None) -> dict:
    params = {name: data[name] for name in SAMPLING_FIELDS if data.get(name) is not None}
    params["max_tokens"] = max_tokens
    if logprobs is not None:
        params["logprobs"] = logprobs
    return params


def model_version_for_key(*, api_key: ApiKey, slug: str) -> ModelVersion:
    """The active version of a model the key may use; 404 model_not_found otherwise."""
    return model_target_for_key(api_key=api_key, slug=slug)[0]


def model_target_for_key(*, api_key: ApiKey, slug: str) -> tuple[ModelVersion, Adapter | None]:
    """What ``model`` names, for a key that may use it: the active version of a model, and the
    LoRA adapter when it names one (``<base>:<adapter>`` or the adapter's own name); 404 otherwise."""
    base_slug, adapter = adapter_resolve(name=slug)
    version = modelversion_get_active(slug=base_slug)
    if version is None or not (apikey_allows_model(api_key=api_key, model=version.model) if adapter is None
                               else apikey_allows_adapter(api_key=api_key, adapter=adapter)):
        raise errors.model_not_found(slug)
    return version, adapter


def model_served(*, api_key: ApiKey, slug: str) -> tuple[ModelVersion, ModelTokenizer]:
    """``model_version_for_key`` and its tokenizer; 503 model_not_ready while that is being exported."""
    version, _adapter, tokenizer = _target_served(api_key=api_key, slug=slug)
    return version, tokenizer


def _target_served(*, api_key: ApiKey, slug: str) -> tuple[ModelVersion, Adapter | None, ModelTokenizer]:
    """``model_target_for_key`` and the version's tokenizer (model_served's 503 while it is exported)."""
    version, adapter = model_target_for_key(api_key=api_key, slug=slug)
    if not version.tokenizer_dir:
        raise errors.OpenAIError(503, f"the model {slug!r} is still being prepared", type="server_error",
                                 param="model", code="model_not_ready")
    return version, adapter, modelversion_tokenizer(version)


def served_max_model_len(version: ModelVersion, tokenizer: ModelTokenizer) -> int:
    """The context length the version is served with: its engine setting, else the tokenizer's."""
    return version.engine_settings.get("max_model_len") or tokenizer.max_model_len


def generation_prepare(*, request_id: str, endpoint: str, api_key: ApiKey, values: dict, started: float) -> Generation:
    """Resolve the model and tokenize a validated body (the API's InputSerializer); OpenAIError on any refusal."""
    is_chat = "messages" in values
    version, adapter, tokenizer = _target_served(api_key=api_key, slug=values["model"])  # adapter: LoRA or None
    if tokenizer.embedding is not None:
        raise errors.invalid_parameter("model", f"the model {values['model']!r} is an embedding model and "
                                                f"does not generate text; use /v1/embeddings")
    num_shared, prompts = 0, None
    if is_chat:
        max_tokens = values.get("max_completion_tokens") or values.get("max_tokens")
        logprobs = (values.get("top_logprobs") or 0) if values.get("logprobs") else None
        messages = template_messages(values["messages"], values.get("tool_plan"))
        try:
            prompt_ids = tokenizer.apply_chat_template(messages)
        except ChatTemplateError as exc:
            raise errors.invalid_parameter("messages", str(exc)) from exc
        num_shared = shared_prefix_len(tokenizer=tokenizer, messages=messages, prompt_ids=prompt_ids)
    else:
        max_tokens = values.get("max_tokens") or DEFAULT_COMPLETION_MAX_TOKENS
        logprobs = values.get("logprobs")
        prompts = [fim_prompt(tokenizer, prompt, values["suffix"]) if values.get("suffix")  # completion_extras.py
                   else tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
                   for prompt in prompt_list(values["prompt"])]
        prompt_ids = prompts[0]
    if values.get("logit_bias") and max(values["logit_bias"]) >= tokenizer.vocab_size:
        raise errors.invalid_parameter("logit_bias", f"token ids must be below the vocabulary size {tokenizer.vocab_size}")
    num_samples = max(values.get("n") or 1, values.get("best_of") or 1)
    all_prompts = prompts or [prompt_ids]
    num_prompt_tokens = sum(len(ids) for ids in all_prompts)
    max_model_len = served_max_model_len(version, tokenizer)
    try:  # the worst case of every sample of every prompt is held against the key's token rate and budget
        priority = apikey_priority(api_key=api_key, requested=values.get("priority"))
        apikey_reserve(api_key=api_key, request_id=request_id, tokens=num_samples * sum(
            worst_case_tokens(num_prompt_tokens=len(ids), max_tokens=max_tokens, max_model_len=max_model_len)
            for ids in all_prompts),
            model_id=version.model_id, num_prompt_tokens=num_prompt_tokens)  # and its cost, against money budgets
    except PriorityNotAllowed as exc:
        raise errors.invalid_parameter("priority", str(exc)) from exc
    except LimitExceeded as exc:
        raise errors.limit_exceeded(exc.code, exc.message, exc.retry_after) from exc
    except LimitStoreUnavailable as exc:
        logger.warning("request %s refused: %s", request_id, exc)
        raise errors.limits_unavailable() from exc
    apikey_mark_used(api_key=api_key)
    try:  # the request is accounted for from now on, even if this process dies before it ends
        usage_record_start(request_id=request_id, endpoint=endpoint, started=started, model=version.model,
                           version=version, num_prompt_tokens=num_prompt_tokens, api_key=api_key, user=api_key.owner,
                           end_user=values.get("user") or "", model_name=str(adapter) if adapter else None)
    except LimitStoreUnavailable as exc:
        logger.warning("request %s refused: %s", request_id, exc)
        raise errors.limits_unavailable() from exc
    ranked = num_samples > (values.get("n") or 1)  # best_of: samples ranked by their log-probability
    params = _sampling_params(values, max_tokens, logprobs if logprobs is not None or not ranked else 0)
    return Generation(
        request_id=request_id, endpoint=endpoint, api_key=api_key, model=version.model, version=version,
        tokenizer=tokenizer, prompt_token_ids=prompt_ids,
        params=add_turn_ends(params, tokenizer) if is_chat else params,
        priority=priority, stream=bool(values.get("stream")),
        include_usage=bool((values.get("stream_options") or {}).get("include_usage")),
        wants_logprobs=logprobs is not None, started=started, end_user=values.get("user") or "",
        n=num_samples, prompts=prompts if len(all_prompts) > 1 else None, tools=values.get("tool_plan"),
        shared_prefix_len=num_shared, adapter=adapter, values=values)


def prompt_tokenize(*, api_key: ApiKey, values: dict) -> dict:
    """POST /tokenize's answer for a validated body: its ``prompt`` encoded as a completion prompt
    is, or its ``messages`` rendered by the chat template as a chat completion's are."""
    version, tokenizer = model_served(api_key=api_key, slug=values["model"])
    add_special = values.get("add_special_tokens")
    if "prompt" in values:
        tokens = tokenizer.encode(values["prompt"], add_special_tokens=True if add_special is None else add_special)
    else:
        try:
            text = tokenizer.render_chat(template_messages(values["messages"], None),
                                         add_generation_prompt=values["add_generation_prompt"])
        except ChatTemplateError as exc:
            raise errors.invalid_parameter("messages", str(exc)) from exc
        tokens = tokenizer.encode(text, add_special_tokens=bool(add_special))
    return {"count": len(tokens), "max_model_len": served_max_model_len(version, tokenizer), "tokens": tokens}


def tokens_detokenize(*, api_key: ApiKey, model: str, tokens: list[int]) -> dict:
    """POST /detokenize's answer: the text of ``tokens``, special tokens included."""
    _version, tokenizer = model_served(api_key=api_key, slug=model)
    vocab = tokenizer.vocab_size
    bad = [t for t in tokens if t >= vocab]
    if bad:
        raise errors.invalid_parameter("tokens", f"token ids must be below the vocabulary size {vocab}, got {bad[:5]}")
    return {"prompt": tokenizer.tokenizer.decode(tokens, skip_special_tokens=False)}


def generation_finish(*, generation: Generation, outcome: Outcome, aborted: bool = False,
                      error: errors.OpenAIError | None = None) -> UsageRecord:
    """Record the usage of a request that reached a worker (and free the key's slot)."""
    return usage_record_finish(
        request_id=generation.request_id, endpoint=generation.endpoint, started=generation.started,
        outcome=outcome, model=generation.model, version=generation.version,
        num_prompt_tokens=generation.num_prompt_tokens, api_key=generation.api_key,
        user=generation.api_key.owner, end_user=generation.end_user, aborted=aborted,
        error_code=error.code if error is not None else None)


def request_refused(*, request_id: str, endpoint: str, api_key: ApiKey, data, error: errors.OpenAIError | None,
                    started: float) -> UsageRecord:
    """Usage record of an authenticated request refused before reaching a worker (``error``), or
    whose client went away before it did (``error`` None: aborted); frees what admission took."""
    record = request_refused_record(request_id=request_id, endpoint=endpoint, api_key=api_key, data=data,
                                    error=error, started=started)
    if record is None:
        return UsageRecord.objects.get(request_id=request_id)
    record.save()
    return record


def request_refused_record(*, request_id: str, endpoint: str, api_key: ApiKey, data,
                           error: errors.OpenAIError | None, started: float) -> UsageRecord | None:
    """``request_refused`` but for the record's insert: it is returned validated and unsaved (the
    API's views save it with webapp.usage.group_commit); None when the request had its running
    record already (it was cancelled between that and the engine): that record is ended here."""
    model_name = data.get("model") if isinstance(data, dict) and isinstance(data.get("model"), str) else ""
    end_user = data.get("user") if isinstance(data, dict) and isinstance(data.get("user"), str) else ""
    model = Model.objects.filter(slug=model_name).first()
    latency = time.monotonic() - started
    # Metric labels only name registered models: a client's typo must not add a time series.
    status = UsageRecord.Status.ERROR if error is not None else UsageRecord.Status.ABORTED
    error_code = (error.code or "invalid_request") if error is not None else ""
    observe_api_request(model=model.slug if model else "", endpoint=endpoint, status=status,
                        latency=latency, time_to_first_token=None, error_code=error_code or None)
    # A read first: the refusals of a burst must not each take SQLite's write lock for nothing.
    if UsageRecord.objects.filter(request_id=request_id, status=UsageRecord.Status.RUNNING).exists() and \
            usage_record_close(request_id=request_id, subject=api_key, fields=dict(
                status=status, latency=latency, prompt_tokens=0, completion_tokens=0, cached_prompt_tokens=0,
                time_to_first_token=None, finish_reason="", error_code=error_code)):
        return None
    apikey_release(api_key=api_key, request_id=request_id)  # no-op unless admitted
    return usage_record_build(
        request_id=request_id, endpoint=endpoint, status=status, latency=latency,
        api_key=api_key, user=api_key.owner, model=model, model_name=model_name[:MAX_MODEL_LENGTH],
        error_code=error_code, end_user=end_user if len(end_user) <= MAX_USER_LENGTH else "")


def chat_prompt_count(*, api_key: ApiKey, values: dict) -> int:
    """The prompt tokens a chat-shaped internal request would send (its tools' block included)."""
    _version, tokenizer = model_served(api_key=api_key, slug=values["model"])
    try:
        return len(tokenizer.apply_chat_template(template_messages(values["messages"], values.get("tool_plan"))))
    except ChatTemplateError as exc:
        raise errors.invalid_parameter("messages", str(exc)) from exc
