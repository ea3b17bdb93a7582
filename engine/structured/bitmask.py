"""The allowed-token bitmask of a step's constrained rows: filled on the host, applied in the sampler.

Bit ``t % 32`` of word ``t // 32`` of a row is 1 when token t is allowed (llguidance's layout).
Only constrained rows get a mask; a batch without any pays nothing.
"""

from __future__ import annotations

import torch

PARALLEL_FILL_ROWS = 8  # constrained rows from which the mask fill runs on llguidance's threads


def fill_bitmask(grammars: list) -> tuple[list[int], torch.Tensor]:
    """(rows [R] of ``grammars`` that are constrained, their masks [R, ceil(V/32)] int32 on the host)."""
    rows = [i for i, g in enumerate(grammars) if g is not None]
    for row in rows:
        if grammars[row].matcher is None:
            raise ValueError(f"the request's grammar did not compile: {grammars[row].error}")
    compiler = grammars[rows[0]].compiler
    words = (compiler.vocab_size + 31) // 32
    bitmask = torch.empty((len(rows), words), dtype=torch.int32)  # [R, W]
    # Row k's mask is written at data_ptr + k * row bytes. Few rows are filled here, serially
    # (tens of us each); more go to llguidance's thread pool, whose threads only pay off then.
    # (llguidance.torch wraps both, but importing it loads torch.compile: ~3 s.)
    if len(rows) < PARALLEL_FILL_ROWS:
        for k, row in enumerate(rows):
            grammars[row].matcher.unsafe_compute_mask_ptr(bitmask.data_ptr() + k * words * 4, words * 4)
    else:
        compiler.mask_executor().unsafe_compute_mask_ptr(
            [(grammars[row].matcher, k) for k, row in enumerate(rows)], bitmask.data_ptr(), words * 4, len(rows))
    return rows, bitmask


def apply_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """``logits`` [S, V] with the disallowed tokens of ``rows`` [R] at -inf (a new tensor);
    ``bitmask`` [R, W] int32 on the logits' device."""
    vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)  # [R, W * 32]
    if allowed.shape[1] < vocab:  # ids past the tokenizer's vocabulary are never allowed
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    masked = logits[rows].masked_fill(~allowed[:, :vocab], float("-inf"))  # [R, V]
    return logits.index_put((rows,), masked)
