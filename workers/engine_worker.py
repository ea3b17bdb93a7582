"""``EngineWorker``: one model version served by an engine loop; requests arrive from a transport.

One thread owns the engine (workers/serving.py decides which workers run and when they stop).

Each iteration: apply aborts, admit new requests while there is room (blocking briefly on the
queue only when the engine is idle, so an idle worker does not spin), run one engine step,
send the chunks that are due. A separate heartbeat thread announces the worker with its
metrics. ``request_stop()`` (any thread) begins the drain: no new requests, the heartbeat says
``draining``, requests the engine has not started yet go back to the queue for another worker,
running requests finish within ``drain_timeout`` and what is left then gets ``worker_lost``.

Room, with the engine's fair share across tenants (the default): up to ``max_num_seqs`` requests
beyond what the engine can start now, so that a backlog waits in the engine, whose scheduler
orders it by tenant (engine/scheduling/fair_share.py), rather than in the shared queue, which is
first come, first served: there one tenant's flood would keep every other tenant's request behind
it. Without fair share, room is what the engine can start now: the worker takes nothing while its
engine still has requests waiting (KV cache full, or preempted ones), so the excess waits in the
shared queue, where another worker can take it and the admission bound counts it.

Faults: a request the engine failed alone (FinishReason.ERROR) gets an internal_error chunk; an
engine that cannot run a minimal request is announced unhealthy, takes nothing and is probed
every HEALTH_PROBE_INTERVAL_S until it recovers. A transport outage (Redis restarting) does not
end the loop: the engine keeps stepping, replies wait in the outbox, and the transport is
retried with backoff, then reconnected (group, subscription) and the worker announced again.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from engine.config import SETTINGS, EngineConfig
from engine.distributed.parallel_state import RankLostError
from engine.errors import InvalidParameterError, RequestNotFoundError
from engine.llm_engine import LLMEngine
from engine.outputs import REQUEST_FAILED, FinishReason
from engine.lora.request import LoRARequest
from engine.sampling_params import SamplingParams
from engine.tenancy import Tenant
from workers.heartbeat import Heartbeat
from workers.metrics import WorkerMetrics
from workers.outage import Outage
from workers.protocol import (INTERNAL_ERROR, TASK_GENERATE, WORKER_LOST, Chunk, ErrorInfo,
                              GenerateRequest, Reply, WorkerInfo)
from workers.replies import InFlight
from workers.requests import arrival_time, error_info, sampling_params
from workers.transport import TransportUnreachable, WorkerTransport

logger = logging.getLogger(__name__)

IDLE_POLL_S = 0.1  # how long an idle loop blocks on the queue before checking aborts and stop
STATS_INTERVAL_S = 0.2
RECENT_ABORT_TTL_S = 120.0  # aborts for requests not read yet are remembered this long
HEALTH_PROBE_INTERVAL_S = 5.0  # an unhealthy engine is probed (check_health) this often
# With fair share, requests in flight per sequence the engine can run: a backlog as large as the
# batch waits in the engine, ordered by tenant, before any waits in the shared FIFO queue.
CLAIM_AHEAD_PER_SEQ = 2


def freeze_heap(worker_id: str) -> None:
    """What the process holds once its model is loaded (torch, the model, Django, the web app) lives
    as long as it does: gc.freeze() takes it out of the garbage collector's scans. A full collection
    of the web process with SmolLM2 loaded scanned it all in ~125 ms with the GIL held, a pause of
    every stream and, in embedded mode, of the web thread (bench/fair_share.py's p95 under a flood).
    Objects made later are collected as before; at exit they are all given back to it (frozen,
    Triton's bindings reported them leaked)."""
    gc.collect()
    frozen = gc.get_freeze_count()
    gc.freeze()
    atexit.register(gc.unfreeze)
    logger.info("worker %s: %d objects of the loaded process out of the garbage collector's scans",
                worker_id, gc.get_freeze_count() - frozen)


class EngineWorker:
    """Serves one (model, version, path, settings) over a WorkerTransport until stopped."""

    def __init__(self, model: str, version: str, path: str, engine_settings: dict,
                 transport: WorkerTransport, *, drain_timeout: float = 30.0,
                 on_ready: Callable[[], None] | None = None):
        self.model = model
        self.version = version
        self.config = EngineConfig.from_settings(path, dict(engine_settings))
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
        self._next_probe = 0.0  # monotonic time of the next health probe while unhealthy
        self._was_healthy = True
        self._outage = Outage()  # of the transport (workers/outage.py)
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
            max_model_len=engine.max_model_len if engine else 0,
            # the effective engine settings (defaults, pagoda.yaml, the version's, the environment's)
            stats={**self._stats, "engine_settings": {s.name: getattr(self.config, s.name) for s in SETTINGS}},
            draining=not self.accepting, healthy=engine.is_healthy if engine else True)

    # ----------------------------------------------------------------- lifecycle
    def run(self) -> int:
        """Load, warm up, announce, serve until stopped; 0 on a clean stop, 1 if loading failed."""
        try:
            self.engine = self._load_engine()
            self._warm_up()
            if self.config.fair_share:  # a long step may pause for another tenant's newcomer
                self.engine.arrivals = self._take_arrivals
            freeze_heap(self.worker_id)
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
            for clean_up in (self._give_up_inflight, self.transport.unregister, self.transport.close,
                             self._shutdown_engine):  # tensor parallel: stop the other ranks
                try:
                    clean_up()
                except Exception:
                    logger.exception("worker %s: shutdown step %s failed", self.worker_id,
                                     clean_up.__name__)
        logger.info("worker %s stopped", self.worker_id)
        return 0

    def _load_engine(self) -> LLMEngine:
        return LLMEngine(self.config)

    def _shutdown_engine(self) -> None:
        self.engine.runner.shutdown()

    def _add_to_engine(self, req: GenerateRequest) -> None:
        if req.task != TASK_GENERATE:  # the web side checks first; a stale registry may not
            raise InvalidParameterError("model", f"{self.model!r} is a generation model; it does "
                                                 f"not serve embeddings")
        self.engine.add_request(req.request_id, req.prompt_token_ids, sampling_params(req.params),
                                priority=req.priority, arrival_time=arrival_time(req.created_at),
                                n=req.n, tenant=Tenant(req.tenant, req.tenant_weight),
                                shared_prefix_len=req.shared_prefix_len,
                                adapter=LoRARequest(req.adapter, req.adapter_path) if req.adapter else None)

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
                    logger.info("worker %s draining %d requests", self.worker_id, len(self._inflight))
                    self._hand_back_unstarted()
                    self._refresh_stats(force=True)
                    self._announce_now()  # clients stop routing here now
                if (not self._inflight or self._stop_now
                        or now - self._stop_at > self.drain_timeout):
                    return
            self._watch_health(now)
            if self._transport_up(now):
                try:
                    self._apply_aborts(self.transport.poll_aborts(), now)
                except TransportUnreachable as exc:
                    self._transport_lost(exc, now)
            if engine.has_unfinished_requests():
                self._step()
            self._collect_due_chunks(time.monotonic())
            room = self._room()
            idle = not engine.has_unfinished_requests()
            if self._transport_up(now):
                # Replies out and new requests in, in one round trip; only an idle engine waits.
                outbox, self._outbox = self._outbox, []
                wait_s = IDLE_POLL_S if idle and room > 0 else 0.0
                try:
                    self._admit(self.transport.exchange(outbox, room, wait_s))
                except TransportUnreachable as exc:
                    self._outbox = outbox + self._outbox  # sent again once it is back
                    self._transport_lost(exc, now)
                if idle and room <= 0 and not self._outbox:
                    time.sleep(IDLE_POLL_S)  # draining with nothing to run: do not spin
            elif idle:
                time.sleep(min(IDLE_POLL_S, max(0.0, self._outage.retry_at - time.monotonic())))
            self._refresh_stats()

    def _take_arrivals(self) -> None:
        """Called by the engine between parts of a long step (LLMEngine.step): the requests that
        have arrived meanwhile join the engine now, so that another tenant's newcomer can run
        before the step's end. Only when the transport knows of some without a round trip
        (``arrived``: Redis publishes each submission); replies wait for the loop's exchange."""
        room = self._room()
        if room <= 0 or self._outage.active:  # no reconnecting in the middle of a step
            return
        now = time.monotonic()
        try:
            if self.transport.arrived():
                self._admit(self.transport.exchange([], room, 0.0))
        except TransportUnreachable as exc:
            self._transport_lost(exc, now)

    def _room(self) -> int:
        """How many requests to take now: none while draining or unhealthy; with fair share up to
        CLAIM_AHEAD_PER_SEQ x max_num_seqs in flight (see the module's docstring); without, none
        while the engine still has requests it could not start (they would wait here instead of
        elsewhere), else what it can start."""
        engine = self.engine
        if not self.accepting or not engine.is_healthy:
            return 0
        if self.config.fair_share:
            return max(0, CLAIM_AHEAD_PER_SEQ * self.config.max_num_seqs - len(self._inflight))
        if engine.stats().num_waiting > 0:
            return 0
        return max(0, self.config.max_num_seqs - len(self._inflight))

    def _announce_now(self) -> None:
        try:
            self.announce()
        except TransportUnreachable as exc:  # the heartbeat says it once the transport is back
            logger.warning("worker %s: could not announce itself: %s", self.worker_id, exc)

    # ----------------------------------------------------------------- faults
    def _watch_health(self, now: float) -> None:
        """An unhealthy engine takes nothing (see _room) and is probed now and then."""
        engine = self.engine
        if not engine.is_healthy and now >= self._next_probe:
            self._next_probe = now + HEALTH_PROBE_INTERVAL_S
            engine.check_health()
        if engine.is_healthy != self._was_healthy:
            self._was_healthy = engine.is_healthy
            if engine.is_healthy:
                logger.warning("worker %s: the engine recovered; taking requests again",
                               self.worker_id)
            else:
                logger.error("worker %s: the engine is unhealthy (%s); taking no requests",
                             self.worker_id, engine.health_error)
            self._refresh_stats(force=True)
            self._announce_now()

    def _transport_up(self, now: float) -> bool:
        """False during an outage, between retries; a due retry reconnects first."""
        if not self._outage.active:
            return True
        if now < self._outage.retry_at:
            return False
        try:
            self.transport.reconnect()
        except TransportUnreachable as exc:
            self._transport_lost(exc, now)
            return False
        logger.warning("worker %s: the transport is back after %.1f s; %d requests kept",
                       self.worker_id, self._outage.over(now), len(self._inflight))
        self._announce_now()
        return True

    def _transport_lost(self, exc: Exception, now: float) -> None:
        if self._outage.failed(now):
            logger.warning("worker %s: the transport is unreachable (%s); retrying, %d requests "
                           "kept", self.worker_id, exc, len(self._inflight))

    def _hand_back_unstarted(self) -> None:
        """Draining: requests the engine has produced nothing for yet go back to the queue for
        another worker, so that the drain timeout is spent on running requests only."""
        unstarted = [(rid, f) for rid, f in self._inflight.items() if f.latest is None]
        if not unstarted:
            return
        released = [(f.reply_to, Reply("released", self.worker_id)) for _rid, f in unstarted]
        outbox, self._outbox = self._outbox + released, []
        try:
            # The release before the requeue: the next claim must arrive after it.
            self.transport.exchange(outbox, 0, 0.0)
            self.transport.requeue([f.request for _rid, f in unstarted])
        except TransportUnreachable as exc:  # they stay here and run, or meet the drain timeout
            logger.warning("worker %s: could not hand back %d requests: %s", self.worker_id,
                           len(unstarted), exc)
            self._outbox = [o for o in outbox if o[1].kind != "released"]
            return
        for request_id, _inflight in unstarted:
            with contextlib.suppress(RequestNotFoundError):
                self.engine.abort_request(request_id)  # its abort output is ignored: not ours now
            del self._inflight[request_id]
        logger.info("worker %s handed %d requests it had not started back to the queue",
                    self.worker_id, len(unstarted))

    # ----------------------------------------------------------------- requests
    def _admit(self, requests: list[GenerateRequest]) -> None:
        for req in requests:
            self.metrics.request_claimed()
            self._outbox.append((req.reply_to, Reply("claimed", self.worker_id)))
            if self._recent_aborts.pop(req.request_id, None) is not None:
                self._fail(req.reply_to, req.request_id, None)
                continue
            try:
                self._add_to_engine(req)
            except Exception as exc:
                if not isinstance(exc, InvalidParameterError):  # a refusal is not our failure
                    logger.exception("request %s could not be added", req.request_id)
                self._fail(req.reply_to, req.request_id, error_info(exc))
            else:
                self._inflight[req.request_id] = InFlight(req)
                logger.info("request %s claimed by worker %s: %d prompt tokens", req.request_id,
                            self.worker_id, len(req.prompt_token_ids), extra={"request_id": req.request_id})

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
        except RankLostError as exc:  # tensor parallel: the worker is gone to the rest of Pagoda
            logger.error("worker %s: %s; failing its requests with worker_lost and stopping",
                         self.worker_id, exc)
            self.request_stop(immediate=True)
            self._fail_inflight(ErrorInfo(WORKER_LOST, str(exc)))
            return
        except Exception:
            logger.exception("engine step failed; failing the %d running requests", len(self._inflight))
            self._fail_inflight(ErrorInfo(INTERNAL_ERROR, REQUEST_FAILED))
            return
        for out in outputs:
            inflight = self._inflight.get(out.request_id)
            if inflight is None:
                continue
            if out.finish_reason == FinishReason.ERROR:  # failed alone; the others go on
                del self._inflight[out.request_id]
                self._fail(inflight.reply_to, out.request_id,
                           ErrorInfo(INTERNAL_ERROR, out.error or REQUEST_FAILED))
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
                # Time per output token is one sample's (n > 1 samples decode side by side);
                # the token totals are the engine's own counter, every sample's.
                self.metrics.request_finished(out.finish_reason, e2e_s=e2e, decode_s=decode,
                                              num_output_tokens=out.num_output_tokens)
                logger.info("request %s finished (%s): %d output tokens in %s s", out.request_id,
                            out.finish_reason, inflight.num_output_tokens,
                            "?" if e2e is None else f"{e2e:.3f}", extra={"request_id": out.request_id})

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
