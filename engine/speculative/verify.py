"""Verification: the draft's longest prefix the model itself produces, and the model's next token.

A sequence with draft d_1..d_k runs k + 1 rows in one step: its last token and the draft, each
row attending to the rows before it over the paged cache. Row j's logits are the model's
distribution for the token after d_j (row 0: after the last token), and the sampler picks each
row's token t_j exactly as it would without speculation, with that row's own randomness.
Accepted: d_1..d_a while d_{j+1} == t_j; the step emits t_0..t_a (a + 1 tokens).

Why this is exact. t_0 is the model's token for the real context. If d_1 == t_0, row 1's context
is the real one extended by t_0, so t_1 is again the model's token for the real context; and so
on, up to the first disagreement, whose t_a is the model's token there, not the draft's. With
temperature 0 the tokens are the model's argmaxes, and with batch invariance (the fused CPU
step computes each row alone) they are bit for bit those of decoding one token a step. With
temperature > 0 each row samples by the inverse CDF from its own uniform: a seeded request's
noise for the token at position p comes from (seed, p) alone (the sampler's ``row_seeds``), so it
draws the same tokens with or without speculation; an unseeded one draws fresh noise per row,
which is a sample of the model's distribution all the same. A draft token is accepted with
probability p(d) under the model, the acceptance rate of rejection sampling for a draft that
proposes one token with certainty, as prompt lookup does (a draft model's own distribution
would need rejection sampling proper).

Rows after the first disagreement wrote K/V for positions the sequence does not hold: the
scheduler counts only the accepted rows as computed, so those slots are rewritten later and
never read or cached before that.
"""

from __future__ import annotations


def accept(draft: list[int], targets: list[int]) -> int:
    """How many of ``draft`` (k tokens) the model's tokens ``targets`` (k + 1, one per row) keep."""
    for j, token in enumerate(draft):
        if targets[j] != token:
            return j
    return len(draft)
