"""Weighted fair share across tenants, without a model: admission order, seats, preemption, the
KV quota, and that one tenant is scheduled exactly as before (engine/scheduling/fair_share.py)."""

import random
from collections import Counter

import pytest

from engine import Tenant
from engine.sampling_params import SamplingParams
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.sequence import Sequence, SequenceStatus

A, B, C = Tenant("user:a"), Tenant("user:b"), Tenant("user:c")


def make(num_blocks=400, block_size=4, max_num_seqs=8, max_tokens=64, policy="fcfs", fair_share=True,
         kv_share=1.0, max_num_decodes=None):
    bm = BlockManager(num_blocks, block_size)
    return Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_tokens, policy=policy,
                     fair_share=fair_share, max_tenant_kv_share=kv_share, max_num_decodes=max_num_decodes)


_ids = iter(range(10**9))


def seq(tenant, n=8, max_tokens=8, priority=0, t=None):
    """A sequence of ``n`` distinct prompt tokens (no prefix hits between sequences)."""
    i = next(_ids)
    start = 1000 + i * 1000
    return Sequence(f"{tenant.id}-{i}", list(range(start, start + n)), SamplingParams(max_tokens=max_tokens),
                    priority=priority, arrival_time=t, tenant=tenant)


def add(s, tenant, count, **kw):
    seqs = [seq(tenant, **kw) for _ in range(count)]
    for q in seqs:
        s.add(q)
    return seqs


def step(s, fed=None):
    """Schedule, pretend the model ran, sample a token where a sequence reached its end, finish
    sequences at their max_tokens; ``fed`` counts the tokens each tenant was fed."""
    out = s.schedule()
    s.update_after_step(out)
    for e in out.scheduled:
        if fed is not None:
            fed[e.seq.tenant.id] += e.num_new_tokens
        if e.is_sampling:
            e.seq.append_token(7)
            if e.seq.num_output_tokens >= e.seq.params.max_tokens:
                s.remove(e.seq)
    return out


def blocks_of(s, tenant) -> int:
    return sum(len(q.block_table) for q in s.running + s.waiting if q.tenant == tenant)


def check_books(s):
    """FairShare's per-tenant counts are those of the queues."""
    for tid, state in s.fair.tenants.items():
        assert state.num_running == sum(q.tenant.id == tid for q in s.running)
        assert state.num_waiting == sum(q.tenant.id == tid for q in s.waiting)
        assert state.num_blocks == sum(len(q.block_table) for q in s.running + s.waiting if q.tenant.id == tid)
    assert s.fair.num_waiting == len(s.waiting)


# ----------------------------------------------------------------- one tenant: FCFS as before
def _trace(s, arrivals):
    """Per step, until every request ended: the scheduled ids and sizes, the preempted ids; checks
    every victim was the newest running sequence (policy order) as the step began."""
    trace = []
    for i in range(2000):
        if i > max(arrivals) and not s.has_unfinished():
            return trace
        for q in arrivals.get(i, ()):
            s.add(q)
        running_before = list(s.running)
        out = step(s)
        assert out.preempted == running_before[::-1][:len(out.preempted)]
        trace.append(([e.seq.request_id for e in out.scheduled], [e.num_new_tokens for e in out.scheduled],
                      [q.request_id for q in out.preempted]))
    raise AssertionError("the workload did not finish in 2,000 steps")


def _workload(tenant, shared_prefix: bool):
    """60 requests over 40 steps, random lengths; a third share a 12-token system prompt."""
    rng = random.Random(1)
    arrivals = {}
    for i in range(60):
        n, m, at = rng.randint(3, 40), rng.randint(1, 30), rng.randrange(40)
        prefix = list(range(900, 912)) if shared_prefix and i % 3 == 0 else []
        q = Sequence(f"r{i}", prefix + [rng.randrange(50) for _ in range(n)], SamplingParams(max_tokens=m),
                     priority=rng.randrange(3), arrival_time=at + i / 100, tenant=tenant)
        arrivals.setdefault(at, []).append(q)
    return arrivals


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("shared_prefix", [False, True])
def test_one_tenant_is_scheduled_exactly_as_without_fair_share(policy, shared_prefix):
    # A small pool (preemptions), chunked prefills, prefix hits and in-flight waits: one named
    # tenant with a weight and a quota is, step for step, the engine with fair share off.
    alone = make(num_blocks=24, max_num_seqs=6, max_tokens=32, policy=policy, fair_share=False)
    named = make(num_blocks=24, max_num_seqs=6, max_tokens=32, policy=policy, kv_share=0.3)
    workload = _workload(Tenant(), shared_prefix)
    expected = _trace(alone, workload)
    got = _trace(named, _workload(Tenant("user:1", 3.0), shared_prefix))

    assert got == expected
    assert alone.num_preemptions > 5  # the workload did preempt
    if policy == "fcfs" and not shared_prefix:  # nothing waits for an in-flight prefix: arrival order
        admitted = list(dict.fromkeys(r for ids, _, _ in expected for r in ids))
        by_arrival = sorted((q for qs in workload.values() for q in qs), key=lambda q: q.arrival_time)
        assert admitted == [q.request_id for q in by_arrival]


# ----------------------------------------------------------------- admission
def test_another_tenants_request_is_admitted_at_the_next_step_despite_a_flood_of_200():
    """In a step of its own: its first token after a short step, not after a step of the whole
    batch; the decodes go on at the next step, the newcomer's own among them."""
    s = make(max_num_seqs=8)
    add(s, A, 200, max_tokens=50)
    for _ in range(5):
        step(s)
    b = seq(B)
    s.add(b)
    out = step(s)

    assert [(e.seq, e.num_new_tokens) for e in out.scheduled] == [(b, 8)] and b.num_output_tokens == 1
    assert len(out.preempted) == 1 and out.preempted[0].tenant == A  # A's newest gave up its seat
    assert s.num_running == 8
    check_books(s)

    out = step(s)
    assert len(out.scheduled) == 8 and all(e.num_new_tokens == 1 for e in out.scheduled)
    assert b in [e.seq for e in out.scheduled]
    b2 = seq(B)
    s.add(b2)  # B has a sequence running: no step of its own
    assert len(step(s).scheduled) > 1
    check_books(s)


def test_no_step_of_its_own_for_a_tenant_over_its_share_or_a_less_urgent_request():
    s = make(max_num_seqs=8)
    add(s, A, 4, max_tokens=50)
    step(s)
    s.fair.tenants[A.id].counter = 0.0  # A served less than B below
    b = seq(B)
    s.add(b)
    s.fair.tenants[B.id].counter = 100.0
    assert len(step(s).scheduled) == 5  # with the decodes, in fair order

    s = make(max_num_seqs=8, policy="priority")
    add(s, A, 4, max_tokens=50)
    step(s)
    s.add(seq(B, priority=2**31 - 1))  # a Batch API line
    assert len(step(s).scheduled) == 5


def test_without_fair_share_the_same_request_waits_behind_the_flood():
    s = make(max_num_seqs=8, fair_share=False)
    add(s, A, 200, max_tokens=50)
    for _ in range(5):
        step(s)
    b = seq(B)
    s.add(b)
    num_steps = 0
    while b.status is SequenceStatus.WAITING:
        step(s)
        num_steps += 1
    assert num_steps > 1000  # every one of A's 200 requests first


def test_a_returning_tenant_does_not_bank_the_credit_of_its_idle_time():
    # A ran alone for a long time; C then floods: the two share the steps from then on instead of
    # C having the engine to itself until its counter catches up with A's. Prefill-bound (long
    # prompts, a small token budget, seats to spare): the counters alone decide who is admitted.
    s = make(max_num_seqs=64, max_tokens=32)
    add(s, A, 400, n=64, max_tokens=2)
    for _ in range(300):
        step(s)
    add(s, C, 400, n=64, max_tokens=2)
    fed = Counter()
    for _ in range(100):
        step(s, fed)
    assert 0.8 < fed[A.id] / fed[C.id] < 1.25, fed
    check_books(s)


@pytest.mark.parametrize("bound", ["seats", "prefill"])
def test_weights_2_to_1_serve_about_2_to_1_tokens(bound):
    # seats: a full batch of decodes, shared by seats; prefill: long prompts under a small token
    # budget with seats to spare, shared by the counters' admission order.
    seats, budget, prompt, output = (12, 48, 12, 12) if bound == "seats" else (64, 32, 64, 2)
    s = make(max_num_seqs=seats, max_tokens=budget)
    heavy, light = Tenant("user:heavy", 2.0), Tenant("user:light", 1.0)
    add(s, heavy, 300, n=prompt, max_tokens=output)
    add(s, light, 300, n=prompt, max_tokens=output)
    fed = Counter()
    for _ in range(50):  # warm-up: seats move to the weighted shares
        step(s)
    for _ in range(300):
        step(s, fed)
    assert 1.8 < fed[heavy.id] / fed[light.id] < 2.2, fed
    check_books(s)


def test_priority_still_comes_before_the_fair_share():
    # Under the "priority" policy a tenant's batch line (the lowest priority) waits for another
    # tenant's interactive request, however much more that tenant was served.
    s = make(max_num_seqs=1, policy="priority")
    busy = add(s, A, 1, max_tokens=4)[0]
    while not busy.is_finished:
        step(s)
    batch_line = seq(B, priority=2**31 - 1)
    interactive = seq(A, priority=0)
    s.add(batch_line)
    s.add(interactive)
    assert [e.seq for e in step(s).scheduled] == [interactive]


def test_a_less_urgent_request_does_not_take_a_more_urgent_ones_seat():
    s = make(max_num_seqs=2, policy="priority")
    add(s, A, 2, max_tokens=50)
    step(s)
    low = seq(B, priority=5)
    s.add(low)
    out = step(s)
    assert not out.preempted and low.status is SequenceStatus.WAITING


# ----------------------------------------------------------------- preemption
def test_when_the_pool_runs_out_the_tenant_over_its_share_is_preempted_not_the_newest():
    s = make(num_blocks=10, block_size=4, max_num_seqs=8)
    a_seqs = add(s, A, 3, n=7, max_tokens=20)
    step(s)  # A: 3 x 2 blocks
    b = seq(B, n=7, max_tokens=20)
    s.add(b)
    assert [e.seq for e in step(s).scheduled] == [b]  # B's step alone: 2 blocks, the newest running
    step(s)  # 8 of 10 held, and each needs a third next step
    out = step(s)

    assert out.preempted == [a_seqs[-1]]  # A's newest (A holds 6 blocks, B 2)
    assert b.status is SequenceStatus.RUNNING
    check_books(s)


def test_with_fair_share_off_the_newest_is_preempted_whoever_it_belongs_to():
    s = make(num_blocks=10, block_size=4, max_num_seqs=8, fair_share=False)
    add(s, A, 3, n=7, max_tokens=20)
    step(s)
    b = seq(B, n=7, max_tokens=20)
    s.add(b)
    step(s)
    assert step(s).preempted == [b]


def test_a_waiting_tenant_takes_blocks_from_the_one_holding_the_most_per_weight():
    s = make(num_blocks=12, block_size=4, max_num_seqs=8)
    a_seqs = add(s, A, 3, n=16, max_tokens=20)  # 3 x 4 blocks: the whole pool
    step(s)
    b = seq(B, n=8)
    s.add(b)
    out = step(s)
    assert out.preempted == [a_seqs[-1]] and b in [e.seq for e in out.scheduled]
    check_books(s)


def test_two_floods_settle_at_their_seat_shares_without_trading_sequences():
    s = make(max_num_seqs=8)
    add(s, A, 100, max_tokens=400)
    step(s)
    add(s, C, 100, max_tokens=400)
    preemptions = []
    for _ in range(20):
        preemptions.append(len(step(s).preempted))
    assert sum(q.tenant == A for q in s.running) == sum(q.tenant == C for q in s.running) == 4
    assert sum(preemptions) == 4  # one per seat moved, then none
    check_books(s)


# ----------------------------------------------------------------- KV quota
def _quota_run(kv_share):
    """A runs 4 sequences that grow to 36 of the pool's 40 blocks; from step 2 B's less urgent
    request waits for a seat (under "priority" it may not take one from A)."""
    s = make(num_blocks=40, block_size=4, max_num_seqs=4, policy="priority", kv_share=kv_share)
    add(s, A, 4, n=16, max_tokens=20)
    step(s)
    b = seq(B, priority=1, max_tokens=4)
    s.add(b)
    held_while_b_waits = []
    steps_b_waited = 0
    for _ in range(40):
        if b.status is SequenceStatus.WAITING:
            steps_b_waited += 1
            step(s)
            if b.status is SequenceStatus.WAITING:
                held_while_b_waits.append(blocks_of(s, A))
        else:
            step(s)
        check_books(s)
    return s, b, held_while_b_waits, steps_b_waited


def test_the_kv_quota_holds_one_tenant_to_its_share_while_another_waits():
    s, b, held, waited = _quota_run(0.5)
    assert max(held) <= 20  # half of the 40 blocks
    assert b.is_finished
    _, _, _, waited_without_quota = _quota_run(1.0)
    assert waited < waited_without_quota  # B got a seat when A reached its quota, not when A ended


def test_the_kv_quota_never_binds_a_tenant_alone():
    s = make(num_blocks=40, block_size=4, max_num_seqs=4, kv_share=0.25)
    a_seqs = add(s, A, 4, n=16, max_tokens=20)
    most = 0
    for _ in range(20):
        step(s)
        most = max(most, blocks_of(s, A))
    assert most == 36 and s.num_preemptions == 0
    assert all(q.is_finished for q in a_seqs)


def test_the_books_balance_and_idle_tenants_are_forgotten_after_aborts_and_preemptions():
    rng = random.Random(3)
    s = make(num_blocks=30, block_size=4, max_num_seqs=6, max_tokens=24, kv_share=0.6)
    tenants = [Tenant(f"user:{i}", rng.choice([0.5, 1, 2])) for i in range(12)]
    live = []
    for i in range(300):
        if rng.random() < 0.5:
            q = seq(rng.choice(tenants), n=rng.randint(2, 20), max_tokens=rng.randint(1, 12))
            s.add(q)
            live.append(q)
        if live and rng.random() < 0.1:  # an abort, running or waiting
            q = live.pop(rng.randrange(len(live)))
            if not q.is_finished:
                s.remove(q)
        step(s)
        check_books(s)
    while s.has_unfinished():
        step(s)
    check_books(s)
    assert s.num_preemptions > 0
    # Idle tenants are forgotten but for those served past the floor (they keep their lead)
    assert s.fair.tenants and all(not t.is_active and t.counter > s.fair.floor for t in s.fair.tenants.values())
    s.block_manager.check_all_free()


# ----------------------------------------------------------------- the decode cap
def test_past_the_decode_cap_running_sequences_take_turns_and_prefills_still_run():
    s = make(max_num_seqs=16, max_tokens=128, max_num_decodes=4)
    seqs = add(s, A, 10, max_tokens=40)
    step(s)  # ten prefills (the cap is on decodes)
    fed, last = Counter(), {q.request_id: 1 for q in seqs}
    for i in range(2, 27):
        out = step(s)
        assert len(out.scheduled) == 4 and all(e.num_new_tokens == 1 for e in out.scheduled)
        for e in out.scheduled:
            assert i - last[e.seq.request_id] <= 3  # 10 sequences, 4 a step: none waits more than 3 steps
            last[e.seq.request_id] = i
        fed.update(e.seq.request_id for e in out.scheduled)
    assert set(fed.values()) == {10}  # 100 decodes in 25 steps: 10 each, a round robin
    late = add(s, A, 1, max_tokens=40)[0]
    out = step(s)
    assert late in [e.seq for e in out.scheduled] and len(out.scheduled) == 5  # 4 decodes + its prompt
    check_books(s)


def test_the_decode_cap_defaults_to_32_on_a_cpu_with_fair_share_only():
    from engine.config import EngineConfig, max_num_decodes

    assert max_num_decodes(EngineConfig("m"), "cpu") == 32
    assert max_num_decodes(EngineConfig("m"), "cuda") is None
    assert max_num_decodes(EngineConfig("m", fair_share=False), "cpu") is None  # FCFS as it was
    assert max_num_decodes(EngineConfig("m", max_num_decodes_per_step=8), "cuda") == 8
    assert max_num_decodes(EngineConfig("m", max_num_decodes_per_step=0), "cpu") is None
