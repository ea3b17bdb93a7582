"""The batched sampler against plain-torch and Hugging Face references.

Distribution tests replicate one logits row N times and sample once, so the
empirical token frequencies over the batch estimate the sampling distribution.
"""

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from engine.sampling.sampler import Sampler, _argmax, _inverse_cdf, apply_penalties
from engine.sampling.sampling_metadata import SamplingMetadata
from engine.sampling_params import SamplingParams

NUM_DRAWS = 16000
# 4 standard deviations of a frequency estimated from NUM_DRAWS draws (p(1-p) <= 1/4)
FREQ_TOL = 4 * (0.25 / NUM_DRAWS) ** 0.5


def build(params, *, prompt=None, output=None, generators=None, suppress=None):
    n = len(params)
    return SamplingMetadata.build(
        params,
        prompt_token_ids=prompt or [[] for _ in range(n)],
        output_token_ids=output or [[] for _ in range(n)],
        generators=generators or [None] * n,
        suppress_token_ids=suppress or [[] for _ in range(n)],
        device="cpu",
    )


def sample(logits, params, **kwargs):
    return Sampler()(logits, build(params, **kwargs))


def random_logits(num_rows, vocab_size, seed, scale=3.0):
    return torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(seed)) * scale


def empirical_distribution(row, params, seed=0):
    """Frequencies [V] of NUM_DRAWS tokens sampled from one logits row [V]."""
    torch.manual_seed(seed)
    tokens = sample(row.expand(NUM_DRAWS, -1).contiguous(), [params] * NUM_DRAWS).sampled_token_ids
    return torch.bincount(tokens, minlength=row.numel()).float() / NUM_DRAWS


def hf_distribution(row, warper):
    return warper(None, row.unsqueeze(0)).softmax(dim=-1).squeeze(0)


def test_greedy_equals_argmax():
    logits = random_logits(16, 1000, seed=1)
    out = sample(logits, [SamplingParams(temperature=0.0)] * 16)
    assert torch.equal(out.sampled_token_ids, logits.argmax(dim=-1))
    assert out.logprobs is None and out.top_token_ids is None


@pytest.mark.parametrize("shape", [(32, 262144), (3, 49152), (1, 151936), (2, 1000), (4, 7), (1, 256)])
def test_the_two_level_argmax_is_the_first_maximum(shape):
    """Chunk maxima then the first chunk's first maximum: the index torch's max gives, ties
    (the first wins), a NaN (a maximum), a row of -inf (index 0), a vocabulary of no chunk size."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    x[0, shape[1] // 3] = x[0, shape[1] - 1] = 50.0  # a tie across chunks
    if shape[0] > 1:
        x[1] = float("-inf")
    if shape[0] > 2:
        x[2, 5] = float("nan")
    assert torch.equal(_argmax(x), x.max(dim=-1).indices)
    assert _argmax(x)[0] == shape[1] // 3


def test_the_inverse_cdf_draws_in_proportion_to_the_weights_and_never_a_zero_one():
    """Two levels (chunks of 256 of a 4,096-token row): the counts over 200,000 draws pass a
    chi-square test against the weights' shares (tokens expected 5+ times; the rest pooled), and
    zero weights (whole chunks of them, single tokens between positive ones, the row's last) are
    never drawn, nor for u at the edges of [0, 1)."""
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(4096, generator=g) ** 4
    weights[:700] = 0.0  # whole chunks, and part of the third
    weights[1000:1010] = 0.0
    weights[-1] = 0.0
    draws = 200_000
    u = torch.rand(draws, generator=g, dtype=torch.float64)
    u[:3] = torch.tensor([0.0, 0.5, 1.0 - 2.0 ** -53], dtype=torch.float64)
    tokens = _inverse_cdf(weights.expand(draws, -1), u)
    assert weights[tokens].min() > 0
    expected = draws * weights.double() / weights.double().sum()
    counts = torch.bincount(tokens, minlength=4096).double()
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum().view(1)])
    wanted = torch.cat([expected[big], expected[~big].sum().view(1)])
    chi2, dof = float(((observed - wanted) ** 2 / wanted).sum()), len(wanted) - 1
    assert chi2 < dof + 6 * (2 * dof) ** 0.5, (chi2, dof)  # mean dof, sd sqrt(2 dof)


def test_temperature_sampling_over_a_chunked_vocabulary_follows_the_softmax():
    """The sampler end to end on a 2,048-token row (its two-level draw), temperature 0.7."""
    row = random_logits(1, 2048, seed=5)[0]
    torch.manual_seed(0)
    rows = row.expand(NUM_DRAWS, -1).contiguous()
    tokens = sample(rows, [SamplingParams(temperature=0.7)] * NUM_DRAWS).sampled_token_ids
    freq = torch.bincount(tokens, minlength=2048).float() / NUM_DRAWS
    assert (freq - (row / 0.7).softmax(dim=-1)).abs().max() < FREQ_TOL


def test_forward_does_not_modify_logits():
    logits = random_logits(4, 100, seed=2)
    before = logits.clone()
    sample(logits, [SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.5)] * 4,
           output=[[1, 2]] * 4, suppress=[[3]] * 4)
    assert torch.equal(logits, before)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_samples_softmax_of_scaled_logits(temperature):
    row = random_logits(1, 12, seed=3, scale=1.5)[0]
    expected = (row / temperature).softmax(dim=-1)
    got = empirical_distribution(row, SamplingParams(temperature=temperature))
    assert (got - expected).abs().max() < FREQ_TOL


def test_low_temperature_concentrates_on_the_argmax():
    row = random_logits(1, 12, seed=4, scale=1.5)[0]
    hot = empirical_distribution(row, SamplingParams(temperature=1.0))
    cold = empirical_distribution(row, SamplingParams(temperature=0.1))
    top = row.argmax()
    assert cold[top] > 0.9 and cold[top] > hot[top] + 0.3


@pytest.mark.slow
def test_top_k_never_samples_outside_the_top_k():
    row = random_logits(1, 50, seed=5, scale=1.0)[0]
    got = empirical_distribution(row, SamplingParams(top_k=5))
    expected = hf_distribution(row, TopKLogitsWarper(top_k=5))
    outside = expected == 0
    assert got[outside].sum() == 0
    assert (got - expected).abs().max() < FREQ_TOL


def test_top_k_differs_per_row():
    logits = random_logits(3, 50, seed=6, scale=0.5)
    params = [SamplingParams(top_k=1), SamplingParams(top_k=3), SamplingParams(top_k=0)]
    rows = torch.arange(3).repeat(NUM_DRAWS // 3)
    torch.manual_seed(0)
    tokens = sample(logits[rows], [params[r] for r in rows.tolist()]).sampled_token_ids
    distinct = [set(tokens[rows == r].tolist()) for r in range(3)]
    assert distinct[0] == {logits[0].argmax().item()}
    assert distinct[1] == set(logits[1].topk(3).indices.tolist())
    assert len(distinct[2]) > 10


@pytest.mark.parametrize("top_p", [1.0, 0.999])
def test_top_k_larger_than_the_vocabulary_keeps_every_token(top_p):
    logits = torch.zeros(NUM_DRAWS, 6)
    tokens = sample(logits, [SamplingParams(top_k=100, top_p=top_p)] * NUM_DRAWS).sampled_token_ids
    assert set(tokens.tolist()) == set(range(6))


def test_top_p_samples_the_renormalised_nucleus():
    row = random_logits(1, 40, seed=7, scale=1.5)[0]
    got = empirical_distribution(row, SamplingParams(top_p=0.6))
    expected = hf_distribution(row, TopPLogitsWarper(top_p=0.6))
    assert 1 < int((expected > 0).sum()) < 40  # the nucleus really truncates
    assert got[expected == 0].sum() == 0
    assert (got - expected).abs().max() < FREQ_TOL


@pytest.mark.slow
def test_top_k_then_top_p_matches_applying_both_warpers():
    row = random_logits(1, 40, seed=8, scale=1.0)[0]
    got = empirical_distribution(row, SamplingParams(top_k=8, top_p=0.7))
    filtered = TopKLogitsWarper(top_k=8)(None, row.unsqueeze(0))
    expected = hf_distribution(filtered[0], TopPLogitsWarper(top_p=0.7))
    assert int((expected > 0).sum()) < 8
    assert got[expected == 0].sum() == 0
    assert (got - expected).abs().max() < FREQ_TOL


def test_min_p_drops_tokens_below_fraction_of_the_top_probability():
    row = random_logits(1, 40, seed=9, scale=1.5)[0]
    got = empirical_distribution(row, SamplingParams(min_p=0.1))
    expected = hf_distribution(row, MinPLogitsWarper(min_p=0.1))
    assert 1 < int((expected > 0).sum()) < 40
    assert got[expected == 0].sum() == 0
    assert (got - expected).abs().max() < FREQ_TOL


def test_repetition_penalty_matches_hugging_face_on_prompt_and_output_tokens():
    logits = random_logits(2, 64, seed=10)
    prompt, output = [[1, 5, 9], [2, 2]], [[5, 30], [40]]
    meta = build([SamplingParams(repetition_penalty=1.7), SamplingParams(repetition_penalty=0.8)],
                 prompt=prompt, output=output)
    got = apply_penalties(logits, meta)
    for r, penalty in enumerate([1.7, 0.8]):
        seen = torch.tensor([prompt[r] + output[r]])
        expected = RepetitionPenaltyLogitsProcessor(penalty)(seen, logits[r:r + 1])[0]
        torch.testing.assert_close(got[r], expected)


def test_repetition_penalty_lowers_a_repeated_positive_logit_below_the_runner_up():
    logits = torch.tensor([[0.0, 2.0, 1.5, -1.0]])
    params = [SamplingParams(temperature=0.0, repetition_penalty=1.5)]
    assert sample(logits, params).sampled_token_ids.item() == 1
    assert sample(logits, params, prompt=[[1]]).sampled_token_ids.item() == 2  # 2.0 / 1.5


def test_repetition_penalty_lowers_a_repeated_negative_logit_below_the_runner_up():
    logits = torch.tensor([[-3.0, -1.0, -1.4, -5.0]])
    params = [SamplingParams(temperature=0.0, repetition_penalty=1.5)]
    assert sample(logits, params).sampled_token_ids.item() == 1
    # multiplied, not divided: -1.0 * 1.5 = -1.5 < -1.4
    assert sample(logits, params, output=[[1]]).sampled_token_ids.item() == 2


def test_presence_penalty_counts_once_and_frequency_penalty_counts_every_occurrence():
    logits = torch.tensor([[1.0, 0.9, 0.5, 0.0]])
    prompt, output = [[2, 2, 2]], [[0, 0, 0, 1]]
    presence = build([SamplingParams(presence_penalty=0.3)], prompt=prompt, output=output)
    frequency = build([SamplingParams(frequency_penalty=0.3)], prompt=prompt, output=output)
    # prompt tokens are not penalised by either (OpenAI semantics)
    torch.testing.assert_close(apply_penalties(logits, presence), torch.tensor([[0.7, 0.6, 0.5, 0.0]]))
    torch.testing.assert_close(apply_penalties(logits, frequency), torch.tensor([[0.1, 0.6, 0.5, 0.0]]))
    greedy = dict(prompt=prompt, output=output)
    assert sample(logits, [SamplingParams(temperature=0, presence_penalty=0.3)], **greedy) \
        .sampled_token_ids.item() == 0
    assert sample(logits, [SamplingParams(temperature=0, frequency_penalty=0.3)], **greedy) \
        .sampled_token_ids.item() == 1


def _seeded_run(seed, logits_per_step, position, neighbours):
    """Tokens a seeded row samples over several steps, at ``position`` among ``neighbours``."""
    target = SamplingParams(temperature=1.0, top_k=20, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    tokens = []
    for step_logits in logits_per_step:
        params = list(neighbours)
        params.insert(position, target)
        generators = [None] * len(neighbours)
        generators.insert(position, generator)
        logits = random_logits(len(params), step_logits.numel(), seed=99)
        logits[position] = step_logits
        out = sample(logits, params, generators=generators).sampled_token_ids
        tokens.append(out[position].item())
    return tokens


def test_same_seed_gives_same_tokens_regardless_of_batch_and_position():
    steps = [random_logits(1, 200, seed=20 + i, scale=0.5)[0] for i in range(8)]
    alone = _seeded_run(123, steps, 0, [])
    torch.manual_seed(1)
    among_random = _seeded_run(123, steps, 2, [SamplingParams(temperature=0.9)] * 4)
    torch.manual_seed(2)
    # a top_p neighbour routes the whole batch through the sorting path
    among_mixed = _seeded_run(123, steps, 1, [SamplingParams(temperature=0.0),
                                              SamplingParams(top_p=0.5)])
    assert alone == among_random == among_mixed
    assert len(set(alone)) > 1


def test_different_seeds_give_different_tokens():
    steps = [random_logits(1, 200, seed=20 + i, scale=0.5)[0] for i in range(8)]
    assert _seeded_run(1, steps, 0, []) != _seeded_run(2, steps, 0, [])


def test_suppressed_token_is_never_sampled():
    logits = torch.zeros(NUM_DRAWS, 8)
    logits[:, 3] = 10.0  # almost all mass on token 3
    params = [SamplingParams(temperature=0.0)] * 2 + [SamplingParams(temperature=1.0)] * (NUM_DRAWS - 2)
    suppress = [[3]] * NUM_DRAWS
    suppress[1] = [3, 0, 1, 2, 4, 5, 6]
    tokens = sample(logits, params, suppress=suppress).sampled_token_ids
    assert 3 not in tokens.tolist()
    assert tokens[1].item() == 7
    assert sample(logits[:1], params[:1]).sampled_token_ids.item() == 3


def test_logprobs_are_log_softmax_of_raw_logits_with_sorted_top_ids():
    logits = random_logits(3, 500, seed=30)
    params = [SamplingParams(temperature=0.5, top_p=0.8, logprobs=5, repetition_penalty=2.0),
              SamplingParams(temperature=0.0, logprobs=0),
              SamplingParams(temperature=1.2, min_p=0.05, logprobs=None)]
    out = sample(logits, params, output=[[int(logits[0].argmax())], [], []], suppress=[[], [7], []])
    raw = logits.log_softmax(dim=-1)
    rows = torch.arange(3)
    torch.testing.assert_close(out.logprobs, raw[rows, out.sampled_token_ids])
    assert out.top_token_ids.shape == (3, 5)
    expected_values, expected_ids = raw.sort(dim=-1, descending=True)
    assert torch.equal(out.top_token_ids, expected_ids[:, :5])
    torch.testing.assert_close(out.top_logprobs, expected_values[:, :5])
    assert (out.top_logprobs.diff(dim=-1) <= 0).all()


def test_all_greedy_fast_path_matches_greedy_rows_of_a_mixed_batch():
    logits = random_logits(6, 300, seed=40)
    greedy = [SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5,
                             presence_penalty=0.2)] * 3
    random_rows = [SamplingParams(temperature=0.8, top_k=10, top_p=0.9, min_p=0.05)] * 3
    prompt = [[int(i) for i in logits[r].topk(3).indices] for r in range(6)]
    output = [[int(logits[r].topk(5).indices[-1])] * 2 for r in range(6)]
    suppress = [[int(logits[r].argmax())] for r in range(6)]
    fast_meta = build(greedy, prompt=prompt[:3], output=output[:3], suppress=suppress[:3])
    assert fast_meta.all_greedy
    fast = Sampler()(logits[:3], fast_meta).sampled_token_ids
    # interleave greedy and random rows so the general path handles the greedy ones
    order = [0, 3, 1, 4, 2, 5]
    params = (greedy + random_rows)
    mixed = sample(logits[order], [params[i] for i in order], prompt=[prompt[i] for i in order],
                   output=[output[i] for i in order], suppress=[suppress[i] for i in order])
    assert torch.equal(mixed.sampled_token_ids[[0, 2, 4]], fast)
    # and the fast path is the argmax of the penalised, suppressed logits
    reference = logits[:3].clone()
    for r in range(3):
        reference[r] = RepetitionPenaltyLogitsProcessor(1.3)(
            torch.tensor([prompt[r] + output[r]]), reference[r:r + 1])[0]
        reference[r, output[r][0]] -= 0.5 * 2 + 0.2
        reference[r, suppress[r]] = float("-inf")
    assert torch.equal(fast, reference.argmax(dim=-1))
    assert not torch.equal(fast, logits[:3].argmax(dim=-1))


@pytest.mark.parametrize("candidates", [16, 200])
def test_top_k_top_p_over_candidates_keeps_the_same_tokens_as_the_full_sort(monkeypatch, candidates):
    from engine.sampling import sampler as sampler_module

    monkeypatch.setattr(sampler_module, "TOP_P_CANDIDATES", candidates)
    gen = torch.Generator().manual_seed(candidates)
    rows, vocab = 12, 3000
    # peaked rows (a narrow nucleus) and flat ones (a nucleus wider than the candidates)
    logits = torch.randn(rows, vocab, generator=gen) * torch.tensor([8.0, 0.3] * 6).unsqueeze(1)
    top_p = torch.tensor([0.9, 0.9, 0.5, 0.99, 1.0, 1.0, 0.7, 0.95, 1.0, 0.3, 0.8, 1.0])
    top_k = torch.tensor([0, 0, 5, 0, 10, 0, 20, 2500, 0, 3, 0, 150])
    fast = sampler_module._apply_top_k_top_p(logits, top_k, top_p)
    full = sampler_module._apply_top_k_top_p_sorted(logits, top_k, top_p)
    assert torch.equal(fast.isfinite(), full.isfinite())  # the same kept tokens in every row
    assert torch.equal(fast[fast.isfinite()], logits[fast.isfinite()])  # with their own logits
    assert torch.equal(fast[5], logits[5])  # neither top-k nor top-p: untouched


def test_top_k_ties_at_the_kth_value_beyond_the_candidates_are_all_kept(monkeypatch):
    from engine.sampling import sampler as sampler_module

    monkeypatch.setattr(sampler_module, "TOP_P_CANDIDATES", 8)
    logits = torch.zeros(1, 100)
    logits[0, :3] = torch.tensor([5.0, 4.0, 3.0])  # then 97 tokens tied at 0
    out = sampler_module._apply_top_k_top_p(logits, torch.tensor([5]), torch.tensor([1.0]))
    assert int(out.isfinite().sum()) == 100  # the 5th value (0) is shared by every other token


def test_an_all_greedy_batchs_fields_are_what_the_general_path_writes_for_greedy_rows():
    greedy = [SamplingParams(temperature=0.0, top_k=5, top_p=0.5, min_p=0.1) for _ in range(3)]
    mixed = greedy + [SamplingParams(temperature=0.7, top_p=0.9)]

    shared, general = build(greedy), build(mixed)

    assert shared.all_greedy and not general.all_greedy
    for field in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                  "frequency_penalty"):
        assert torch.equal(getattr(shared, field), getattr(general, field)[:3]), field
    assert build(greedy).temperature is shared.temperature  # made once per row count
    penalised = build([SamplingParams(temperature=0.0, repetition_penalty=1.3)])
    assert penalised.repetition_penalty.tolist() == pytest.approx([1.3])
