"""Batched, vectorised next-token sampling.

Order of operations on the logits [S, V]:
suppressed ids -> penalties -> logit_bias -> grammar bitmask -> (greedy rows: argmax) -> temperature -> top-k
-> top-p -> min-p -> inverse-CDF sample. Every step is skipped when no row
in the batch uses it, so an all-greedy batch without penalties costs one argmax.

Log-probabilities are the log_softmax of the RAW model logits, before
suppression, penalties, temperature and truncation (vLLM's default
"raw_logprobs"): they describe the model, not the sampling distribution.

Sampling draws one uniform u per row and takes the first token whose cumulative weight exceeds u
times the row's total (the inverse CDF: token i with probability ``probs[i] / sum(probs)``), over
exp(x - max) computed in place, chunk totals in float64, then the chosen chunk's own cumulative
sum. An exponential race drew a random number for every token instead: 32 rows of Gemma 3's
262,144-entry vocabulary took 96 ms a step at temperature 0.8 (more than the forward), the
random numbers most of it. Seeded rows draw their u from their own generator only, so their token
does not depend on the rest of the batch or on their row position; the runner re-seeds a row's
generator from the request's seed and the position it samples (``row_seeds``), so a token depends
on neither the tokens drawn before it nor a speculative step's discarded rows. Everything stays
on ``logits.device``; nothing syncs with the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kept_buffer import KeptBuffer
from engine.kernels.cpu import native
from engine.sampling.sampling_metadata import SamplingMetadata
from engine.structured.bitmask import apply_bitmask


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [S] long
    logprobs: torch.Tensor | None  # [S] float32, raw logprob of the sampled token
    # [S, k] with k = max_num_logprobs (0 allowed), best first; callers slice per row
    top_token_ids: torch.Tensor | None
    top_logprobs: torch.Tensor | None


SCRATCH_BYTES = 64 << 20  # the most a Sampler keeps for its [S, V] float32 work (else per call)


class Sampler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self._scratch = KeptBuffer(torch.float32, SCRATCH_BYTES)  # see _work

    def _work(self, like: torch.Tensor) -> torch.Tensor:
        """A float32 tensor of ``like``'s shape to compute in, kept up to SCRATCH_BYTES
        (engine/kept_buffer.py: a fresh [32, 262,144] one was ~15 ms a step)."""
        return self._scratch.take(*like.shape, device=like.device)

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
            sampled = self._sample_random(logits, meta)
            if not meta.all_random:
                sampled = torch.where(meta.temperature == 0.0, _argmax(logits), sampled)

        if raw_logprobs is None:
            return SamplerOutput(sampled, None, None, None)
        chosen = raw_logprobs.gather(1, sampled.unsqueeze(1)).squeeze(1)
        top_logprobs, top_ids = raw_logprobs.topk(meta.max_num_logprobs, dim=-1)  # sorted
        return SamplerOutput(sampled, chosen, top_ids, top_logprobs)

    def _sample_random(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Temperature, top-k, top-p, min-p, then one uniform per row through the inverse CDF.
        Returns [S] long. On a CPU a row whose top-k set or top-p nucleus lies in its
        TOP_P_CANDIDATES largest logits draws among those alone (no [S, V] tensor but the scaled
        logits; 32 rows of a 262,144-entry vocabulary: the whole-row filter was 110 ms a step)."""
        # greedy rows (temperature 0) divide by 1; their result is replaced by the argmax
        temperature = torch.where(meta.temperature == 0.0, 1.0, meta.temperature).unsqueeze(1)
        scaled = torch.div(logits, temperature, out=self._work(logits))
        u = _uniforms(meta, logits.shape[0], logits.device)
        min_p = None if meta.no_min_p else meta.min_p
        if meta.no_top_p and meta.no_top_k:
            return _draw(scaled, min_p, u)
        top_k = None if meta.no_top_k else meta.top_k
        top_p = torch.ones_like(meta.temperature) if meta.no_top_p else meta.top_p
        if logits.device.type != "cpu" or min(TOP_P_CANDIDATES, logits.shape[1]) == logits.shape[1]:
            return _draw(_filter(scaled, top_k, top_p, meta), min_p, u)
        vals, idx, covered, _ = _top_candidates(scaled, top_k, top_p)
        tokens = idx.gather(1, _draw(vals, min_p, u).unsqueeze(1)).squeeze(1)
        if not covered.all():  # the rest over their whole rows (CPU: reads the mask on the host)
            rows = (~covered).nonzero().squeeze(1)
            tokens[rows] = _draw(_filter(scaled[rows], None if top_k is None else top_k[rows], top_p[rows],
                                         meta), None if min_p is None else min_p[rows], u[rows])
        return tokens


ARGMAX_CHUNKS = (256, 128, 64, 32)  # the first of these that divides the vocabulary


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the vocabulary, the first of equal maxima (as argmax), in two levels: each
    chunk's maximum (amax, vectorised), the first chunk that holds the row's maximum, then the
    first maximum inside it. torch's CPU max-with-indices and argmax compare one element at a
    time: 32 x 262,144 float32 (Gemma 3's vocabulary) took 6.6 ms against 1.2 ms this way, 32 x
    49,152 1.2 against 0.16 ms (AMD EPYC, 2 threads). A NaN is a maximum in both."""
    s, v = logits.shape
    if (logits.device.type == "cpu" and logits.dtype is torch.float32 and logits.stride(1) == 1
            and (lib := native.library()) is not None):  # step_rows.c: one stream's ~50 us -> ~5
        out = torch.empty(s, dtype=torch.long)
        lib.pagoda_argmax_rows(logits.data_ptr(), s, v, logits.stride(0), out.data_ptr(), torch.get_num_threads())
        return out
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



def _draw(scaled: torch.Tensor, min_p: torch.Tensor | None, u: torch.Tensor) -> torch.Tensor:
    """A token per row of ``scaled`` (temperature-scaled logits, -inf for tokens filtered out;
    overwritten): exp(x - max) in place, min-p relative to the row's most likely token, then the
    inverse CDF at ``u``."""
    weights = scaled.sub_(scaled.amax(dim=-1, keepdim=True)).exp_()
    if min_p is not None:
        weights.masked_fill_(weights < min_p.unsqueeze(1), 0.0)
    return _inverse_cdf(weights, u)


def _filter(scaled: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor,
            meta: SamplingMetadata) -> torch.Tensor:
    """Whole rows with top-k and top-p applied (-inf outside), a new tensor."""
    if meta.no_top_p:
        return _apply_top_k(scaled, top_k, meta.max_top_k)
    return _apply_top_k_top_p(scaled, top_k, top_p)


def _uniforms(meta: SamplingMetadata, rows: int, device: torch.device) -> torch.Tensor:
    """[S] float64 uniforms in [0, 1), one per row: a seeded row's from its own generator (re-seeded
    from the request's seed and the position it samples where ``row_seeds`` says), the others from
    the shared RNG in one draw."""
    u = torch.rand(rows, dtype=torch.float64, device=device)
    for row in meta.seeded_rows:
        generator = meta.generators[row]
        if meta.row_seeds is not None and meta.row_seeds[row] is not None:
            generator.manual_seed(meta.row_seeds[row])
        u[row] = torch.rand(1, generator=generator, dtype=torch.float64, device=device)[0]
    return u


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of ``weights`` [S, V] (non-negative, some positive), the first token whose cumulative
    weight exceeds u times the row's total: a draw from weights / sum(weights). In two levels:
    chunk totals and the chunk they point to, then that chunk's own cumulative sum in float64, so
    no [S, V] float64 tensor is made (a vocabulary of no chunk size: one chunk). A zero weight is
    never chosen, rounding included."""
    s, v = weights.shape
    c = next((c for c in ARGMAX_CHUNKS if v % c == 0 and v > c), v)
    chunks = weights.reshape(s, v // c, c)
    # chunk totals summed in float32 (a float64 sum converts every element: 35 ms against 0.75 ms
    # at 32 x 262,144), added up in float64; a total off by its float32 rounding (~1e-7 of the
    # chunk's mass) can only move a draw onto the chunk's last positive weight
    ends = chunks.sum(dim=-1).double().cumsum(dim=-1)  # [S, n] cumulative chunk totals
    total = ends[:, -1:]
    target = torch.minimum(u.unsqueeze(1) * total, torch.nextafter(total, torch.zeros_like(total)))
    j = torch.searchsorted(ends, target, right=True)  # [S, 1] the first chunk ending past target
    start = torch.where(j > 0, ends.gather(1, (j - 1).clamp(min=0)), torch.zeros_like(target))
    inner = chunks[torch.arange(s, device=weights.device), j[:, 0]].double().cumsum(dim=-1)  # [S, c]
    i = torch.searchsorted(inner, target - start, right=True)
    last = (inner < inner[:, -1:]).sum(dim=-1, keepdim=True)  # the chunk's last positive weight
    return (j * c + torch.minimum(i, last))[:, 0]


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
    vals, idx, covered, untouched = _top_candidates(logits, top_k, top_p)
    out = torch.full_like(logits, float("-inf")).scatter_(1, idx, vals)
    if untouched.any():
        out[untouched] = logits[untouched]
    wide = ~(covered | untouched)
    if wide.any():
        rows = wide.nonzero().squeeze(1)
        out[rows] = _apply_top_k_top_p_sorted(logits[rows], None if top_k is None else top_k[rows],
                                              top_p[rows])
    return out


def _top_candidates(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor):
    """_apply_top_k_top_p's candidates (CPU, fewer than the vocabulary): vals [S, c] descending,
    -inf outside a covered row's kept set, their token ids idx [S, c], and which rows they cover
    (their top-k set or nucleus lies in them) or leave untouched (no top-k, top-p 1)."""
    vocab_size = logits.shape[1]
    c = min(TOP_P_CANDIDATES, vocab_size)
    k = (torch.full_like(top_p, vocab_size, dtype=torch.long) if top_k is None
         else torch.where(top_k == 0, vocab_size, top_k.clamp(max=vocab_size)))  # [S]
    vals, idx = logits.topk(c, dim=-1)  # [S, c], descending
    kth = vals.gather(1, (k.clamp(max=c) - 1).unsqueeze(1))  # [S, 1]
    # the top-k set lies in the candidates, ties with the k-th value included
    k_inside = (k <= c) & (vals[:, -1] < kth[:, 0])
    vals = vals.masked_fill(k_inside.unsqueeze(1) & (vals < kth), float("-inf"))
    nucleus_rows = top_p < 1.0
    lse = vals.logsumexp(dim=-1)  # [S]: a top-k row's whole mass; a nucleus's needs the row's
    if (nucleus_rows & ~k_inside).any():  # (the whole row's exp: 13 ms at 32 x 262,144, skipped
        lse = torch.where(k_inside, lse, logits.logsumexp(dim=-1))  # for top-k alone)
    probs = (vals - lse.unsqueeze(1)).exp()  # [S, c], of the row's renormalised distribution
    mass_before = probs.cumsum(dim=-1) - probs
    vals = vals.masked_fill((mass_before >= top_p.unsqueeze(1)) & nucleus_rows.unsqueeze(1), float("-inf"))
    covered = k_inside | ((k == vocab_size) & nucleus_rows & (probs.sum(dim=-1) >= top_p))
    return vals, idx, covered, (k == vocab_size) & (top_p >= 1.0)


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

