"""Messages between the web process and engine workers: JSON-serialisable dataclasses.

Imports nothing from ``engine`` (the web process reads this module without loading torch).

Liveness: a worker refreshes its heartbeat every ``HEARTBEAT_INTERVAL_S`` and counts as live
for ``HEARTBEAT_TTL_S`` after the last one. A client that hears nothing for ``WATCH_INTERVAL_S``
checks the heartbeat of the worker that claimed its request (or, before the claim, of the
model's workers), so a dead worker is noticed within TTL + WATCH_INTERVAL (about 6 s, under the
10 s the product promises).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_TTL_S = 5.0
WATCH_INTERVAL_S = 1.0
# How long a request's UsageReport outlives the last chunk its worker sent: longer than the web
# side takes to notice that the process which asked for it died (webapp/usage/reconcile.py: the
# lease's TTL, its confirmation and the reconciler's interval, 30 + 10 + 10 s by default).
USAGE_REPORT_TTL_S = 600

# ErrorInfo.code values.
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
INVALID_PARAMETER = "invalid_parameter"
NO_WORKER = "no_worker"
WORKER_LOST = "worker_lost"
INTERNAL_ERROR = "internal_error"
# Load shedding (workers/transport.py's Admission): the client is told to retry after
# ErrorInfo.retry_after seconds.
SERVER_OVERLOADED = "server_overloaded"  # the model's queue is full
QUEUE_TIMEOUT = "queue_timeout"  # no worker started it within the queue deadline
REQUEST_TIMEOUT = "request_timeout"  # it ran past the overall deadline
QUEUE_UNAVAILABLE = "queue_unavailable"  # the transport (Redis) is unreachable
ERROR_CODES = (CONTEXT_LENGTH_EXCEEDED, INVALID_PARAMETER, NO_WORKER, WORKER_LOST, INTERNAL_ERROR,
               SERVER_OVERLOADED, QUEUE_TIMEOUT, REQUEST_TIMEOUT, QUEUE_UNAVAILABLE)


# GenerateRequest.task: generation, or embeddings from an embedding model (engine/embedding_engine.py).
TASK_GENERATE = "generate"
TASK_EMBED = "embed"
TASKS = (TASK_GENERATE, TASK_EMBED)


class ProtocolError(ValueError):
    """A message that does not have the shape this module defines."""


def _from_dict(cls, data: dict):
    if not isinstance(data, dict):
        raise ProtocolError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in data.items() if k in names})
    except TypeError as exc:
        raise ProtocolError(f"{cls.__name__}: {exc}") from exc


@dataclass
class ErrorInfo:
    code: str  # one of ERROR_CODES
    message: str
    param: str | None = None  # the request field at fault, for invalid_parameter / context length
    retry_after: float | None = None  # seconds after which a retry may succeed (load shedding)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ErrorInfo:
        return _from_dict(cls, data)


@dataclass
class GenerateRequest:
    request_id: str
    model: str
    prompt_token_ids: list[int]
    params: dict  # SamplingParams keyword arguments
    priority: int = 0
    reply_to: str = ""  # filled in by the transport when empty
    created_at: float = field(default_factory=time.time)  # wall clock; queueing counts in TTFT
    n: int = 1  # samples of the prompt (the engine checks the range)
    # Who the request belongs to (engine/tenancy.py), set by the web side from who authenticated,
    # never from the body: it scopes the prefix cache and weighs the tenant's fair share.
    tenant: str = ""
    tenant_weight: float = 1.0
    # The first prompt tokens that are a prefix staff marked as shared: their full blocks are
    # cached for every tenant. At most the prompt's length (a longer one is refused, not clamped).
    shared_prefix_len: int = 0
    # A LoRA adapter of the model (engine/lora/): its name and its folder on the workers'
    # machine; "" runs the base model. The worker serving the base serves its adapters.
    adapter: str = ""
    adapter_path: str = ""
    # TASK_EMBED: ``inputs`` are the token ids of each text to embed (prompt_token_ids empty,
    # params {}); the final chunk carries their vectors in ``Chunk.embeddings``.
    task: str = TASK_GENERATE
    inputs: list[list[int]] | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GenerateRequest:
        req = _from_dict(cls, data)
        if req.task not in TASKS:
            raise ProtocolError(f"GenerateRequest: task must be one of {', '.join(TASKS)}")
        if req.task == TASK_EMBED and not (
                isinstance(req.inputs, list) and req.inputs
                and all(isinstance(ids, list) and all(_is_int(t) for t in ids) for ids in req.inputs)):
            raise ProtocolError("GenerateRequest: an embed request's inputs must be a non-empty list "
                                "of token id lists")
        if not isinstance(req.request_id, str) or not req.request_id:
            raise ProtocolError("GenerateRequest: request_id must be a non-empty string")
        if not isinstance(req.reply_to, str):
            raise ProtocolError("GenerateRequest: reply_to must be a string")
        if not _is_int(req.n) or req.n < 1:
            raise ProtocolError("GenerateRequest: n must be a positive integer")
        if not isinstance(req.tenant, str):
            raise ProtocolError("GenerateRequest: tenant must be a string")
        if not (isinstance(req.adapter, str) and isinstance(req.adapter_path, str)) or (
                bool(req.adapter) != bool(req.adapter_path)):
            raise ProtocolError("GenerateRequest: adapter and adapter_path must be strings, both set or both empty")
        weight = req.tenant_weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                or weight <= 0:
            raise ProtocolError("GenerateRequest: tenant_weight must be a finite number > 0")
        num_prompt = len(req.prompt_token_ids) if isinstance(req.prompt_token_ids, list) else 0
        if not _is_int(req.shared_prefix_len) or not 0 <= req.shared_prefix_len <= num_prompt:
            raise ProtocolError(f"GenerateRequest: shared_prefix_len must be an integer from 0 to the "
                                f"prompt's {num_prompt} tokens")
        return req


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class Chunk:
    """A batch of one request's deltas; the last one has ``finished=True``.

    A worker-side failure is a final chunk with ``error`` set and ``finish_reason`` None.
    For a request with n > 1 samples the deltas are in ``samples`` instead, one SampleDelta dict
    per sample that moved: {"index", "text", "token_ids", "logprobs", "finish_reason",
    "stop_reason", "num_output_tokens"} (finish_reason set once that sample ended); text, token_ids and logprobs
    are then empty, num_output_tokens is the samples' sum and finish_reason the last one's.
    """

    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[dict] | None  # [{"token_id", "logprob", "top": [[id, logprob], ...]}]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    time_to_first_token: float | None
    error: ErrorInfo | None = None
    # The version the answering worker serves: during an activation the web side may have
    # admitted the request for the new version while the old one still answers it.
    version: str | None = None
    samples: list[dict] | None = None  # n > 1 only, see above
    # An embed request's final chunk: each input's vector, in input order, as base64 of its
    # float32 little-endian bytes (OpenAI's encoding_format "base64"; workers/replies.py).
    embeddings: list[str] | None = None
    # The stop string (or token id) that ended the request, on its last chunk; n > 1: per sample.
    stop_reason: str | int | None = None

    @classmethod
    def failure(cls, request_id: str, error: ErrorInfo) -> Chunk:
        return cls(request_id, "", [], None, True, None, 0, 0, 0, None, error)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["error"] = self.error.to_dict() if self.error else None
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Chunk:
        chunk = _from_dict(cls, data)
        if chunk.error is not None:
            chunk.error = ErrorInfo.from_dict(chunk.error)
        return chunk


@dataclass
class UsageReport:
    """A request's token counts as its worker last sent them, kept by the transport itself (a
    Redis key in distributed mode) for USAGE_REPORT_TTL_S: what the web side bills when the process
    that asked for the request died before recording it. The counts are the chunks' own (each
    chunk carries the request's totals so far); a failure chunk, which carries none, marks the
    report finished and keeps the counts before it."""

    request_id: str
    worker_id: str
    model: str
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # every sample's, for n > 1
    num_cached_tokens: int = 0
    time_to_first_token: float | None = None
    finished: bool = False
    finish_reason: str | None = None
    error_code: str | None = None
    reported_at: float = 0.0  # wall clock of the worker's last chunk

    @classmethod
    def fields_of(cls, chunk: Chunk, now: float) -> dict:
        """What ``chunk`` changes in its request's report (a failure leaves the counts as they were)."""
        fields = {"finished": chunk.finished, "reported_at": now}
        if chunk.error is not None:
            return {**fields, "error_code": chunk.error.code}
        return {**fields, "num_prompt_tokens": chunk.num_prompt_tokens, "num_output_tokens": chunk.num_output_tokens,
                "num_cached_tokens": chunk.num_cached_tokens, "time_to_first_token": chunk.time_to_first_token,
                "finish_reason": chunk.finish_reason}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> UsageReport:
        return _from_dict(cls, data)


@dataclass
class WorkerInfo:
    """What a worker announces with every heartbeat.

    ``stats`` is ``workers.metrics.WorkerMetrics.snapshot()``: engine gauges and counters,
    tokens_per_s, and latency histograms (see that module for the exact keys).
    """

    worker_id: str
    model: str
    version: str
    host: str
    pid: int
    started_at: float
    last_heartbeat: float
    max_num_seqs: int
    max_model_len: int
    stats: dict = field(default_factory=dict)
    draining: bool = False  # after SIGTERM: finishing running requests, taking no new ones
    # False while the engine cannot run a minimal request (LLMEngine.is_healthy): the worker
    # takes no requests and probes the engine until it recovers; /readyz counts it as not serving.
    healthy: bool = True

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> WorkerInfo:
        return _from_dict(cls, data)


@dataclass
class Reply:
    """One message on a request's reply channel: the claim (which worker took it) or a chunk.

    The claim lets the client watch that one worker's heartbeat instead of the model's.
    "released": a draining worker handed the (not yet started) request back to the queue; the
    client waits for the next claim.
    """

    kind: str  # "claimed" | "released" | "chunk"
    worker_id: str
    chunk: Chunk | None = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "worker_id": self.worker_id,
                "chunk": self.chunk.to_dict() if self.chunk else None}

    @classmethod
    def from_dict(cls, data: dict) -> Reply:
        reply = _from_dict(cls, data)
        if reply.kind not in ("claimed", "released", "chunk"):
            raise ProtocolError(f"Reply: unknown kind {reply.kind!r}")
        if reply.chunk is not None:
            reply.chunk = Chunk.from_dict(reply.chunk)
        return reply
