"""Batched, vectorised next-token sampling.

Order of operations on the logits [S, V]:
suppressed ids -> penalties -> logit_bias -> grammar bitmask -> (greedy rows: argmax) -> temperature -> top-k
-> top-p -> min-p -> exponential-race sample. Every step is skipped when no row
in the batch uses it, so an all-greedy batch without penalties costs one argmax.

Log-probabilities are the log_softmax of the RAW model logits, before
suppression, penalties, temperature and truncation (vLLM's default
"raw_logprobs"): they describe the model, not the sampling distribution.

Sampling draws ``argmax(probs / q)`` with ``q ~ Exp(1)`` per token, which picks
token i with probability ``probs[i] / sum(probs)`` (exponential race, the
Gumbel-max trick in another form). Seeded rows draw their q from their own
generator only, so their token does not depend on the rest of the batch or on
their row position; the runner re-seeds a row's generator from the request's seed and the
position it samples (``row_seeds``), so a token depends on neither the tokens drawn before it nor
a speculative step's discarded rows. Everything stays on ``logits.device``; nothing syncs with
the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampling.sampling_metadata import SamplingMetadata
from engine.structured.bitmask import apply_bitmask


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [S] long
    logprobs: torch.Tensor | None  # [S] float32, raw logprob of the sampled token
    # [S, k] with k = max_num_logprobs (0 allowed), best first; callers slice per row
    top_token_ids: torch.Tensor | None
    top_logprobs: torch.Tensor | None


class Sampler(torch.nn.Module):
    def forward(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        """Pick one token per row of ``logits`` [S, V]; ``logits`` is not modified."""
        logits = logits.float()
        raw_logprobs = None if meta.max_num_logprobs is None else logits.log_softmax(dim=-1)

        if meta.suppress_token_index is not None:
            logits = logits.index_put(meta.suppress_token_index, logits.new_full((), float("-inf")))
        if not meta.no_penalties:
            logits = apply_penalties(logits, meta)
        if meta.logit_bias_index is not None:  # out of place: the caller's logits stay as they are
            logits = logits.index_put(meta.logit_bias_index, meta.logit_bias_values, accumulate=True)
        if meta.grammar_rows is not None:  # constrained rows only; the others are not touched
            logits = apply_bitmask(logits, meta.grammar_rows, meta.grammar_bitmask)

        if meta.all_greedy:
            sampled = _argmax(logits)
        else:
            sampled = _sample_random(logits, meta)
            if not meta.all_random:
                sampled = torch.where(meta.temperature == 0.0, _argmax(logits), sampled)

        if raw_logprobs is None:
            return SamplerOutput(sampled, None, None, None)
        chosen = raw_logprobs.gather(1, sampled.unsqueeze(1)).squeeze(1)
        top_logprobs, top_ids = raw_logprobs.topk(meta.max_num_logprobs, dim=-1)  # sorted
        return SamplerOutput(sampled, chosen, top_ids, top_logprobs)


ARGMAX_CHUNKS = (256, 128, 64, 32)  # the first of these that divides the vocabulary


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the vocabulary, the first of equal maxima (as argmax), in two levels: each
    chunk's maximum (amax, vectorised), the first chunk that holds the row's maximum, then the
    first maximum inside it. torch's CPU max-with-indices and argmax compare one element at a
    time: 32 x 262,144 float32 (Gemma 3's vocabulary) took 6.6 ms against 1.2 ms this way, 32 x
    49,152 1.2 against 0.16 ms (AMD EPYC, 2 threads). A NaN is a maximum in both."""
    s, v = logits.shape
    c = next((c for c in ARGMAX_CHUNKS if v % c == 0 and v > c), None)
    if c is None:
        return logits.max(dim=-1).indices
    chunks = logits.reshape(s, v // c, c)
    first = chunks.amax(dim=-1).argmax(dim=-1)  # [S]
    return first * c + chunks[torch.arange(s, device=logits.device), first].argmax(dim=-1)


def apply_penalties(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """Repetition (HF: prompt + output tokens), then frequency and presence (OpenAI: output only).

    Works on the N (row, token) occurrences only, never on the whole [S, V].
    """
    logits = logits.clone()
    if meta.repetition_token_index is not None:
        rows, tokens = meta.repetition_token_index  # [N]
        seen = logits[rows, tokens]
        penalty = meta.repetition_penalty[rows]
        # divide positive logits, multiply negative ones: both make the token less likely;
        # a token seen twice is written twice with the same value, so it is penalised once
        logits[rows, tokens] = torch.where(seen > 0, seen / penalty, seen * penalty)
    if meta.output_token_index is not None:
        rows, tokens = meta.output_token_index  # [N]
        # every occurrence subtracts the same value, so the order of accumulation is irrelevant
        logits.index_put_((rows, tokens), -meta.frequency_penalty[rows], accumulate=True)
        logits[rows, tokens] = logits[rows, tokens] - meta.presence_penalty[rows]
    return logits


def _sample_random(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p, then the exponential race. Returns [S] long."""
    # greedy rows (temperature 0) divide by 1; their result is replaced by the argmax
    temperature = torch.where(meta.temperature == 0.0, 1.0, meta.temperature)
    logits = logits / temperature.unsqueeze(1)
    if not meta.no_top_p:
        logits = _apply_top_k_top_p(logits, None if meta.no_top_k else meta.top_k, meta.top_p)
    elif not meta.no_top_k:
        logits = _apply_top_k(logits, meta.top_k, meta.max_top_k)

    probs = logits.softmax(dim=-1)  # [S, V]
    if not meta.no_min_p:
        max_prob = probs.amax(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < meta.min_p.unsqueeze(1) * max_prob, 0.0)

    q = torch.empty_like(probs)  # [S, V] Exp(1) race times
    if not meta.all_random_seeded:
        _exponential_(q, None)  # one batched draw for the unseeded rows
    for row in meta.seeded_rows:
        generator = meta.generators[row]
        if meta.row_seeds is not None and meta.row_seeds[row] is not None:
            generator.manual_seed(meta.row_seeds[row])
        _exponential_(q[row], generator)
    return _argmax(probs.div_(q))


def _exponential_(q: torch.Tensor, generator: torch.Generator | None) -> None:
    """Fill ``q`` with Exp(1) samples in place."""
    if q.is_cuda:
        q.exponential_(generator=generator)
    else:
        # -log(U), U in [0, 1): same law, 6x faster than exponential_ on CPU; U == 0 gives
        # q == inf, which only makes that token lose the race
        q.uniform_(generator=generator).log_().neg_()


def _apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """Keep the top_k largest logits per row (ties with the k-th kept); top_k 0 keeps all."""
    vocab_size = logits.shape[1]
    top_values = logits.topk(min(max_top_k, vocab_size), dim=-1).values  # [S, max_k], descending
    k = top_k.clamp(max=top_values.shape[1])
    kth = top_values.gather(1, (k - 1).clamp(min=0).unsqueeze(1))  # [S, 1]
    kth = kth.masked_fill((k == 0).unsqueeze(1), float("-inf"))
    return logits.masked_fill(logits < kth, float("-inf"))


# A row's top-p nucleus (and top-k set) is looked for among its this many most likely tokens
# first; only a row whose nucleus is wider sorts its whole vocabulary (SmolLM2's 49,152 at 32
# rows: the sort was half of a decode step).
TOP_P_CANDIDATES = 1024


def _apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                       top_p: torch.Tensor) -> torch.Tensor:
    """Top-k, then the smallest nucleus of the renormalised rest with mass >= top_p.

    Per row, over the TOP_P_CANDIDATES largest logits where they hold the answer: the top-k set
    when k fits in them, or a nucleus whose mass they reach (normalised over the whole row). A
    row where they do not falls back to the full sort; rows with neither top-k nor top-p pass
    untouched. Each row's path depends on that row alone. CPU only: choosing the rows reads
    their masks on the host."""
    vocab_size = logits.shape[1]
    c = min(TOP_P_CANDIDATES, vocab_size)
    if c == vocab_size or logits.device.type != "cpu":  # a GPU sorts fast, and must not sync here
        return _apply_top_k_top_p_sorted(logits, top_k, top_p)
    k = (torch.full_like(top_p, vocab_size, dtype=torch.long) if top_k is None
         else torch.where(top_k == 0, vocab_size, top_k.clamp(max=vocab_size)))  # [S]
    vals, idx = logits.topk(c, dim=-1)  # [S, c], descending
    kth = vals.gather(1, (k.clamp(max=c) - 1).unsqueeze(1))  # [S, 1]
    # the top-k set lies in the candidates, ties with the k-th value included
    k_inside = (k <= c) & (vals[:, -1] < kth[:, 0])
    vals = vals.masked_fill(k_inside.unsqueeze(1) & (vals < kth), float("-inf"))
    lse = torch.where(k_inside, vals.logsumexp(dim=-1), logits.logsumexp(dim=-1))  # [S]
    probs = (vals - lse.unsqueeze(1)).exp()  # [S, c], of the row's renormalised distribution
    mass_before = probs.cumsum(dim=-1) - probs
    nucleus = (top_p < 1.0).unsqueeze(1)
    vals = vals.masked_fill((mass_before >= top_p.unsqueeze(1)) & nucleus, float("-inf"))
    covered = k_inside | ((k == vocab_size) & (top_p < 1.0) & (probs.sum(dim=-1) >= top_p))
    out = torch.full_like(logits, float("-inf")).scatter_(1, idx, vals)
    untouched = (k == vocab_size) & (top_p >= 1.0)
    if untouched.any():
        out[untouched] = logits[untouched]
    wide = ~(covered | untouched)
    if wide.any():
        rows = wide.nonzero().squeeze(1)
        out[rows] = _apply_top_k_top_p_sorted(logits[rows], None if top_k is None else top_k[rows],
                                              top_p[rows])
    return out


def _apply_top_k_top_p_sorted(logits: torch.Tensor, top_k: torch.Tensor | None,
                              top_p: torch.Tensor) -> torch.Tensor:
    """_apply_top_k_top_p over the whole vocabulary, sorted."""
    vocab_size = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [S, V]
    if top_k is not None:
        # same tie rule as _apply_top_k (threshold on the k-th value), so a row's result
        # does not depend on which path the rest of the batch selects
        k = torch.where(top_k == 0, vocab_size, top_k.clamp(max=vocab_size))
        kth = sorted_logits.gather(1, (k - 1).unsqueeze(1))  # [S, 1]
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [S, V], exclusive prefix sum
    # a token joins the nucleus while the mass above it is still short of top_p; rows with
    # top_p == 1 are left untouched so rounding in the cumsum can never trim their tail
    remove = (mass_before >= top_p.unsqueeze(1)) & (top_p < 1.0).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)

