"""``EngineWorker``: one model version served by an engine loop; requests arrive from a transport.

One thread owns the engine (workers/serving.py decides which workers run and when they stop).

Each iteration: apply aborts, admit new requests while there is room (blocking briefly on the
queue only when the engine is idle, so an idle worker does not spin), run one engine step,
send the chunks that are due. A separate heartbeat thread announces the worker with its
metrics. ``request_stop()`` (any thread) begins the drain: no new requests, the heartbeat says
``draining``, running requests finish within ``drain_timeout`` and what is left then gets
``worker_lost``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from engine.config import EngineConfig
from engine.errors import ContextLengthExceededError, InvalidParameterError, RequestNotFoundError
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from workers.heartbeat import Heartbeat
from workers.metrics import WorkerMetrics
from workers.protocol import (CONTEXT_LENGTH_EXCEEDED, INTERNAL_ERROR, INVALID_PARAMETER,
                              WORKER_LOST, Chunk, ErrorInfo, GenerateRequest, Reply, WorkerInfo)
from workers.replies import InFlight
from workers.transport import WorkerTransport

logger = logging.getLogger(__name__)

IDLE_POLL_S = 0.1  # how long an idle loop blocks on the queue before checking aborts and stop
STATS_INTERVAL_S = 0.2
RECENT_ABORT_TTL_S = 120.0  # aborts for requests not read yet are remembered this long
MAX_QUEUE_CREDIT_S = 300.0  # queueing time counted into latencies (bounds clock skew)
_SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams) if f.init)


def engine_config(path: str, engine_settings: dict) -> EngineConfig:
    """Validated config; an unknown setting raises InvalidParameterError naming it."""
    return EngineConfig.from_settings(path, engine_settings)


def sampling_params(params: object) -> SamplingParams:
    if not isinstance(params, dict):
        raise InvalidParameterError("params", "must be an object of sampling parameters")
    unknown = sorted(set(params) - _SAMPLING_FIELDS)
    if unknown:
        raise InvalidParameterError(unknown[0],
                                    f"unknown sampling parameter; known: {sorted(_SAMPLING_FIELDS)}")
    return SamplingParams(**params)


def error_info(exc: Exception) -> ErrorInfo:
    if isinstance(exc, ContextLengthExceededError):
        return ErrorInfo(CONTEXT_LENGTH_EXCEEDED, exc.message, exc.param)
    if isinstance(exc, InvalidParameterError):
        return ErrorInfo(INVALID_PARAMETER, exc.message, exc.param)
    return ErrorInfo(INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")


class EngineWorker:
    """Serves one (model, version, path, settings) over a WorkerTransport until stopped."""

    def __init__(self, model: str, version: str, path: str, engine_settings: dict,
                 transport: WorkerTransport, *, drain_timeout: float = 30.0,
                 on_ready: Callable[[], None] | None = None):
        self.model = model
        self.version = version
        self.config = engine_config(path, dict(engine_settings))
        self.transport = transport
        self.worker_id = transport.worker_id
        self.drain_timeout = drain_timeout
        self.on_ready = on_ready
        self.engine: LLMEngine | None = None
        self.metrics = WorkerMetrics()
        self.ready = threading.Event()  # announced and taking requests
        self.accepting = True
        self.started_at = time.time()
        self._stop_at: float | None = None  # monotonic time of the stop request
        self._stop_now = False
        self._inflight: dict[str, InFlight] = {}
        self._outbox: list[tuple[str, Reply]] = []
        self._recent_aborts: dict[str, float] = {}  # request_id -> monotonic time heard
        self._stats: dict = {}
        self._stats_at = 0.0
        self._last_tick = time.monotonic()
        self._announce_lock = threading.Lock()
        self.heartbeat = Heartbeat(self.announce, lambda: self._last_tick)

    # ----------------------------------------------------------------- control (any thread)
    def request_stop(self, immediate: bool = False) -> None:
        if self._stop_at is None:
            self._stop_at = time.monotonic()
        if immediate:
            self._stop_now = True

    @property
    def is_stopping(self) -> bool:
        return self._stop_at is not None

    def announce(self) -> None:
        """Publish the current WorkerInfo. Serialised, so that a heartbeat built just before
        the drain began cannot land after the draining announcement and undo it."""
        with self._announce_lock:
            self.transport.heartbeat(self.info())

    def info(self) -> WorkerInfo:
        engine = self.engine
        return WorkerInfo(
            worker_id=self.worker_id, model=self.model, version=self.version,
            host=socket.gethostname(), pid=os.getpid(), started_at=self.started_at,
            last_heartbeat=time.time(), max_num_seqs=self.config.max_num_seqs,
            max_model_len=engine.max_model_len if engine else 0, stats=self._stats,
            draining=not self.accepting)

    # ----------------------------------------------------------------- lifecycle
    def run(self) -> int:
        """Load, warm up, announce, serve until stopped; 0 on a clean stop, 1 if loading failed."""
        try:
            self.engine = LLMEngine(self.config)
            self._warm_up()
        except Exception:
            logger.exception("worker %s: could not load %s (%s)", self.worker_id, self.model,
                             self.config.model)
            self.transport.close()
            return 1
        if self.is_stopping:
            self.transport.close()
            return 0
        self._refresh_stats(force=True)
        self.announce()
        self.heartbeat.start()
        self.ready.set()
        logger.info("worker %s serves %s version %s (max_num_seqs %d, max_model_len %d)",
                    self.worker_id, self.model, self.version, self.config.max_num_seqs,
                    self.engine.max_model_len)
        if self.on_ready is not None:
            self.on_ready()
        try:
            self._loop()
        finally:
            self.heartbeat.stop()
            for clean_up in (self._give_up_inflight, self.transport.unregister, self.transport.close):
                try:
                    clean_up()
                except Exception:
                    logger.exception("worker %s: shutdown step %s failed", self.worker_id,
                                     clean_up.__name__)
        logger.info("worker %s stopped", self.worker_id)
        return 0

    def _warm_up(self) -> None:
        """One tiny request through prefill and decode, so the first user does not pay for it."""
        engine = self.engine
        num_prompt = max(1, min(8, engine.max_model_len - 2))
        max_tokens = max(1, min(2, engine.max_model_len - num_prompt))
        engine.add_request(f"warmup-{self.worker_id}", [0] * num_prompt,
                           SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
        engine.reset_counters()  # served traffic only in the metrics (prefix hit rate, token totals)

    def _loop(self) -> None:
        engine = self.engine
        while True:
            self._last_tick = now = time.monotonic()
            if self.is_stopping:
                if self.accepting:
                    self.accepting = False
                    self._refresh_stats(force=True)
                    self.announce()  # clients stop routing here now
                    logger.info("worker %s draining %d requests", self.worker_id, len(self._inflight))
                if (not self._inflight or self._stop_now
                        or now - self._stop_at > self.drain_timeout):
                    return
            self._apply_aborts(self.transport.poll_aborts(), now)
            if engine.has_unfinished_requests():
                self._step()
            self._collect_due_chunks(time.monotonic())
            # Replies out and new requests in, in one round trip; only an idle engine waits.
            room = self.config.max_num_seqs - len(self._inflight) if self.accepting else 0
            idle = not engine.has_unfinished_requests()
            outbox, self._outbox = self._outbox, []
            wait_s = IDLE_POLL_S if idle and room > 0 else 0.0
            self._admit(self.transport.exchange(outbox, room, wait_s))
            if idle and room <= 0 and not self._outbox:
                time.sleep(IDLE_POLL_S)  # draining with nothing to run: do not spin
            self._refresh_stats()

    # ----------------------------------------------------------------- requests
    def _admit(self, requests: list[GenerateRequest]) -> None:
        for req in requests:
            self.metrics.request_claimed()
            self._outbox.append((req.reply_to, Reply("claimed", self.worker_id)))
            if self._recent_aborts.pop(req.request_id, None) is not None:
                self._fail(req.reply_to, req.request_id, None)
                continue
            try:
                self.engine.add_request(req.request_id, req.prompt_token_ids,
                                        sampling_params(req.params), priority=req.priority,
                                        arrival_time=self._arrival_time(req.created_at))
            except Exception as exc:
                if not isinstance(exc, InvalidParameterError):
                    logger.exception("request %s could not be added", req.request_id)
                self._fail(req.reply_to, req.request_id, error_info(exc))
            else:
                self._inflight[req.request_id] = InFlight(req)

    @staticmethod
    def _arrival_time(created_at: object) -> float:
        """created_at (wall clock, set by the client) as engine time, so latency includes queueing."""
        now = time.monotonic()
        if not isinstance(created_at, (int, float)) or isinstance(created_at, bool):
            return now
        return now - min(max(0.0, time.time() - created_at), MAX_QUEUE_CREDIT_S)

    def _fail(self, reply_to: str, request_id: str, error: ErrorInfo | None) -> None:
        """A final chunk for a request that is not (or no longer) in the engine."""
        if error is None:  # aborted before it started
            chunk = Chunk(request_id, "", [], None, True, "abort", 0, 0, 0, None)
            self.metrics.request_finished("abort")
        else:
            chunk = Chunk.failure(request_id, error)
            self.metrics.request_finished("error")
        chunk.version = self.version
        self._outbox.append((reply_to, Reply("chunk", self.worker_id, chunk)))

    def _apply_aborts(self, request_ids: list[str], now: float) -> None:
        for request_id in request_ids:
            if request_id in self._inflight:
                with contextlib.suppress(RequestNotFoundError):  # finished, final chunk pending
                    self.engine.abort_request(request_id)
            else:  # another worker's, or ours but not read from the queue yet
                self._recent_aborts[request_id] = now
        if self._recent_aborts and request_ids:
            cutoff = now - RECENT_ABORT_TTL_S
            self._recent_aborts = {r: t for r, t in self._recent_aborts.items() if t > cutoff}

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception:
            logger.exception("engine step failed; failing the %d running requests", len(self._inflight))
            self._fail_inflight(ErrorInfo(INTERNAL_ERROR,
                                          "the engine failed while running this request"))
            return
        for out in outputs:
            inflight = self._inflight.get(out.request_id)
            if inflight is None:
                continue
            inflight.add(out)
            metrics = out.metrics
            ttft = metrics.time_to_first_token if metrics is not None else None
            if not inflight.ttft_seen and ttft is not None:
                inflight.ttft_seen = True
                self.metrics.first_token(ttft)
            if out.finished:
                e2e = decode = None
                if metrics is not None and metrics.finished_time is not None:
                    e2e = metrics.finished_time - metrics.arrival_time
                    if metrics.first_token_time is not None:
                        decode = metrics.finished_time - metrics.first_token_time
                self.metrics.request_finished(out.finish_reason, e2e_s=e2e, decode_s=decode,
                                              num_output_tokens=out.num_output_tokens)

    def _fail_inflight(self, error: ErrorInfo) -> None:
        """Send ``error`` to every claimed request and drop it from the engine."""
        for request_id, inflight in list(self._inflight.items()):
            with contextlib.suppress(RequestNotFoundError):
                self.engine.abort_request(request_id)
            self._fail(inflight.reply_to, request_id, error)
        self._inflight.clear()
        self.engine.step()  # reports the aborts (already answered) and frees nothing more

    def _give_up_inflight(self) -> None:
        if self._inflight:
            logger.warning("worker %s: %d requests unfinished at shutdown", self.worker_id,
                           len(self._inflight))
            self._fail_inflight(ErrorInfo(WORKER_LOST, "the worker shut down before this request "
                                                       "finished"))
        outbox, self._outbox = self._outbox, []
        self.transport.exchange(outbox, 0, 0.0)

    def _collect_due_chunks(self, now: float) -> None:
        for request_id, inflight in list(self._inflight.items()):
            if inflight.is_due(now):
                chunk = inflight.take_chunk(now)
                chunk.version = self.version
                self._outbox.append((inflight.reply_to, Reply("chunk", self.worker_id, chunk)))
                if inflight.finished:
                    del self._inflight[request_id]

    def _refresh_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._stats_at >= STATS_INTERVAL_S:
            self._stats = self.metrics.snapshot(self.engine.stats(), len(self._inflight))
            self._stats_at = now
