"""Continuous batching decisions, without a model: budgets, chunking, preemption, policies."""

from engine.scheduling.block_manager import BlockManager
from engine.sampling_params import SamplingParams
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.sequence import Sequence, SequenceStatus


def make(num_blocks=100, block_size=4, max_num_seqs=8, max_tokens=64, policy="fcfs", caching=True):
    bm = BlockManager(num_blocks, block_size, caching)
    return Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_tokens, policy=policy)


def seq(rid, n, priority=0, t=None, start=0):
    return Sequence(rid, list(range(start, start + n)), SamplingParams(max_tokens=8),
                    priority=priority, arrival_time=t)


def run_step(s, sampled_token=7):
    """Schedule, pretend the model ran, append a token to every sampling sequence."""
    out = s.schedule()
    s.update_after_step(out)
    for e in out.scheduled:
        if e.seq.num_computed_tokens == e.seq.num_tokens:
            e.seq.append_token(sampled_token)
    return out


def test_long_prompt_is_prefilled_in_chunks_under_the_token_budget():
    s = make(max_tokens=16)
    a = seq("a", 40)
    s.add(a)
    sizes = [run_step(s).scheduled[0].num_new_tokens for _ in range(3)]
    assert sizes == [16, 16, 8]
    assert a.num_output_tokens == 1  # sampled only when the last chunk ran


def test_running_decodes_are_not_stalled_by_a_new_long_prompt():
    s = make(max_tokens=16)
    a = seq("a", 4)
    s.add(a)
    run_step(s)  # a prefilled, now decoding
    b = seq("b", 100, start=1000)
    s.add(b)
    for _ in range(5):
        out = run_step(s)
        by_id = {e.seq.request_id: e.num_new_tokens for e in out.scheduled}
        assert by_id["a"] == 1
        assert by_id["b"] == 15
        assert out.num_batched_tokens == 16


def test_max_num_seqs_caps_the_running_batch():
    s = make(max_num_seqs=2)
    for i in range(4):
        s.add(seq(str(i), 4, start=100 * i))
    out = run_step(s)
    assert [e.seq.request_id for e in out.scheduled] == ["0", "1"]
    assert s.num_waiting == 2


def test_newest_running_sequence_is_preempted_when_blocks_run_out():
    s = make(num_blocks=4, block_size=4)
    a, b = seq("a", 8, t=1.0), seq("b", 8, t=2.0, start=100)
    s.add(a)
    s.add(b)
    run_step(s)  # each holds 2 full blocks: the pool is full
    out = run_step(s)  # each needs a third block for its 9th token
    assert out.preempted == [b]
    assert b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0 and b.block_table == []
    assert [e.seq.request_id for e in out.scheduled] == ["a"]
    s.remove(a)
    out = run_step(s)  # b comes back and recomputes prompt + its generated token
    entry = out.scheduled[0]
    assert entry.seq is b and entry.start + entry.num_new_tokens == 9
    # Its first block survived in the prefix cache; its tail block was evicted for a.
    assert entry.start == 4


def test_priority_policy_preempts_the_lowest_priority_not_the_newest():
    s = make(num_blocks=4, block_size=4, policy="priority")
    low = seq("low", 8, priority=5, t=1.0)
    high = seq("high", 8, priority=0, t=2.0, start=100)
    s.add(low)
    s.add(high)
    run_step(s)
    out = run_step(s)
    assert out.preempted == [low]


def test_priority_policy_admits_the_most_urgent_waiting_request_first():
    s = make(max_num_seqs=1, policy="priority")
    s.add(seq("late-urgent", 4, priority=-1, t=5.0))
    s.add(seq("early-normal", 4, priority=0, t=1.0))
    assert run_step(s).scheduled[0].seq.request_id == "late-urgent"


def test_fcfs_admits_in_arrival_order_regardless_of_priority():
    s = make(max_num_seqs=1, policy="fcfs")
    s.add(seq("second", 4, priority=-1, t=5.0))
    s.add(seq("first", 4, priority=0, t=1.0))
    assert run_step(s).scheduled[0].seq.request_id == "first"


def test_admission_uses_prefix_cache_hits_and_counts_them():
    s = make(block_size=4)
    a = seq("a", 10)
    s.add(a)
    run_step(s)
    b = Sequence("b", list(range(8)) + [90, 91], SamplingParams(max_tokens=8))
    s.add(b)
    out = run_step(s)
    entry = next(e for e in out.scheduled if e.seq is b)
    assert entry.start == 8 and entry.num_new_tokens == 2
    assert b.num_cached_tokens == 8
    assert s.block_manager.num_prefix_hit_tokens == 8
    assert s.block_manager.num_prefix_queried_tokens == 20


def test_all_blocks_free_after_every_sequence_is_removed():
    s = make(num_blocks=6, block_size=4)
    seqs = [seq(str(i), 5 + i, t=float(i), start=50 * i) for i in range(4)]
    for q in seqs:
        s.add(q)
    for _ in range(6):
        run_step(s)
    for q in seqs:
        s.remove(q)
    s.block_manager.check_all_free()


def test_request_sharing_a_prefix_being_computed_waits_one_step_to_hit_the_cache():
    s = make(block_size=4, max_tokens=64)
    shared = list(range(8))
    a = Sequence("a", shared + [50, 51], SamplingParams(max_tokens=8))
    b = Sequence("b", shared + [60, 61], SamplingParams(max_tokens=8))
    c = Sequence("c", [70, 71, 72, 73, 74], SamplingParams(max_tokens=8))
    for q in (a, b, c):
        s.add(q)
    first = run_step(s)
    # b would recompute the 8 shared tokens a is computing now; c shares nothing and goes ahead.
    assert [e.seq.request_id for e in first.scheduled] == ["a", "c"]
    second = run_step(s)
    entry = next(e for e in second.scheduled if e.seq is b)
    assert entry.start == 8 and b.num_cached_tokens == 8
