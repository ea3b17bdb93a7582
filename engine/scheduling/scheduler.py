"""Continuous batching: which sequences run in the next step, and how many tokens each.

Every step mixes decode tokens (one per running sequence) with chunks of prompts
under one token budget (``max_num_batched_tokens``). Decodes are served first so
a long prompt never stalls the sequences already streaming. When the pool runs
out of blocks, the running sequence that sorts last under the policy (the newest
under FCFS, the lowest priority under "priority") is preempted: its blocks are
freed and it is recomputed later, its prefix usually coming back from the cache.

Across tenants (Sequence.tenant) the queue is a weighted fair one (fair_share.py): the next
sequence admitted is the tenant's least served per weight, the one preempted the most over its
share; with one tenant that is the policy's order above, unchanged. A tenant arriving while
another's sequences run (nothing of its own running, a new request waiting) gets a step of its
own: its prompt's first chunk without the running decodes, so that its first token comes after
that short step, not after a step of the whole batch (on a CPU, 128 decodes take 100-250 ms,
a short prompt alone 10-20 ms). The decodes lose that one short step per such arrival.

A decode may feed a speculative draft after its token (``speculator``, engine/speculative/): its
rows are verified in the same step, and only the accepted ones count as computed afterwards.

A sequence under a LoRA adapter is admitted only when its adapter is resident or can be made so
(``lora_slots``, engine/lora/slots.py: a bounded LRU that never evicts a running sequence's
adapter); otherwise it waits and the sequences behind it go ahead.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field

from engine.scheduling.block_manager import BlockManager
from engine.scheduling.fair_share import FairShare
from engine.scheduling.sequence import Sequence, SequenceStatus

IDLE_COMPILE_WAIT_S = 0.005  # a step with nothing to run but a grammar compiling waits this long for it


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int  # the draft's tokens included
    start: int  # index of the first token fed this step (= num_computed_tokens before it)
    # speculative draft tokens fed after the sequence's last token (engine/speculative/), every
    # row then sampled; num_rejected: how many of them the model did not produce (set after the step)
    draft: list[int] = field(default_factory=list)
    num_rejected: int = 0

    @property
    def is_sampling(self) -> bool:
        """Whether this step reaches the end of the sequence's tokens and so samples the next one."""
        return self.start + self.num_new_tokens == self.seq.num_tokens + len(self.draft)

    @property
    def input_token_ids(self) -> list[int]:
        """The ids fed this step: the sequence's tokens from ``start``, then the draft."""
        ids = self.seq.token_ids[self.start:self.start + self.num_new_tokens - len(self.draft)]
        ids += self.draft  # onto the slice's own copy
        return ids


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class _Step:
    """One schedule() call in progress: its output, its entries by id(seq), the budget left."""

    out: SchedulerOutput
    budget: int
    entries: dict[int, ScheduledSequence] = field(default_factory=dict)  # in scheduling order


class Scheduler:
    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int,
                 max_num_batched_tokens: int, policy: str = "fcfs", fair_share: bool = True,
                 max_tenant_kv_share: float = 1.0, max_num_decodes: int | None = None):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_decodes = max_num_decodes  # None: every running sequence decodes each step
        self.num_steps = 0
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        # Both lists stay sorted by Sequence.sort_key: waiting[0] is admitted next,
        # running[-1] is preempted first.
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.fair = FairShare(num_blocks=block_manager.num_blocks, max_tenant_kv_share=max_tenant_kv_share,
                              is_enabled=fair_share)
        # engine/structured/grammar.py's GrammarCompiler, set by the engine: a constrained
        # sequence's grammar is compiled off this thread from add(), and it waits until ready
        self.grammars = None
        self.lora_slots = None  # engine/lora/slots.py's AdapterSlots, set by an engine serving adapters
        self.speculator = None  # engine/speculative/drafting.py's Speculator, set by an engine that drafts

    # ----------------------------------------------------------------- queue
    def add(self, seq: Sequence) -> None:
        if seq.params.grammar is not None and seq.grammar is None:
            seq.grammar = self.grammars.submit(seq.params.grammar)
        seq.status = SequenceStatus.WAITING
        self.fair.enqueue(seq)
        self._insort(self.waiting, seq)

    def remove(self, seq: Sequence) -> None:
        """Take ``seq`` out of the queues and release its blocks (finish or abort)."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        if seq.status is not SequenceStatus.FINISHED:
            self.fair.stop(seq, is_finished=True)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)

    # ----------------------------------------------------------------- step
    def schedule(self) -> SchedulerOutput:
        self.num_steps += 1
        step = _Step(SchedulerOutput(), self.max_num_batched_tokens)
        newcomers = self.fair.newcomers(self.waiting, self.running, self.policy)
        if newcomers:  # their step alone (see the module's docstring)
            self._admit_waiting(step, only=newcomers)
            if step.entries:
                step.out.scheduled = list(step.entries.values())
                return step.out
        self._schedule_running(step)
        self._admit_waiting(step)
        step.out.scheduled = list(step.entries.values())
        return step.out

    def has_newcomers(self) -> bool:
        """Whether a tenant waits that schedule() would give a step of its own now."""
        return bool(self.fair.newcomers(self.waiting, self.running, self.policy))

    def schedule_newcomers(self, paused: SchedulerOutput) -> SchedulerOutput:
        """The newcomers' own step, as schedule() would give it, while ``paused``'s step is
        part-way (the engine paused it between layers for them): none of its sequences is evicted
        for a seat or blocks, since their K/V are being written; others may be, as in schedule()."""
        self.num_steps += 1
        step = _Step(SchedulerOutput(), self.max_num_batched_tokens)
        newcomers = self.fair.newcomers(self.waiting, self.running, self.policy)
        if newcomers:
            self._admit_waiting(step, only=newcomers, keep={id(e.seq) for e in paused.scheduled})
        step.out.scheduled = list(step.entries.values())
        return step.out

    def _schedule_running(self, step: _Step) -> None:
        """Running sequences: decodes first (at most max_num_decodes of them, those fed longest
        ago first: a round robin), then prompts still being prefilled in chunks. A decode may
        bring a speculative draft (engine/speculative/drafting.py) when the step has few decodes
        and the pool has free blocks for it inside its tenant's KV quota: nobody is ever preempted
        for a draft."""
        order = self._running_order()
        speculator = self.speculator
        if speculator is not None:
            decodes = [s for s in order if s.num_uncomputed_tokens == 1]
            if len(decodes) > speculator.max_decodes:
                speculator = None  # a compute-bound step: no drafts
            else:
                speculator.prepare(decodes, step=self.num_steps)
        for seq in order:
            if step.budget <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            num_new = min(seq.num_uncomputed_tokens, step.budget)
            num_blocks = self._num_new_blocks(seq, num_new)
            while (victim := self.fair.quota_victim(seq, num_blocks, self.running)) is not None:
                self._evict(step, victim)  # over its KV quota while another tenant waits
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            if speculator is not None and num_new == 1:
                draft = speculator.draft(seq, step=self.num_steps, budget=step.budget)
                # a draft's blocks are free ones inside its tenant's KV quota, or there is no draft
                if (draft and not self.fair.exceeds_quota(seq, self._num_new_blocks(seq, 1 + len(draft)))
                        and self._allocate(seq, 1 + len(draft))):
                    self._enter(step, seq, 1 + len(draft), draft)
                    continue
            while not self._allocate(seq, num_new):
                victim = self.fair.pool_victim(self.running, self.policy)
                self._evict(step, victim)
                if victim is seq:
                    break
            else:
                self._enter(step, seq, num_new)

    def _running_order(self) -> list[Sequence]:
        ordered = sorted(self.running, key=lambda s: s.num_uncomputed_tokens > 1)
        cap = self.max_num_decodes
        if cap is None or len(ordered) <= cap or ordered[cap].num_uncomputed_tokens > 1:
            return ordered
        num_decodes = next((i for i, s in enumerate(ordered) if s.num_uncomputed_tokens > 1), len(ordered))
        return heapq.nsmallest(cap, ordered[:num_decodes], key=lambda s: s.fed_at) + ordered[num_decodes:]

    def _admit_waiting(self, step: _Step, only: set[str] | None = None, keep: set[int] = frozenset()) -> None:
        """Waiting sequences in fair order, none of a tenant the pool just had to preempt (with
        ``only``: those of these tenants alone); no running sequence in ``keep`` (ids) is evicted."""
        def evictable() -> list[Sequence]:
            return [s for s in self.running if id(s) not in keep] if keep else self.running

        bs = self.block_manager.block_size
        in_flight: set[int] = set()  # hashes of prompt blocks this step computes
        compiling: Sequence | None = None
        skip = {self.fair.tenant_id(s) for s in step.out.preempted}
        if only is not None:
            skip |= self.fair.tenants.keys() - only
        queue = self.fair.admission_queue(self.waiting, self.policy, skip)
        while step.budget > 0 and (seq := queue.pop()) is not None:
            tid = self.fair.tenant_id(seq)
            seat = None  # the running sequence whose seat it takes when the batch is full
            if len(self.running) >= self.max_num_seqs:
                seat = self.fair.seat_victim(seq, evictable(), self.policy)
                if seat is None:
                    queue.drop(tid)
                    continue
            if seq.grammar is not None and not seq.grammar.ready:  # still compiling, off this thread
                compiling = seq
                continue
            if seq.adapter is not None:  # its adapter resident, or it waits for a slot
                seq.lora_slot = self.lora_slots.acquire(seq.adapter, self.running)
                if seq.lora_slot is None:
                    continue
            computed: list[int] = []
            hashes: list[int] = []
            if seq.num_computed_tokens == 0 and self.block_manager.enable_prefix_caching:
                hashes = self.block_manager.full_block_hashes(seq)
                computed = self.block_manager.get_computed_blocks(seq, hashes)
                if len(computed) < len(hashes) and hashes[len(computed)] in in_flight:
                    # Its next block is being computed right now for another request (a shared
                    # system prompt): wait one step and take it from the cache instead.
                    continue
            num_hit_tokens = len(computed) * bs
            num_new = min(seq.num_tokens - seq.num_computed_tokens - num_hit_tokens, step.budget)
            num_blocks = self._num_new_blocks(seq, num_hit_tokens + num_new)
            if self.fair.exceeds_quota(seq, num_blocks):
                queue.drop(tid)
                continue
            if seat is not None:
                self._evict(step, seat)
                queue.drop(self.fair.tenant_id(seat))
            while not self._allocate(seq, num_new, computed):
                victim = self.fair.block_victim(seq, num_blocks, evictable(), self.policy)
                if victim is None:
                    break
                self._evict(step, victim)
                queue.drop(self.fair.tenant_id(victim))
            else:
                self._start(step, seq, num_hit_tokens, num_new)
                in_flight.update(hashes[len(computed):(seq.num_computed_tokens + num_new) // bs])
                continue
            break  # the pool cannot take it: nothing behind it either, as under FCFS
        if not step.entries and compiling is not None and only is None:  # idle but for a compile: no busy loop
            compiling.grammar.wait(IDLE_COMPILE_WAIT_S)

    def update_after_step(self, out: SchedulerOutput) -> None:
        """Advance computed-token counts and publish newly full blocks to the prefix cache."""
        for entry in out.scheduled:
            seq = entry.seq
            seq.num_computed_tokens = entry.start + entry.num_new_tokens - entry.num_rejected
            if entry.draft:
                self.speculator.record(seq, len(entry.draft), len(entry.draft) - entry.num_rejected,
                                       step=self.num_steps)
            self.block_manager.cache_full_blocks(seq)

    # ----------------------------------------------------------------- helpers
    def _num_new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks ``seq`` would take to hold ``num_new_tokens`` more tokens (prefix hits included)."""
        return (self.block_manager.num_blocks_for(seq.num_computed_tokens + num_new_tokens)
                - len(seq.block_table))

    def _allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] = ()) -> bool:
        num_held = len(seq.block_table)
        if not self.block_manager.allocate(seq, num_new_tokens, computed_blocks):
            return False
        self.fair.hold(seq, len(seq.block_table) - num_held)
        return True

    def _enter(self, step: _Step, seq: Sequence, num_new: int, draft: list[int] = ()) -> None:
        """Feed ``seq`` ``num_new`` tokens this step (``draft``'s last), charged to its tenant."""
        seq.fed_at = (self.num_steps, len(step.entries))  # decodes past the cap take turns by it
        step.entries[id(seq)] = ScheduledSequence(seq, num_new, seq.num_computed_tokens, list(draft))
        step.budget -= num_new
        self.fair.charge(seq, num_new)

    def _start(self, step: _Step, seq: Sequence, num_hit_tokens: int, num_new: int) -> None:
        """Admit a waiting ``seq`` whose blocks were allocated: its prefix hits count as computed."""
        self.waiting.remove(seq)
        seq.num_computed_tokens += num_hit_tokens
        if seq.is_first_schedule:
            seq.is_first_schedule = False
            seq.num_cached_tokens = num_hit_tokens
            self.block_manager.record_prefix_query(seq.num_tokens, num_hit_tokens)
        self.fair.start(seq)
        seq.status = SequenceStatus.RUNNING
        self._insort(self.running, seq)
        self._enter(step, seq, num_new)

    def _evict(self, step: _Step, victim: Sequence) -> None:
        """Preempt ``victim``, taking back its entry (and its budget and charge) if it had one."""
        entry = step.entries.pop(id(victim), None)
        if entry is not None:
            step.budget += entry.num_new_tokens
            self.fair.charge(victim, -entry.num_new_tokens)
        self._preempt(victim)
        step.out.preempted.append(victim)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.fair.stop(seq, is_finished=False)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        if seq.grammar is not None and seq.grammar.ready:  # its state, rebuilt from its tokens
            seq.grammar.replay(seq.output_token_ids)
        seq.num_preemptions += 1
        self.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self._insort(self.waiting, seq)

    def _insort(self, queue: list[Sequence], seq: Sequence) -> None:
        keys = [s.sort_key(self.policy) for s in queue]
        queue.insert(bisect.bisect_right(keys, seq.sort_key(self.policy)), seq)
