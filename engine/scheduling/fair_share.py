"""Weighted fair share of the engine across tenants (engine/tenancy.py): which waiting sequence
is admitted next, which running one gives way, and how much of the KV pool one tenant may hold.

Each tenant has a virtual token counter (VTC: Sheng et al., "Fairness in Serving Large Language
Models", OSDI 2024), weighted: the tokens its sequences are fed (prefill chunks and decodes)
divided by its weight. Waiting sequences are admitted lowest counter first, a tenant's own in the
policy's order; under the "priority" policy priority comes before the counter, so the Batch API's
lines (the lowest priority) still wait for every tenant's interactive requests. A tenant that had
nothing in the engine comes back at the lowest counter of those that have (or where the last one
left): it cannot bank credit while idle, nor pay for having been served before others arrived.

Seats (``max_num_seqs``) and KV blocks are shared by the same weights. When the batch or the pool
is full, a waiting tenant under its share takes the place of the newest sequence of the tenant
most over its share, only while it will still hold less per unit of weight than that tenant held:
a preemption moves seats or blocks from more to less per weight, never back, so two floods settle
at their shares instead of trading sequences. When the pool runs out for the running sequences,
the tenant holding the most blocks per weight gives way first. And while another tenant waits,
one tenant's sequences hold at most ``max_tenant_kv_share`` of the pool (its first sequence
excepted, so that every request can run).

With one tenant (the engine used alone, or ``fair_share`` off) every rule here is inert and the
scheduler is exactly FCFS (or priority). Each decision is O(tenants), or one pass over the
running sequences for a preemption; no torch here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.scheduling.sequence import Sequence, SequenceStatus


@dataclass
class TenantState:
    """One tenant's counter and what its sequences hold now."""

    weight: float
    counter: float = 0.0  # virtual tokens: tokens fed to its sequences / weight
    num_waiting: int = 0
    num_running: int = 0
    num_blocks: int = 0  # block references its sequences hold (a shared block counts per holder)

    @property
    def is_active(self) -> bool:
        return self.num_waiting + self.num_running > 0


class FairShare:
    def __init__(self, *, num_blocks: int, max_tenant_kv_share: float = 1.0, is_enabled: bool = True):
        self.is_enabled = is_enabled
        # None: no quota (1.0, or fair share off)
        self.max_tenant_blocks = (None if max_tenant_kv_share >= 1.0 or not is_enabled
                                  else max(1, int(max_tenant_kv_share * num_blocks)))
        self.tenants: dict[str, TenantState] = {}  # the active ones, and idle ones still ahead of the floor
        self.num_waiting = 0
        self.floor = 0.0  # the lowest active counter (never decreases): where a returning tenant starts

    def tenant_id(self, seq: Sequence) -> str:
        return seq.tenant.id if self.is_enabled else ""

    def state(self, seq: Sequence) -> TenantState:
        return self.tenants[self.tenant_id(seq)]

    # ----------------------------------------------------------------- transitions
    def enqueue(self, seq: Sequence) -> None:
        """``seq`` joins the waiting queue (a new request, or a sample forked off its first)."""
        tid = self.tenant_id(seq)
        state = self.tenants.get(tid)
        if state is None or not state.is_active:
            self._raise_floor()
            state = state or TenantState(seq.tenant.weight)
            state.counter = max(state.counter, self.floor)
            self.tenants[tid] = state
        state.weight = seq.tenant.weight  # the latest request's: staff may have changed it
        state.num_waiting += 1
        state.num_blocks += len(seq.block_table)  # a forked sample holds its prompt's blocks
        self.num_waiting += 1

    def start(self, seq: Sequence) -> None:
        """``seq`` was admitted: waiting -> running."""
        state = self.state(seq)
        state.num_waiting -= 1
        state.num_running += 1
        self.num_waiting -= 1

    def stop(self, seq: Sequence, *, is_finished: bool) -> None:
        """``seq`` leaves running or waiting, its blocks about to be freed: finished (or aborted),
        or preempted (back to waiting)."""
        tid = self.tenant_id(seq)
        state = self.tenants[tid]
        state.num_blocks -= len(seq.block_table)
        if seq.status is SequenceStatus.RUNNING:
            state.num_running -= 1
        else:
            state.num_waiting -= 1
            self.num_waiting -= 1
        if not is_finished:
            state.num_waiting += 1
            self.num_waiting += 1
        elif not state.is_active:
            self._retire(tid, state)

    def hold(self, seq: Sequence, num_blocks: int) -> None:
        """``seq`` took ``num_blocks`` more blocks."""
        self.state(seq).num_blocks += num_blocks

    def charge(self, seq: Sequence, num_tokens: int) -> None:
        """``seq`` is fed ``num_tokens`` this step (negative: an entry taken back)."""
        state = self.state(seq)
        state.counter += num_tokens / state.weight

    def _raise_floor(self) -> None:
        active = [t.counter for t in self.tenants.values() if t.is_active]
        if active:
            self.floor = max(self.floor, min(active))

    def _retire(self, tid: str, state: TenantState) -> None:
        """A tenant's last sequence ended: the floor rises to the lowest active counter (its own
        if it was the last), and every idle tenant not ahead of the floor is forgotten (it would
        start there anyway)."""
        self.floor = max(self.floor, min([state.counter] + [t.counter for t in self.tenants.values()
                                                            if t.is_active]))
        self.tenants = {k: t for k, t in self.tenants.items() if t.is_active or t.counter > self.floor}

    # ----------------------------------------------------------------- decisions
    def newcomers(self, waiting: list[Sequence], running: list[Sequence], policy: str) -> set[str]:
        """Tenants with nothing running and a request never yet scheduled waiting, while another
        tenant's sequences run, and served no more per weight than any running tenant (a tenant
        back from idle starts at the floor, so an interactive user's next request qualifies; a
        tenant over its share waits its turn): the scheduler gives them a step of their own. Under
        the "priority" policy only those whose next request is as urgent as the most urgent running
        sequence (a Batch API line does not hold up interactive decodes). Empty with one tenant."""
        if not running or self.num_waiting == 0 or len(self.tenants) < 2:
            return set()
        lowest_running = min((t.counter for t in self.tenants.values() if t.num_running), default=0.0)
        found = {tid for tid, t in self.tenants.items()
                 if t.num_waiting and not t.num_running and t.counter <= lowest_running}
        if not found:
            return found
        heads: dict[str, Sequence] = {}
        is_new: set[str] = set()
        for seq in waiting:  # in policy order: the first of each tenant is its head
            tid = self.tenant_id(seq)
            if tid in found:
                heads.setdefault(tid, seq)
                if seq.is_first_schedule:
                    is_new.add(tid)
        most_urgent = running[0].priority  # running is in policy order
        return {tid for tid in is_new if policy != "priority" or heads[tid].priority <= most_urgent}

    def admission_queue(self, waiting: list[Sequence], policy: str, skip: set[str]) -> AdmissionQueue:
        return AdmissionQueue(self, waiting, policy, skip)

    def exceeds_quota(self, seq: Sequence, num_new_blocks: int) -> bool:
        """Whether ``seq``'s tenant taking ``num_new_blocks`` more would hold more than its quota of
        the pool while another tenant waits (a tenant with nothing running is never held back)."""
        if self.max_tenant_blocks is None or num_new_blocks <= 0:
            return False
        state = self.state(seq)
        return (state.num_running > 0 and self.num_waiting > state.num_waiting
                and state.num_blocks + num_new_blocks > self.max_tenant_blocks)

    def quota_victim(self, seq: Sequence, num_new_blocks: int, running: list[Sequence]) -> Sequence | None:
        """A running ``seq`` needs ``num_new_blocks`` more: its tenant's newest running sequence
        (perhaps ``seq``) when that would take the tenant over its quota while another tenant waits;
        None when it may have them (or would be left with nothing running)."""
        if not self.exceeds_quota(seq, num_new_blocks) or self.state(seq).num_running <= 1:
            return None
        tid = self.tenant_id(seq)
        return next(s for s in reversed(running) if self.tenant_id(s) == tid)

    def pool_victim(self, running: list[Sequence], policy: str) -> Sequence:
        """The pool ran out for the running sequences: among the lowest priority (under the
        "priority" policy), the newest sequence of the tenant holding the most blocks per weight."""
        if len(self.tenants) == 1:
            return running[-1]
        newest = self._newest_by_tenant(running, running[-1].priority if policy == "priority" else None)
        tid = max(newest, key=lambda t: self.tenants[t].num_blocks / self.tenants[t].weight)
        return newest[tid]

    def seat_victim(self, seq: Sequence, running: list[Sequence], policy: str) -> Sequence | None:
        """The batch is full and ``seq`` waits: the newest sequence (no more urgent than ``seq``)
        of the tenant with the most running sequences per weight, if ``seq``'s tenant will still
        have fewer per weight with ``seq``; None otherwise."""
        return self._victim(seq, running, policy, lambda t: t.num_running, 1)

    def block_victim(self, seq: Sequence, num_new_blocks: int, running: list[Sequence],
                     policy: str) -> Sequence | None:
        """The pool cannot give ``seq`` its ``num_new_blocks``: as seat_victim, by blocks held."""
        return self._victim(seq, running, policy, lambda t: t.num_blocks, num_new_blocks)

    def _victim(self, seq, running, policy, usage, num_taken) -> Sequence | None:
        tid = self.tenant_id(seq)
        if len(self.tenants) == 1:
            return None
        mine = self.tenants[tid]
        after = (usage(mine) + num_taken) / mine.weight
        newest = self._newest_by_tenant(running, seq.priority if policy == "priority" else None)
        newest.pop(tid, None)
        if not newest:
            return None
        victim_tid = max(newest, key=lambda t: usage(self.tenants[t]) / self.tenants[t].weight)
        victim = self.tenants[victim_tid]
        return newest[victim_tid] if after < usage(victim) / victim.weight else None

    def _newest_by_tenant(self, running: list[Sequence], min_priority: int | None) -> dict[str, Sequence]:
        """Each tenant's last running sequence in policy order, among those whose priority is at
        least ``min_priority`` (running is sorted by policy: under "priority" the least urgent last)."""
        newest: dict[str, Sequence] = {}
        for seq in reversed(running):
            if min_priority is not None and seq.priority < min_priority:
                break
            newest.setdefault(self.tenant_id(seq), seq)
        return newest


class AdmissionQueue:
    """One step's waiting sequences in admission order: the next is the head of the tenant first
    under (priority, when the policy has it; its counter; its head's own order)."""

    def __init__(self, fair: FairShare, waiting: list[Sequence], policy: str, skip: set[str]):
        self._fair = fair
        self._is_priority = policy == "priority"
        self._policy = policy
        self._queues: dict[str, deque[Sequence]] = {}
        for seq in waiting:  # sorted by policy: each tenant's deque is too
            tid = fair.tenant_id(seq)
            if tid not in skip:
                self._queues.setdefault(tid, deque()).append(seq)

    def pop(self) -> Sequence | None:
        if not self._queues:
            return None
        tid = next(iter(self._queues)) if len(self._queues) == 1 else min(self._queues, key=self._order)
        queue = self._queues[tid]
        seq = queue.popleft()
        if not queue:
            del self._queues[tid]
        return seq

    def drop(self, tid: str) -> None:
        """Nothing more of this tenant this step."""
        self._queues.pop(tid, None)

    def _order(self, tid: str) -> tuple:
        head = self._queues[tid][0]
        return (head.priority if self._is_priority else 0, self._fair.tenants[tid].counter,
                head.sort_key(self._policy))
