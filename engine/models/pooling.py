"""One vector per sequence from an encoder's token states, as sentence-transformers' Pooling and
Normalize modules compute it, over the packed layout of engine/models/bert.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pool(hidden: torch.Tensor, lengths: list[int], mode: str, normalize: bool) -> torch.Tensor:
    """hidden: [num_tokens, H], the sequences back to back -> [num_seqs, H] float32.

    mean: the average of every token's state (sentence-transformers' attention-masked mean; a
    packed batch has no padding); cls: the first token's; lasttoken: the last one's; max: the
    elementwise maximum. ``normalize``: each vector scaled to unit L2 norm.
    """
    hidden = hidden.float()
    num_seqs = len(lengths)
    lens = torch.tensor(lengths, device=hidden.device)
    starts = lens.cumsum(0) - lens
    if mode == "cls":
        out = hidden.index_select(0, starts)
    elif mode == "lasttoken":
        out = hidden.index_select(0, starts + lens - 1)
    else:
        seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=hidden.device), lens)
        if mode == "mean":
            out = hidden.new_zeros(num_seqs, hidden.shape[1]).index_add_(0, seq_of_token, hidden)
            out = out / lens[:, None].to(out.dtype)
        elif mode == "max":
            out = hidden.new_full((num_seqs, hidden.shape[1]), float("-inf"))
            out = out.scatter_reduce(0, seq_of_token[:, None].expand_as(hidden), hidden, "amax")
        else:
            raise ValueError(f"unknown pooling mode {mode!r}")
    return F.normalize(out, p=2, dim=-1) if normalize else out
