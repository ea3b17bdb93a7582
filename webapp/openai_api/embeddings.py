"""POST v1/embeddings once admitted: the model must be an embedding model, every input fits it, the
tokens are reserved against the key and recorded; then one request to the model's workers carries
every input (GenerateRequest.task "embed"), and its final chunk their vectors.

The key check, admission and the record of a refusal are the completions' (lifecycle.py); the
record of a request that reached a worker, its drain at shutdown and its abort when the client
leaves are generation.py's, through an ``Embedding`` that carries what they read of a Generation.

``dimensions``: accepted when it equals the model's own dimensions; a smaller one would need a
model trained for truncation (Matryoshka), which a sentence-transformers checkpoint does not
declare, so it is refused naming the field rather than silently truncated into worse vectors.
Token-id inputs are the model's input as they are (its [CLS]/[SEP] included where it uses them:
POST /tokenize returns them); a text gets the model's special tokens, as sentence-transformers adds.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import struct
from contextlib import aclosing
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpResponse, JsonResponse

from webapp.config.shutdown import track
from webapp.keys.enforcement import LimitExceeded, apikey_reserve
from webapp.keys.limits import LimitStoreUnavailable
from webapp.keys.models import ApiKey
from webapp.keys.services import apikey_mark_used
from webapp.keys.tenancy import user_tenant
from webapp.openai_api import errors
from webapp.openai_api.dialect import Dialect
from webapp.openai_api.generation import _cut, _finish
from webapp.openai_api.services import EMBEDDINGS, model_served
from webapp.openai_api.timing import phase_mark
from webapp.registry.models import Model, ModelVersion
from webapp.usage.checkpoints import get_checkpoints
from webapp.usage.outcome import Outcome
from webapp.usage.services import usage_record_start
from workers.connect import get_engine_client
from workers.protocol import TASK_EMBED, GenerateRequest

logger = logging.getLogger(__name__)


@dataclass
class Embedding:
    """An accepted embeddings request: who asked, for which model version, each input's token ids.
    ``num_prompt_tokens`` (every input's) and ``end_user`` are what the usage record of a
    Generation reads (services.generation_finish), ``engine_request_ids`` what its abort at
    shutdown reads (prompts.generation_abort): every input goes in the one engine request."""

    request_id: str
    api_key: ApiKey
    model: Model
    version: ModelVersion
    inputs: list[list[int]]
    encoding_format: str
    started: float
    end_user: str = ""
    endpoint: str = EMBEDDINGS
    prompt_param: str = "input"

    @property
    def num_prompt_tokens(self) -> int:
        """Every input's tokens: what services.generation_finish records (as a Generation's)."""
        return sum(len(ids) for ids in self.inputs)

    def engine_request_ids(self) -> list[str]:
        return [self.request_id]

    def engine_request(self) -> GenerateRequest:
        return GenerateRequest(request_id=self.request_id, model=self.model.slug, prompt_token_ids=[],
                               params={}, task=TASK_EMBED, inputs=self.inputs,
                               tenant=user_tenant(self.api_key.owner_id),
                               tenant_weight=self.api_key.fair_share_weight)


def embedding_prepare(*, request_id: str, api_key: ApiKey, values: dict, started: float) -> Embedding:
    """Resolve the model, tokenize and check every input, reserve and record; OpenAIError on a refusal."""
    slug = values["model"]
    version, tokenizer = model_served(api_key=api_key, slug=slug)
    spec = tokenizer.embedding
    if spec is None:
        raise errors.invalid_parameter("model", f"the model {slug!r} is a generation model and does not "
                                                f"serve embeddings; use an embedding model")
    dimensions = values.get("dimensions")
    if dimensions is not None and dimensions != spec["dimensions"]:
        raise errors.invalid_parameter("dimensions", (
            f"the model {slug!r} gives {spec['dimensions']}-dimensional embeddings and was not trained "
            f"to be truncated (no Matryoshka support); omit dimensions or pass {spec['dimensions']}"))
    max_len = version.engine_settings.get("max_model_len") or spec["max_seq_length"]
    vocab = tokenizer.vocab_size
    inputs = []
    for i, item in enumerate(values["input"]):
        ids = tokenizer.encode(item) if isinstance(item, str) else item
        if not isinstance(item, str) and any(t >= vocab for t in ids):
            raise errors.invalid_parameter("input", f"input[{i}]: token ids must be below the vocabulary "
                                                    f"size {vocab}")
        if len(ids) > max_len:
            raise errors.OpenAIError(400, f"input[{i}] has {len(ids)} tokens, more than the maximum input "
                                          f"length of {max_len} tokens of the model {slug!r}; shorten it",
                                     param="input", code="context_length_exceeded")
        inputs.append(ids)
    num_tokens = sum(len(ids) for ids in inputs)
    try:
        apikey_reserve(api_key=api_key, request_id=request_id, tokens=num_tokens)
    except LimitExceeded as exc:
        raise errors.limit_exceeded(exc.code, exc.message, exc.retry_after) from exc
    except LimitStoreUnavailable as exc:
        logger.warning("request %s refused: %s", request_id, exc)
        raise errors.limits_unavailable() from exc
    apikey_mark_used(api_key=api_key)
    end_user = values.get("user") or ""
    try:  # accounted for from now on, even if this process dies before it ends
        usage_record_start(request_id=request_id, endpoint=EMBEDDINGS, started=started, model=version.model,
                           version=version, num_prompt_tokens=num_tokens, api_key=api_key,
                           user=api_key.owner, end_user=end_user)
    except LimitStoreUnavailable as exc:
        logger.warning("request %s refused: %s", request_id, exc)
        raise errors.limits_unavailable() from exc
    return Embedding(request_id=request_id, api_key=api_key, model=version.model, version=version,
                     inputs=inputs, encoding_format=values.get("encoding_format") or "float",
                     started=started, end_user=end_user)


async def embedding_respond(*, request_id: str, dialect: Dialect, api_key: ApiKey, values: dict,
                            started: float) -> HttpResponse:
    """Run an admitted embeddings request (its Dialect's ``respond``, called by lifecycle.completion_create)."""
    emb = await sync_to_async(embedding_prepare)(request_id=request_id, api_key=api_key, values=values,
                                                 started=started)
    phase_mark("prepare")  # Server-Timing: then the engine until the answer
    outcome, vectors = Outcome(), None
    get_checkpoints().watch(request_id, outcome, started)  # until _finish
    chunks = get_engine_client(settings.REDIS_URL).generate(emb.engine_request())
    track(request_id, asyncio.current_task(), cut=lambda: _cut(emb, outcome))
    try:
        async with aclosing(chunks):
            async for chunk in chunks:
                outcome.add(chunk)
                vectors = chunk.embeddings or vectors
    except asyncio.CancelledError:  # the client went away; aclosing aborted the request
        await _finish(emb, outcome, aborted=True)
        raise
    except Exception as exc:
        error = errors.internal_error(exc)
        await _finish(emb, outcome, error=error)
        return error.response()
    if outcome.error is None and (vectors is None or len(vectors) != len(emb.inputs)):
        error = errors.internal_error(RuntimeError(f"the worker answered {request_id} without its vectors"))
    elif outcome.error is not None:
        error = errors.from_error_info(outcome.error, prompt_param="input")
    else:
        error = None
    await _finish(emb, outcome, error=error)
    if error is not None:
        return error.response()
    response = JsonResponse(embedding_body(emb, vectors, outcome))
    response["X-Request-Id"] = request_id
    return response


def embedding_body(emb: Embedding, vectors: list[str], outcome: Outcome) -> dict:
    """OpenAI's answer: each input's vector as floats, or as base64 of its float32 bytes as sent."""
    data = []
    for index, encoded in enumerate(vectors):
        if emb.encoding_format == "base64":
            value = encoded
        else:
            raw = base64.b64decode(encoded)
            value = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        data.append({"object": "embedding", "index": index, "embedding": value})
    tokens = outcome.num_prompt_tokens if outcome.num_prompt_tokens is not None else emb.num_prompt_tokens
    return {"object": "list", "data": data, "model": emb.model.slug, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
