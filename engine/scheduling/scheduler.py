"""Continuous batching: which sequences run in the next step, and how many tokens each.

Every step mixes decode tokens (one per running sequence) with chunks of prompts
under one token budget (``max_num_batched_tokens``). Decodes are served first so
a long prompt never stalls the sequences already streaming. When the pool runs
out of blocks, the running sequence that sorts last under the policy (the newest
under FCFS, the lowest priority under "priority") is preempted: its blocks are
freed and it is recomputed later, its prefix usually coming back from the cache.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from engine.scheduling.block_manager import BlockManager
from engine.scheduling.sequence import Sequence, SequenceStatus

IDLE_COMPILE_WAIT_S = 0.005  # a step with nothing to run but a grammar compiling waits this long for it


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int
    start: int  # index of the first token fed this step (= num_computed_tokens before it)

    @property
    def is_sampling(self) -> bool:
        """Whether this step reaches the end of the sequence's tokens and so samples the next one."""
        return self.start + self.num_new_tokens == self.seq.num_tokens


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


class Scheduler:
    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int,
                 max_num_batched_tokens: int, policy: str = "fcfs"):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        # Both lists stay sorted by Sequence.sort_key: waiting[0] is admitted next,
        # running[-1] is preempted first.
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # engine/structured/grammar.py's GrammarCompiler, set by the engine: a constrained
        # sequence's grammar is compiled off this thread from add(), and it waits until ready
        self.grammars = None

    # ----------------------------------------------------------------- queue
    def add(self, seq: Sequence) -> None:
        if seq.params.grammar is not None and seq.grammar is None:
            seq.grammar = self.grammars.submit(seq.params.grammar)
        seq.status = SequenceStatus.WAITING
        self._insort(self.waiting, seq)

    def remove(self, seq: Sequence) -> None:
        """Take ``seq`` out of the queues and release its blocks (finish or abort)."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
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
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled: dict[int, ScheduledSequence] = {}  # id(seq) -> entry, in scheduling order

        # Running sequences: decodes first, then prompts still being prefilled in chunks.
        for seq in sorted(self.running, key=lambda s: s.num_uncomputed_tokens > 1):
            if budget <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.allocate(seq, num_new):
                victim = self.running[-1]
                entry = scheduled.pop(id(victim), None)
                if entry is not None:
                    budget += entry.num_new_tokens
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                scheduled[id(seq)] = ScheduledSequence(seq, num_new, seq.num_computed_tokens)
                budget -= num_new

        # Waiting sequences, in policy order, while nothing had to be preempted.
        bs = self.block_manager.block_size
        in_flight: set[int] = set()  # hashes of prompt blocks this step computes
        compiling: Sequence | None = None
        i = 0
        while (i < len(self.waiting) and budget > 0 and not out.preempted
               and len(self.running) < self.max_num_seqs):
            seq = self.waiting[i]
            if seq.grammar is not None and not seq.grammar.ready:  # still compiling, off this thread
                compiling = seq
                i += 1
                continue
            computed: list[int] = []
            hashes: list[int] = []
            if seq.num_computed_tokens == 0 and self.block_manager.enable_prefix_caching:
                hashes = self.block_manager.full_block_hashes(seq)
                computed = self.block_manager.get_computed_blocks(seq, hashes)
                if len(computed) < len(hashes) and hashes[len(computed)] in in_flight:
                    # Its next block is being computed right now for another request (a shared
                    # system prompt): wait one step and take it from the cache instead.
                    i += 1
                    continue
            num_hit_tokens = len(computed) * bs
            num_new = min(seq.num_tokens - seq.num_computed_tokens - num_hit_tokens, budget)
            if not self.block_manager.allocate(seq, num_new, computed):
                break
            self.waiting.pop(i)
            seq.num_computed_tokens += num_hit_tokens
            if seq.is_first_schedule:
                seq.is_first_schedule = False
                seq.num_cached_tokens = num_hit_tokens
                self.block_manager.record_prefix_query(seq.num_tokens, num_hit_tokens)
            in_flight.update(hashes[len(computed):(seq.num_computed_tokens + num_new) // bs])
            seq.status = SequenceStatus.RUNNING
            self._insort(self.running, seq)
            scheduled[id(seq)] = ScheduledSequence(seq, num_new, seq.num_computed_tokens)
            budget -= num_new

        out.scheduled = list(scheduled.values())
        if not out.scheduled and compiling is not None:  # idle but for a compile: no busy loop
            compiling.grammar.wait(IDLE_COMPILE_WAIT_S)
        return out

    def update_after_step(self, out: SchedulerOutput) -> None:
        """Advance computed-token counts and publish newly full blocks to the prefix cache."""
        for entry in out.scheduled:
            seq = entry.seq
            seq.num_computed_tokens = entry.start + entry.num_new_tokens
            self.block_manager.cache_full_blocks(seq)

    # ----------------------------------------------------------------- helpers
    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
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
