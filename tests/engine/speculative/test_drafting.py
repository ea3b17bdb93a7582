"""Who drafts and how much (engine/speculative/drafting.py), and the scheduler's part: drafts only in
steps of few decodes, only into free blocks, and only accepted rows count as computed."""

from engine.sampling_params import SamplingParams
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.sequence import Sequence
from engine.speculative.drafting import MAX_PAUSE_STEPS, Speculator

REPEATING = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * 3  # its suffix always occurred before


def seq(ids=REPEATING, max_tokens=100, **params) -> Sequence:
    s = Sequence("r", list(ids), SamplingParams(temperature=0, max_tokens=max_tokens, **params))
    s.max_num_tokens = len(ids) + max_tokens
    return s


def test_a_repeating_sequence_drafts_up_to_the_configured_tokens():
    spec = Speculator(num_tokens=6, max_decodes=4)
    assert spec.draft(seq(), step=1, budget=100) == [1, 2, 3, 4, 5, 6]
    assert spec.draft(seq(), step=1, budget=4) == [1, 2, 3]  # the step's budget: 1 + 3 rows


def test_a_draft_stays_inside_the_requests_length():
    spec = Speculator(num_tokens=6, max_decodes=4)
    assert spec.draft(seq(max_tokens=3), step=1, budget=100) == [1, 2]  # 2 drafts + the model's token
    assert spec.draft(seq(max_tokens=1), step=1, budget=100) == []
    no_limit = seq()
    no_limit.max_num_tokens = None  # a sequence the engine did not set up (a probe) never drafts
    assert spec.draft(no_limit, step=1, budget=100) == []


def test_requests_whose_token_depends_on_more_than_the_logits_do_not_draft():
    spec = Speculator(num_tokens=6, max_decodes=4)
    assert spec.draft(seq(repetition_penalty=1.2), step=1, budget=100) == []
    assert spec.draft(seq(frequency_penalty=0.5), step=1, budget=100) == []
    early = seq(min_tokens=5)
    early.num_prompt_tokens = len(REPEATING) - 2  # 2 output tokens so far, min_tokens 5
    assert spec.draft(early, step=1, budget=100) == []
    early.num_prompt_tokens = len(REPEATING) - 5
    assert spec.draft(early, step=1, budget=100)
    constrained = seq()
    constrained.grammar = object()
    assert spec.draft(constrained, step=1, budget=100) == []


def test_misses_shorten_the_draft_and_whole_rejections_pause_it_longer_each_time():
    spec = Speculator(num_tokens=8, max_decodes=4)
    s = seq()
    assert len(spec.draft(s, step=1, budget=100)) == 8
    spec.record(s, 8, 2, step=1)  # 2 accepted: next time 3
    assert len(spec.draft(s, step=2, budget=100)) == 3
    spec.record(s, 3, 3, step=2)  # all accepted: twice as many
    assert len(spec.draft(s, step=3, budget=100)) == 6
    pauses = []
    step = 3
    for _ in range(9):  # rejected whole each time it drafts
        spec.record(s, 1, 0, step=step)
        paused_from = step
        step += 1
        while not spec.draft(s, step=step, budget=100):
            step += 1
        pauses.append(step - paused_from - 1)
    assert pauses == [1, 2, 4, 8, 16, 32, 64, 64, 64] and MAX_PAUSE_STEPS == 64
    spec.record(s, 1, 1, step=step)  # a hit ends the pauses
    assert spec.draft(s, step=step + 1, budget=100)
    assert (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens) == (12, 21, 6)


def scheduler(num_running: int, num_blocks: int = 64, max_decodes: int = 2) -> tuple[Scheduler, list[Sequence]]:
    sched = Scheduler(BlockManager(num_blocks, 16, enable_prefix_caching=True), max_num_seqs=8,
                      max_num_batched_tokens=512)
    sched.speculator = Speculator(num_tokens=4, max_decodes=max_decodes)
    seqs = [seq([t + 100 * i for t in REPEATING]) for i in range(num_running)]
    for i, s in enumerate(seqs):
        s.request_id = f"r{i}"
        sched.add(s)
    first = sched.schedule()  # the prompts
    sched.update_after_step(first)
    for i, s in enumerate(seqs):
        s.token_ids.append(1 + 100 * i)  # each sampled a token: it decodes next
    return sched, seqs


def test_the_scheduler_feeds_a_draft_after_the_token_and_counts_only_accepted_rows():
    sched, (s,) = scheduler(1)
    out = sched.schedule()
    (entry,) = out.scheduled
    assert entry.draft == [2, 3, 4, 5] and entry.num_new_tokens == 5 and entry.is_sampling
    assert entry.input_token_ids == [1, 2, 3, 4, 5]
    assert len(s.block_table) == 3  # 30 + 5 tokens
    entry.num_rejected = 3  # the model kept 1 of the 4
    sched.update_after_step(out)
    assert s.num_computed_tokens == 32 and sched.speculator.num_accepted_tokens == 1
    # the block of positions 16..31 is full of computed tokens, but its last token (the accepted
    # draft) is not appended yet: it is registered after the next step, never with missing tokens
    assert len(s.block_hashes) == 1
    s.token_ids += [2, 3]
    sched.update_after_step(sched.schedule())
    assert len(s.block_hashes) == 2
    assert s.block_hashes[1] == sched.block_manager.full_block_hashes(s)[1]


def test_a_step_of_more_decodes_than_max_decodes_drafts_nothing():
    sched, seqs = scheduler(3, max_decodes=2)
    assert all(not e.draft for e in sched.schedule().scheduled)
    sched, seqs = scheduler(2, max_decodes=2)
    assert all(e.draft for e in sched.schedule().scheduled)


def test_nobody_is_preempted_for_a_draft():
    sched, (a, b) = scheduler(2, num_blocks=4)  # 2 blocks each; a draft would need a third
    out = sched.schedule()
    assert [e.num_new_tokens for e in out.scheduled] == [1, 1] and not out.preempted


def test_a_draft_never_takes_its_tenant_past_its_kv_quota():
    sched, (s,) = scheduler(1)  # 31 tokens in 2 blocks: a draft of 4 needs a third
    asked = []
    sched.fair.exceeds_quota = lambda seq, num_new_blocks: asked.append(num_new_blocks) or num_new_blocks > 0
    out = sched.schedule()
    assert asked[-1] == 1 and [(e.num_new_tokens, e.draft) for e in out.scheduled] == [(1, [])]
    assert len(s.block_table) == 2
