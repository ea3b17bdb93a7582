"""The step-level engine: add requests, step, read per-request deltas; abort at any time.

One request never fails a step for the others. Its parameters are checked at admission
(engine/scheduling/admission.py): ``add_request`` stores nothing unless it succeeds. If a step still raises,
its sequences are re-run in halves until the failing ones are found (engine/runtime/isolation.py); those
alone finish with ``FinishReason.ERROR``, their blocks freed, and the rest keep the tokens the step
computed for them. When nothing of a step can run, a one-token probe tells whether the engine
itself is broken (``is_healthy``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

from engine.scheduling.block_manager import BlockManager
from engine.scheduling.window_blocks import WindowedBlockManager
from engine.config import EngineConfig, draft_settings, max_num_decodes
from engine.text.detokenizer import IncrementalDetokenizer
from engine.distributed.parallel_state import RankLostError
from engine.scheduling.admission import check_length, check_request, check_tenancy, check_token_ids, encode_prompt
from engine.errors import InvalidParameterError, RequestNotFoundError
from engine.lora.request import LoRARequest
from engine.lora.slots import AdapterSlots
from engine.memory.host_memory import release_after_load, release_idle_heap
from engine.runtime.isolation import bisect, probe
from engine.runtime.model_runner import ModelRunner
from engine.models.loader import iter_weights, load_model_config
from engine.models.registry import resolve_model_path
from engine.outputs import REQUEST_FAILED, FinishReason, RequestMetrics, RequestOutput, TokenLogprob
from engine.sampling.parallel_sampling import SampleGroup, check_n, derive_seed, fork, sample_id
from engine.sampling_params import SamplingParams
from engine.scheduling.scheduler import Scheduler, SchedulerOutput
from engine.structured.grammar import GrammarCompiler
from engine.scheduling.sequence import Sequence
from engine.speculative.draft_model import DraftModel
from engine.speculative.drafting import Speculator
from engine.stats import EngineStats, engine_stats
from engine.tenancy import Tenant
from engine.text.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


@dataclass
class _Request:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    metrics: RequestMetrics
    max_tokens: int
    index: int = 0  # which of the request's n samples
    group: SampleGroup | None = None  # n > 1 only

    @property
    def request_id(self) -> str:
        return self.seq.request_id if self.group is None else self.group.request_id


@dataclass
class _Step:
    """A step under way (see LLMEngine.step): its schedule and the runner's generator of it."""
    sched: SchedulerOutput
    parts: Generator
    may_pause: bool = True  # False once its newcomers could not run, or taking arrivals failed
    deferred_aborts: list[str] = dataclasses.field(default_factory=list)  # while it was paused
    ids: set[str] = dataclasses.field(init=False)  # its sequences': their aborts wait for its end

    def __post_init__(self):
        self.ids = {e.seq.request_id for e in self.sched.scheduled}


class LLMEngine:
    def __init__(self, config: EngineConfig, progress: Callable[[int, int], None] | None = None):
        self.config = config
        path = resolve_model_path(config.model)
        self.model_path = path
        self.model_config = load_model_config(path)
        self.tokenizer = load_tokenizer(path)
        model_len = self.model_config.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > model_len:
            raise InvalidParameterError(
                "max_model_len", f"{config.max_model_len} exceeds the model's context length {model_len}")
        self.max_model_len = config.max_model_len or model_len
        eos = set(self.model_config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = sorted(eos)
        self.runner = ModelRunner(config, self.model_config, self.max_model_len,
                                  iter_weights(path, self.model_config), self.eos_token_ids, progress)
        release_after_load()  # the GGUF reader's metadata, the load's freed heap
        if self.runner.window_split is None:
            self.block_manager = BlockManager(self.runner.num_blocks, config.block_size,
                                              config.enable_prefix_caching)
        else:  # sliding-window layers' blocks freed as sequences pass the window
            self.block_manager = WindowedBlockManager(
                self.runner.num_blocks, config.block_size, config.enable_prefix_caching,
                num_window_blocks=self.runner.num_window_blocks,
                window=max(w for w in self.model_config.layer_sliding_windows if w))
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   policy=config.scheduling_policy, fair_share=config.fair_share,
                                   max_tenant_kv_share=config.max_tenant_kv_share,
                                   max_num_decodes=max_num_decodes(config, self.runner.device.type))
        self.scheduler.grammars = GrammarCompiler(self.tokenizer, self.model_config.vocab_size,
                                                  self.eos_token_ids)  # structured outputs
        self.scheduler.lora_slots = AdapterSlots(config.max_loras)  # resident LoRA adapters
        self.scheduler.speculator = self._speculator()
        self._requests: dict[str, _Request] = {}
        self._pending: list[RequestOutput] = []  # aborts, reported by the next step()
        # A caller that takes requests while a step runs (the worker: what its transport holds now)
        # sets ``arrivals``; a long fused step then pauses between layers for a newcomer (see step).
        self.arrivals: Callable[[], None] | None = None
        self._running: _Step | None = None  # the step under way, paused or not
        self._paused: _Step | None = None  # the step a newcomer paused
        self.num_paused_steps = 0  # steps paused for a newcomer's step, all time
        self._groups: dict[str, SampleGroup] = {}  # n > 1 requests, by request id
        self._forking: dict[str, SampleGroup] = {}  # those whose prompt is not computed yet
        # False once a minimal request failed to run on its own after a failed step; True again
        # after the next step (or check_health) that runs. health_error says what failed.
        self.is_healthy = True
        self.health_error: str | None = None
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0

    def _speculator(self) -> Speculator | None:
        """Prompt-lookup drafting (engine/speculative/) unless off, or where its rows cannot be
        verified: tensor-parallel ranks; and only where the runner is batch-invariant. A draft's
        rows are a chunk of the sequence's own tokens: elsewhere (the torch path's attention over a
        chunk rounds otherwise than over one row) verified drafts would change a greedy answer's
        bits, and near a tie its tokens. Sliding-window block tables draft too: a step gives back
        only the window blocks wholly before its first token's window, and a rejection never takes
        back that first token."""
        if not self.config.speculative_tokens:
            return None
        if not self.runner.batch_invariant:
            logger.info("speculative decoding off: the runner is not batch-invariant here, and drafts "
                        "verified as a chunk could change a greedy answer (see batch_invariant)")
            return None
        if self.config.tensor_parallel_size > 1:
            logger.info("speculative decoding off: not built for tensor parallel ranks")
            return None
        return Speculator(num_tokens=self.config.speculative_tokens,
                          max_decodes=self.config.speculative_max_decodes,
                          proposer=self._draft_model() if self.config.speculative_model else None)

    def _draft_model(self) -> DraftModel:
        """``speculative_model`` loaded in an engine of its own with this engine's settings but
        those config.draft_settings gives it."""
        config = self.config
        try:
            draft = LLMEngine(dataclasses.replace(config, **draft_settings(config, self.max_model_len)))
        except Exception as exc:
            raise InvalidParameterError(
                "speculative_model", f"the draft model {config.speculative_model!r} did not load: {exc}") from exc
        logger.info("speculative decoding: %s drafts, up to %d tokens a step (%d KV blocks of its own)",
                    config.speculative_model, config.speculative_tokens, draft.runner.num_blocks)
        return DraftModel(draft, target_tokenizer=self.tokenizer, target_vocab_size=self.model_config.vocab_size)

    # ----------------------------------------------------------------- requests
    def add_request(self, request_id: str, prompt: str | list[int],
                    params: SamplingParams | None = None, *, priority: int = 0,
                    arrival_time: float | None = None, n: int = 1, tenant: Tenant | None = None,
                    shared_prefix_len: int = 0, adapter: LoRARequest | None = None) -> int:
        """Queue a request; returns its prompt length. Raises if it can never be served.

        ``n`` > 1 asks for n samples of the same prompt (engine/sampling/parallel_sampling.py): their
        outputs carry ``index``; each sample's end sets its ``finish_reason``, and ``finished``
        marks the request's last output. Atomic: when it raises, nothing of the request remains.

        ``tenant`` (the engine's single tenant when None) scopes the request's prefix-cache blocks:
        it never hits another tenant's, except the full blocks inside its first
        ``shared_prefix_len`` prompt tokens, a prefix the caller vouches is public (engine/tenancy.py);
        and the scheduler shares the engine between tenants by their weight (fair_share.py).

        ``adapter`` runs the request under a LoRA adapter (engine/lora/), checked against the
        base here, loaded when it is first scheduled; None: the base model.
        """
        params = check_request(request_id, params, priority)
        n = check_n(n)
        ids = [sample_id(request_id, i) for i in range(n)]
        if any(i in self._requests or i in self._groups for i in ids):
            raise InvalidParameterError("request_id", f"{request_id!r} is already in use")
        prompt_ids = self.encode_prompt(prompt)
        tenant = check_tenancy(tenant, shared_prefix_len, len(prompt_ids))
        check_token_ids(params, self.model_config.vocab_size)
        if adapter is not None:
            self.runner.lora.check(adapter)
        max_tokens = check_length(len(prompt_ids), params.max_tokens, max_model_len=self.max_model_len,
                                  block_size=self.config.block_size, num_blocks=self.block_manager.num_blocks)
        group = SampleGroup(request_id, num_live=n) if n > 1 else None
        arrival_time = time.monotonic() if arrival_time is None else arrival_time
        try:
            for i, sid in enumerate(ids):
                seq = Sequence(sid, prompt_ids, params, priority=priority, arrival_time=arrival_time,
                               tenant=tenant, shared_prefix_len=shared_prefix_len, adapter=adapter)
                seq.max_num_tokens = min(len(prompt_ids) + max_tokens, self.max_model_len)
                detok = IncrementalDetokenizer(
                    self.tokenizer, skip_special_tokens=params.skip_special_tokens,
                    stop=params.stop_strings, include_stop_str_in_output=params.include_stop_str_in_output)
                self.runner.add_request(sid, derive_seed(params.seed, i))
                req = _Request(seq, detok, RequestMetrics(arrival_time), max_tokens, i, group)
                self._requests[sid] = req
                if group is not None:
                    group.samples.append(req)
            if group is not None:
                group.unforked = group.samples[1:]
                self._groups[request_id] = self._forking[request_id] = group
            self.scheduler.add(self._requests[request_id].seq)
        except BaseException:
            for sid in ids:
                self._requests.pop(sid, None)
                self.runner.remove_request(sid)
            self._groups.pop(request_id, None)
            self._forking.pop(request_id, None)
            raise
        return len(prompt_ids)

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.model_config.vocab_size)

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free its blocks; the next step() reports it as aborted. A
        request in a step a newcomer paused stops when that step ends (its blocks are being
        written), reported by the step() after."""
        group = self._groups.get(request_id)
        paused = self._paused
        if paused is not None and self.has_request(request_id) and (
                {r.seq.request_id for r in group.samples} if group is not None else {request_id}
        ) & paused.ids:
            paused.deferred_aborts.append(request_id)
            return
        if group is not None:
            live = [r for r in group.samples if r.seq.request_id in self._requests]
            self._pending.extend(self._finish(r, FinishReason.ABORT, None, [], None) for r in live)
            return
        req = self._requests.get(request_id)
        if req is None or req.group is not None:  # a sample's internal id is not a request's
            raise RequestNotFoundError(request_id)
        self._pending.append(self._finish(req, FinishReason.ABORT, None, [], None))

    def has_request(self, request_id: str) -> bool:
        return request_id in self._groups or (request_id in self._requests
                                              and self._requests[request_id].group is None)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests) or bool(self._pending)

    @property
    def num_unfinished_requests(self) -> int:
        """Unfinished sequences: an n > 1 request counts n until its samples end."""
        return len(self._requests)

    # ----------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        """Run one step and return what it produced (and the aborts since the last call).

        With ``arrivals`` set, a step of many rows on the fused CPU path asks between parts of its
        layers whether a newcomer has arrived (a tenant with nothing running, whose request the
        scheduler would give a short step of its own: scheduler.py). If one has, the step pauses
        there, the newcomer's step runs whole, and this call returns its tokens; the next call
        finishes the paused step first. The newcomer waits for a part of a step, not a whole one
        (another user's engine time to first token under a 200-stream flood of SmolLM2 on 2
        cores: 11-17 ms, as idle, against 34-59 ms; docs/performance.md), and the paused step
        loses nothing: its parts give the same bits as the whole."""
        outputs, self._pending = self._pending, []
        if self._paused is not None:
            self._go_on(self._paused, outputs)
            return outputs
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return outputs
        self._note_scheduled(sched)
        pause = self._newcomer_waits if self.arrivals is not None else None
        self._go_on(_Step(sched, self.runner.parts(sched.scheduled, pause)), outputs)
        return outputs

    def _go_on(self, step: _Step, outputs: list[RequestOutput]) -> None:
        """Run ``step`` on from where it is. Where it pauses and the newcomers' own step runs,
        return: the next step() goes on with it. Where none of theirs could run (no seat or
        blocks outside the paused step), go on at once, pausing no more."""
        self._running = step
        while not self._run(step.sched, step.parts, outputs):
            self._paused = step
            if self._newcomers_step(step.sched, outputs):
                self.num_paused_steps += 1
                return
            step.may_pause = False
        self._running = self._paused = None
        for request_id in step.deferred_aborts:
            with contextlib.suppress(RequestNotFoundError):  # it finished meanwhile
                self.abort_request(request_id)

    def _newcomer_waits(self) -> bool:
        """Between two parts of a step: take what has arrived; is there a newcomer to run first?"""
        step = self._running
        if step is None or not step.may_pause:
            return False
        try:
            self.arrivals()
        except Exception:  # the caller's fault: the step goes on, and pauses no more
            logger.exception("taking arrivals between the parts of a step failed")
            step.may_pause = False
            return False
        return self.scheduler.has_newcomers()

    def _newcomers_step(self, paused: SchedulerOutput, outputs: list[RequestOutput]) -> bool:
        """The newcomers' own step while ``paused`` waits (none of its sequences is touched);
        False when none of them could be scheduled."""
        sched = self.scheduler.schedule_newcomers(paused)
        if sched.is_empty:
            return False
        self._note_scheduled(sched)
        self._run(sched, self.runner.parts(sched.scheduled), outputs)
        return True

    def _run(self, sched: SchedulerOutput, parts: Generator, outputs: list[RequestOutput]) -> bool:
        """Run ``sched``'s step (``parts``: the runner's) to its end or its next pause; at its end
        the tokens go into ``outputs``. False: it paused."""
        try:
            next(parts)
        except StopIteration as done:
            sampled = done.value
            if not self.is_healthy:
                self._set_healthy()
        except RankLostError:  # tensor parallel: no step can run any more; the caller decides
            raise
        except Exception:
            logger.exception("a step of %d sequences failed; looking for the request(s) at fault",
                             len(sched.scheduled))
            sampled = self._isolate_failures(sched, outputs)
        else:
            return False
        self._finish_step(sched, sampled, outputs)
        return True

    def _note_scheduled(self, sched: SchedulerOutput) -> None:
        now = time.monotonic()
        for entry in sched.scheduled:
            metrics = self._requests[entry.seq.request_id].metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
            if entry.start < entry.seq.num_prompt_tokens:
                self.num_prompt_tokens += min(entry.num_new_tokens,
                                              entry.seq.num_prompt_tokens - entry.start)

    def _finish_step(self, sched: SchedulerOutput, sampled: list, outputs: list[RequestOutput]) -> None:
        self.scheduler.update_after_step(sched)
        if self._forking:
            self._fork_computed_prompts(sampled)
        now = time.monotonic()
        for s in sampled:
            req = self._requests.get(s.entry.seq.request_id)
            if req is None:  # a sample failed, and its group with it
                continue
            try:
                outputs.append(self._process_tokens(req, s.token_ids, s.logprobs, now))
            except Exception:
                logger.exception("request %s failed after its token was sampled; failing it alone",
                                 req.seq.request_id)
                outputs.append(self._fail(req))
        if not self.has_unfinished_requests():  # a burst ended: its freed heap back (~ms)
            release_idle_heap()

    def _process_tokens(self, req: _Request, token_ids: list[int], logprobs: list[TokenLogprob | None],
                        now: float) -> RequestOutput:
        """Append a step's tokens (more than one after a verified draft) to ``req`` in order; the
        first that ends it ends it there, and the tokens after it are dropped."""
        if req.metrics.first_token_time is None:
            req.metrics.first_token_time = now
        wanted = logprobs[0] is not None
        for i, token_id in enumerate(token_ids):
            req.seq.append_token(token_id)
            self.num_generation_tokens += 1
            stop_str = req.detokenizer.add_tokens([token_id])
            reason, stop_reason = self._check_stop(req, token_id, stop_str)
            if reason is not None:
                return self._finish(req, reason, stop_reason, token_ids[:i + 1],
                                    logprobs[:i + 1] if wanted else None)
        return self._output(req, req.detokenizer.get_delta(finished=False), token_ids,
                            logprobs if wanted else None, None, None)

    def _fork_computed_prompts(self, sampled) -> None:
        """Hand samples 1..n-1 to the scheduler once sample 0 has computed the prompt."""
        for s in sampled:
            seq = s.entry.seq
            group = self._forking.get(seq.request_id)
            if group is None or seq.num_output_tokens:
                continue
            del self._forking[seq.request_id]
            for child in group.unforked:
                fork(seq, child.seq, self.block_manager)
                self.scheduler.add(child.seq)
            group.unforked = []

    # ----------------------------------------------------------------- isolation
    def _isolate_failures(self, sched, outputs: list[RequestOutput]) -> list:
        """After ``sched``'s step raised: fail the sequences that fail on their own, keep the
        tokens of the others (``sched.scheduled`` is narrowed to those) and return them."""
        entries = sched.scheduled
        sampled, failed = bisect(self.runner, entries) if len(entries) > 1 else ([], list(entries))
        failed_ids = {id(e) for e in failed}
        sched.scheduled = [e for e in entries if id(e) not in failed_ids]
        for entry in failed:
            if (req := self._requests.get(entry.seq.request_id)) is not None:  # not failed with its group
                outputs.append(self._fail(req))
        if sched.scheduled:
            self._set_healthy()
        else:  # nothing of the step ran: is it these requests, or the engine?
            self.check_health()
        return sampled

    def _fail(self, req: _Request) -> RequestOutput:
        """Finish ``req`` with FinishReason.ERROR and free what it holds; touches nothing of its
        state that may be what failed (the detokenizer, the sampler)."""
        if req.group is not None:  # the request fails as a whole: its other samples stop
            for other in req.group.samples:
                if other is not req and other.seq.request_id in self._requests:
                    self._release(other)
            req.group.num_live = 1
        self._release(req)
        req.metrics.finished_time = time.monotonic()
        out = self._output(req, "", [], None, FinishReason.ERROR, None)
        out.error = REQUEST_FAILED
        return out

    def _release(self, req: _Request) -> None:
        """Take one sample out of the scheduler, the runner and the engine's tables."""
        group = req.group
        if group is not None and req in group.unforked:  # never reached the scheduler
            group.unforked.remove(req)
        else:
            self.scheduler.remove(req.seq)
        self.runner.remove_request(req.seq.request_id)
        del self._requests[req.seq.request_id]

    def check_health(self) -> bool:
        """Probe the engine with a one-token request (engine/runtime/isolation.py); updates ``is_healthy``.
        Call it from the thread that steps the engine."""
        tried, error = probe(self.runner, self.block_manager)
        if error is not None:
            self.is_healthy, self.health_error = False, error
        elif tried:
            self._set_healthy()
        return self.is_healthy

    def _set_healthy(self) -> None:
        if not self.is_healthy:
            logger.warning("the engine runs steps again: marking it healthy")
            self.is_healthy, self.health_error = True, None

    def _check_stop(self, req: _Request, token_id: int, stop_str: str | None):
        seq, params = req.seq, req.seq.params
        if seq.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token_id in self.eos_token_ids:
                return FinishReason.STOP, None
            if token_id in params.stop_token_ids:
                return FinishReason.STOP, token_id
            if stop_str is not None:
                return FinishReason.STOP, stop_str
        if seq.num_output_tokens >= req.max_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH, None
        return None, None

    def _finish(self, req: _Request, reason: str, stop_reason, token_ids: list[int],
                logprobs: list[TokenLogprob] | None) -> RequestOutput:
        self._release(req)
        req.metrics.finished_time = time.monotonic()
        delta = req.detokenizer.get_delta(finished=True)
        if reason == FinishReason.LENGTH and req.detokenizer.matched_stop is not None:
            # A stop string completed only by text held back until the end (a split character).
            reason, stop_reason = FinishReason.STOP, req.detokenizer.matched_stop
        return self._output(req, delta, token_ids, logprobs, reason, stop_reason)

    def _output(self, req: _Request, text: str, token_ids: list[int], logprobs, reason, stop_reason):
        seq, finished = req.seq, reason is not None
        if finished and req.group is not None:
            finished = req.group.sample_finished()
            if finished:
                self._groups.pop(req.group.request_id, None)
                self._forking.pop(req.group.request_id, None)
        return RequestOutput(
            request_id=req.request_id, text_delta=text, token_ids_delta=token_ids,
            finished=finished, finish_reason=reason, index=req.index,
            num_prompt_tokens=seq.num_prompt_tokens, num_output_tokens=seq.num_output_tokens,
            num_cached_tokens=seq.num_cached_tokens, logprobs_delta=logprobs,
            stop_reason=stop_reason, metrics=dataclasses.replace(req.metrics))

    # ----------------------------------------------------------------- introspection
    def reset_counters(self) -> None:
        """Zero the cumulative counters (tokens, prefix-cache queries and hits, preemptions), so a
        warm-up request does not show in a server's metrics. Gauges and the cache itself stay."""
        self.block_manager.num_prefix_queried_tokens = self.block_manager.num_prefix_hit_tokens = 0
        self.scheduler.num_preemptions = 0
        if (spec := self.scheduler.speculator) is not None:
            spec.num_drafts = spec.num_draft_tokens = spec.num_accepted_tokens = 0
        self.num_prompt_tokens = self.num_generation_tokens = self.num_paused_steps = 0

    def stats(self) -> EngineStats:
        return engine_stats(self.scheduler, self.block_manager, num_prompt_tokens=self.num_prompt_tokens,
                            num_generation_tokens=self.num_generation_tokens,
                            num_paused_steps=self.num_paused_steps)
