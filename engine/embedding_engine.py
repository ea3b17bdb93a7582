"""The pooling path: an encoder (engine/models/bert.py), or a decoder run as a causal encoder
(engine/models/decoder_encoder.py, for a decoder checkpoint with a sentence-transformers pooling
config), turning requests' inputs into embeddings.

The same request / step / output loop as ``LLMEngine`` (so the worker loop serves both), without
a KV cache: a request is one or more inputs (token id lists); each step packs waiting inputs, in
arrival order, up to ``max_num_seqs`` inputs and ``max_num_batched_tokens`` tokens, runs one
forward and pools each input
(engine/models/pooling.py). A request finishes in the step that embeds its last input; its
``RequestOutput.embeddings`` is then [num_inputs, dimensions] float32, in input order.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.config import EngineConfig
from engine.errors import (ContextLengthExceededError, InvalidParameterError, ModelLoadError,
                           RequestNotFoundError)
from engine.layers.linear import Linear
from engine.models.bert import PackedBatch
from engine.models.encoder_config import (DecoderEmbeddingConfig, EncoderConfig, encoder_weights,
                                          load_decoder_embedding_config, load_encoder_config)
from engine.models.loader import load_weights
from engine.models.pooling import pool
from engine.models.registry import ENCODER_FAMILIES, model_class, resolve_model_path
from engine.outputs import REQUEST_FAILED, FinishReason, RequestMetrics, RequestOutput
from engine.runtime.device import resolve_device, resolve_dtype
from engine.stats import EngineStats
from engine.text.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


def embedding_family(path) -> str:
    """Our family of an embedding model's Hugging Face directory: an encoder family, or a decoder
    family whose checkpoint has a sentence-transformers pooling config; ModelLoadError (naming
    both kinds) for a generation model."""
    import json

    from engine.models.registry import has_pooling_config, supported_architecture

    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    name = (config.get("architectures") or [config.get("model_type")])[0]
    family = supported_architecture(name, where=str(path / "config.json"))
    if family not in ENCODER_FAMILIES and not has_pooling_config(path):
        raise ModelLoadError(f"{str(path)!r} is a {family} generation model, not an embedding model "
                             f"(embedding models: the {', '.join(sorted(ENCODER_FAMILIES))} encoder "
                             f"families, or a decoder checkpoint with a sentence-transformers pooling "
                             f"config: modules.json and 1_Pooling/config.json)")
    return family


def load_embedding_config(path) -> EncoderConfig | DecoderEmbeddingConfig:
    """An embedding model's config: EncoderConfig for an encoder family, DecoderEmbeddingConfig
    (the decoder's ModelConfig and its pooling) for a decoder family."""
    family = embedding_family(path)
    if family in ENCODER_FAMILIES:
        return load_encoder_config(path, family)
    from engine.models.hf_loader import load_hf_config

    return load_decoder_embedding_config(path, load_hf_config(path))


def embedding_weights(path, config: EncoderConfig | DecoderEmbeddingConfig):
    """The model's HF-named tensors, as its module (BertModel or DecoderEncoder) names them."""
    if isinstance(config, DecoderEmbeddingConfig):
        from engine.models.decoder_encoder import decoder_weights

        return decoder_weights(path, config.decoder)
    return encoder_weights(path)


@dataclass
class _Request:
    request_id: str
    inputs: list[list[int]]
    metrics: RequestMetrics
    vectors: list[torch.Tensor | None] = field(default_factory=list)
    num_done: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(len(ids) for ids in self.inputs)


class EmbeddingEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        path = resolve_model_path(config.model)
        if path.is_file():
            raise ModelLoadError(f"{str(path)!r}: embedding models load from a Hugging Face "
                                 f"directory (sentence-transformers layout), not a single file")
        self.model_path = path
        self.model_config = load_embedding_config(path)
        self.tokenizer = load_tokenizer(path)
        limit = self.model_config.max_seq_length
        if config.max_model_len is not None and config.max_model_len > limit:
            raise InvalidParameterError(
                "max_model_len", f"{config.max_model_len} exceeds the model's maximum input length {limit}")
        self.max_model_len = config.max_model_len or limit
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if isinstance(self.model_config, DecoderEmbeddingConfig):
            # Every parameter in the activation dtype, as generation has them (its RoPE table stays
            # float32, built so explicitly). Cast here rather than built under a default dtype:
            # torch's default dtype is process-wide, and embedded workers load side by side in
            # one process (a bf16 generation worker got float32 layers when this set it).
            from engine.models.decoder_encoder import DecoderEncoder

            with torch.device(self.device):
                model = DecoderEncoder(model_class(self.model_config.architecture)(self.model_config.decoder))
            for param in model.parameters():
                param.data = param.data.to(self.dtype)
            load_weights(model, embedding_weights(path, self.model_config))
        else:
            with torch.device(self.device):
                model = model_class(self.model_config.architecture)(self.model_config)
            load_weights(model, encoder_weights(path))
            for module in model.modules():  # the GEMMs in the activation dtype, the rest float32
                if isinstance(module, Linear):
                    module.to(self.dtype)
        self.model = model.eval()
        self._waiting: deque[tuple[_Request, int]] = deque()  # (request, input index)
        self._requests: dict[str, _Request] = {}
        self._pending: list[RequestOutput] = []  # aborts, reported by the next step()
        self.is_healthy = True
        self.health_error: str | None = None
        self.num_prompt_tokens = 0
        logger.info("embedding model %s: %s, %s on %s", path.name, self.model_config.describe(),
                    str(self.dtype).removeprefix("torch."), self.device)

    # ----------------------------------------------------------------- requests
    def add_request(self, request_id: str, inputs: Sequence[str | list[int]], *,
                    arrival_time: float | None = None) -> int:
        """Queue one request of several inputs (texts or token id lists); returns its token count.
        Raises, storing nothing, when an input is empty, too long or names unknown token ids."""
        if not isinstance(request_id, str):
            raise InvalidParameterError("request_id", "must be a string")
        if request_id in self._requests:
            raise InvalidParameterError("request_id", f"{request_id!r} is already in use")
        token_ids = self.encode_inputs(inputs)
        arrival_time = time.monotonic() if arrival_time is None else arrival_time
        req = _Request(request_id, token_ids, RequestMetrics(arrival_time), [None] * len(token_ids))
        self._requests[request_id] = req
        self._waiting.extend((req, i) for i in range(len(token_ids)))
        return req.num_tokens

    def encode_inputs(self, inputs: Sequence[str | list[int]]) -> list[list[int]]:
        """Texts tokenized with the model's special tokens, token ids as given; each checked."""
        if isinstance(inputs, str) or not isinstance(inputs, (list, tuple)) or not inputs:
            raise InvalidParameterError("input", "must be a non-empty list of texts or token id lists")
        vocab = self.model_config.vocab_size
        encoded = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                ids = self.tokenizer.encode(item, add_special_tokens=True)
            elif isinstance(item, (list, tuple)) and all(
                    isinstance(t, int) and not isinstance(t, bool) for t in item):
                ids = list(item)
                if any(not 0 <= t < vocab for t in ids):
                    raise InvalidParameterError("input", f"input[{i}]: token ids must be in [0, {vocab})")
            else:
                raise InvalidParameterError("input", f"input[{i}] must be a string or a list of token ids")
            if not ids:
                raise InvalidParameterError("input", f"input[{i}] is empty")
            if len(ids) > self.max_model_len:
                raise ContextLengthExceededError(
                    f"input[{i}] has {len(ids)} tokens, more than this model's maximum input "
                    f"length of {self.max_model_len}", param="input")
            encoded.append(ids)
        return encoded

    def abort_request(self, request_id: str) -> None:
        req = self._requests.pop(request_id, None)
        if req is None:
            raise RequestNotFoundError(request_id)
        self._waiting = deque(w for w in self._waiting if w[0] is not req)
        req.metrics.finished_time = time.monotonic()
        self._pending.append(self._output(req, FinishReason.ABORT))

    def has_request(self, request_id: str) -> bool:
        return request_id in self._requests

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests) or bool(self._pending)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._requests)

    # ----------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        batch = self._schedule()
        if not batch:
            return outputs
        now = time.monotonic()
        for req, _ in batch:
            if req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = now
        try:
            vectors = self.forward([req.inputs[i] for req, i in batch]).cpu()
        except Exception:
            logger.exception("an embedding step of %d inputs failed; failing their requests", len(batch))
            failed = {id(req): req for req, _ in batch}.values()
            for req in failed:
                self._requests.pop(req.request_id, None)
                self._waiting = deque(w for w in self._waiting if w[0] is not req)
                out = self._output(req, FinishReason.ERROR)
                out.error = REQUEST_FAILED
                outputs.append(out)
            return outputs
        now = time.monotonic()
        for (req, i), vector in zip(batch, vectors):
            req.vectors[i] = vector
            req.num_done += 1
            self.num_prompt_tokens += len(req.inputs[i])
            if req.num_done == len(req.inputs) and req.request_id in self._requests:
                del self._requests[req.request_id]
                req.metrics.first_token_time = req.metrics.finished_time = now
                outputs.append(self._output(req, FinishReason.STOP))
        return outputs

    def _schedule(self) -> list[tuple[_Request, int]]:
        """Waiting inputs in arrival order while the step holds at most max_num_seqs of them and
        max_num_batched_tokens tokens (always one input, which fits max_model_len)."""
        batch: list[tuple[_Request, int]] = []
        num_tokens = 0
        while self._waiting and len(batch) < self.config.max_num_seqs:
            req, i = self._waiting[0]
            if batch and num_tokens + len(req.inputs[i]) > self.config.max_num_batched_tokens:
                break
            batch.append(self._waiting.popleft())
            num_tokens += len(req.inputs[i])
        return batch

    @torch.inference_mode()
    def forward(self, inputs: list[list[int]]) -> torch.Tensor:
        """One forward over ``inputs`` (token id lists) -> [len(inputs), dimensions] float32."""
        lengths = [len(ids) for ids in inputs]
        input_ids = torch.tensor([t for ids in inputs for t in ids], device=self.device)
        hidden = self.model(input_ids, PackedBatch.build(lengths, self.device))
        cfg = self.model_config
        return pool(hidden, lengths, cfg.pooling, cfg.normalize)

    def embed(self, inputs: Sequence[str | list[int]]) -> torch.Tensor:
        """Offline: every input's embedding, [len(inputs), dimensions] float32, in input order."""
        request_id = f"embed-{time.monotonic_ns()}"
        self.add_request(request_id, inputs)
        while True:
            for out in self.step():
                if out.request_id == request_id:
                    return out.embeddings

    def _output(self, req: _Request, reason: str) -> RequestOutput:
        finished = reason == FinishReason.STOP
        return RequestOutput(
            request_id=req.request_id, text_delta="", token_ids_delta=[], finished=True,
            finish_reason=reason, num_prompt_tokens=req.num_tokens, num_output_tokens=0,
            num_cached_tokens=0, metrics=req.metrics,
            embeddings=torch.stack(req.vectors) if finished else None)

    # ----------------------------------------------------------------- health and stats
    def check_health(self) -> bool:
        """One tiny forward; ``is_healthy`` says whether it ran."""
        try:
            self.forward([[0, 0]])
        except Exception as exc:
            self.is_healthy, self.health_error = False, f"{type(exc).__name__}: {exc}"
        else:
            self.is_healthy, self.health_error = True, None
        return self.is_healthy

    def reset_counters(self) -> None:
        self.num_prompt_tokens = 0

    def stats(self) -> EngineStats:
        waiting = len({id(req) for req, _ in self._waiting})
        return EngineStats(num_running=len(self._requests) - waiting, num_waiting=waiting,
                           num_blocks=0, num_free_blocks=0, kv_cache_usage=0.0,
                           prefix_cache_queried_tokens=0, prefix_cache_hit_tokens=0,
                           num_preemptions=0, num_prompt_tokens=self.num_prompt_tokens,
                           num_generation_tokens=0)

    def shutdown(self) -> None:
        """Nothing to stop (no other ranks); the worker calls it as it calls the runner's."""
