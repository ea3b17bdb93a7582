"""Per-step sampling parameters of a batch, packed into device tensors once.

The model runner builds one ``SamplingMetadata`` per step for the S sequences
that sample; ``engine.sampling.sampler.Sampler`` consumes it. Python-side flags
let the sampler skip every feature no row in the batch uses. Its tensors are read,
never written: an all-greedy batch's field tensors are shared (``_neutral``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from engine.sampling_params import SamplingParams
from engine.structured.bitmask import fill_bitmask

# (row ids [N] long, token ids [N] long): one entry per (row, token) occurrence
TokenIndex = tuple[torch.Tensor, torch.Tensor]


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor  # [S] float32, 0 for greedy rows
    top_k: torch.Tensor  # [S] long, 0 = off
    top_p: torch.Tensor  # [S] float32, 1 = off
    min_p: torch.Tensor  # [S] float32, 0 = off
    repetition_penalty: torch.Tensor  # [S] float32, 1 = off
    presence_penalty: torch.Tensor  # [S] float32, 0 = off
    frequency_penalty: torch.Tensor  # [S] float32, 0 = off
    # per row: a seeded generator on the logits' device, or None for the shared RNG
    generators: list[torch.Generator | None]
    prompt_token_ids: list[list[int]]
    output_token_ids: list[list[int]]
    suppress_token_ids: list[list[int]]  # logits forced to -inf this step (min_tokens)
    max_num_logprobs: int | None  # None: no row asked for logprobs
    max_top_k: int  # largest top_k of a random row, 0 if none
    all_greedy: bool
    all_random: bool
    no_top_k: bool
    no_top_p: bool
    no_min_p: bool
    no_penalties: bool
    seeded_rows: list[int]  # random rows that draw from their own generator
    all_random_seeded: bool  # no random row uses the shared RNG
    # Device-side flattened token lists, built only when some row needs them:
    # prompt + output tokens of the rows with a repetition penalty, and output
    # tokens of the rows with a presence or frequency penalty.
    repetition_token_index: TokenIndex | None
    output_token_index: TokenIndex | None
    suppress_token_index: TokenIndex | None
    # Grammar-constrained rows (engine/structured): their indices [R] long and allowed-token
    # bitmasks [R, ceil(V/32)] int32 on the device; None when no row is constrained.
    grammar_rows: torch.Tensor | None = None
    # logit_bias: (row ids [N], token ids [N]) and the biases [N] float32 added there
    logit_bias_index: TokenIndex | None = None
    logit_bias_values: torch.Tensor | None = None
    grammar_bitmask: torch.Tensor | None = None
    # per row: the seed its generator is re-seeded with before the row's noise is drawn (the
    # request's seed mixed with the sampled position); None: the generator is used as it is
    row_seeds: list[int | None] | None = None

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        prompt_token_ids: list[list[int]],
        output_token_ids: list[list[int]],
        generators: list[torch.Generator | None],
        suppress_token_ids: list[list[int]],
        device: torch.device | str,
        grammars: list | None = None,
        row_seeds: list[int | None] | None = None,
    ) -> SamplingMetadata:
        num_rows = len(params)
        assert len(prompt_token_ids) == len(output_token_ids) == len(generators) \
            == len(suppress_token_ids) == num_rows
        if grammars is not None:  # a grammar decides where its row may end (min_tokens yields)
            suppress_token_ids = [[] if g is not None else s for s, g in zip(suppress_token_ids, grammars)]
        greedy = [p.is_greedy for p in params]
        # Truncation knobs of greedy rows are irrelevant: neutralise them so the
        # flags below only look at rows that actually sample.
        floats = [
            [0.0 if g else float(p.temperature) for p, g in zip(params, greedy)],
            [1.0 if g else float(p.top_p) for p, g in zip(params, greedy)],
            [0.0 if g else float(p.min_p) for p, g in zip(params, greedy)],
            [float(p.repetition_penalty) for p in params],
            [float(p.presence_penalty) for p in params],
            [float(p.frequency_penalty) for p in params],
        ]
        top_k = [0 if g else p.top_k for p, g in zip(params, greedy)]
        has_rep = [p.repetition_penalty != 1.0 for p in params]
        has_additive = [p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params]
        if all(greedy) and not any(has_rep) and not any(has_additive):
            (temperature, top_p, min_p, rep, presence, frequency), top_k_rows = _neutral(num_rows, str(device))
        else:  # [6, S]: one host-to-device copy for every float field
            float_table = torch.tensor(floats, dtype=torch.float32, device=device)
            temperature, top_p, min_p, rep, presence, frequency = float_table.unbind(0)
            top_k_rows = torch.tensor(top_k, dtype=torch.long, device=device)
        requested = [p.logprobs for p in params if p.logprobs is not None]
        seeded_rows = [i for i, (g, gen) in enumerate(zip(greedy, generators))
                       if not g and gen is not None]

        grammar_rows = grammar_bitmask = None
        if grammars is not None and any(g is not None for g in grammars):
            rows, bitmask = fill_bitmask(grammars)
            grammar_rows = torch.tensor(rows, dtype=torch.long, device=device)
            grammar_bitmask = bitmask.to(device)

        bias_index = bias_values = None
        if any(p.logit_bias for p in params):
            bias_index = _token_index([list(p.logit_bias or ()) for p in params], device)
            bias_values = torch.tensor([b for p in params for b in (p.logit_bias or {}).values()],
                                       dtype=torch.float32, device=device)

        return cls(
            row_seeds=row_seeds,
            logit_bias_index=bias_index,
            logit_bias_values=bias_values,
            grammar_rows=grammar_rows,
            grammar_bitmask=grammar_bitmask,
            temperature=temperature,
            top_k=top_k_rows,
            top_p=top_p,
            min_p=min_p,
            repetition_penalty=rep,
            presence_penalty=presence,
            frequency_penalty=frequency,
            generators=list(generators),
            prompt_token_ids=prompt_token_ids,
            output_token_ids=output_token_ids,
            suppress_token_ids=suppress_token_ids,
            max_num_logprobs=max(requested) if requested else None,
            max_top_k=max(top_k, default=0),
            all_greedy=all(greedy),
            all_random=not any(greedy),
            no_top_k=not any(top_k),
            no_top_p=all(x == 1.0 for x in floats[1]),
            no_min_p=all(x == 0.0 for x in floats[2]),
            no_penalties=not any(has_rep) and not any(has_additive),
            seeded_rows=seeded_rows,
            all_random_seeded=len(seeded_rows) == greedy.count(False),
            repetition_token_index=_token_index(
                [prompt + output if r else [] for prompt, output, r
                 in zip(prompt_token_ids, output_token_ids, has_rep)], device)
            if any(has_rep) else None,
            output_token_index=_token_index(
                [output if a else [] for output, a in zip(output_token_ids, has_additive)], device)
            if any(has_additive) else None,
            suppress_token_index=_token_index(suppress_token_ids, device)
            if any(suppress_token_ids) else None,
        )


@functools.lru_cache(maxsize=256)
def _neutral(num_rows: int, device: str) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The field tensors of ``num_rows`` greedy rows without penalties (temperature, top_p,
    min_p, the three penalties; top_k), made once per row count: the sampler only reads them, and
    an all-greedy step (one stream's every step) then makes no tensor here (two torch.tensor and
    an unbind a step, each tens of us with the caches cold after the weights streamed through)."""
    floats = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float32)
    table = floats[:, None].expand(6, num_rows).contiguous().to(device)
    return table.unbind(0), torch.zeros(num_rows, dtype=torch.long, device=device)


def _token_index(token_lists: list[list[int]], device: torch.device | str) -> TokenIndex:
    """Flatten per-row token lists into (row ids [N], token ids [N]) on ``device``."""
    lengths = [len(ids) for ids in token_lists]
    total = sum(lengths)
    # np.fromiter reads Python ints ~4x faster than torch.tensor(list)
    flat = np.fromiter(chain.from_iterable(token_lists), dtype=np.int64, count=total)
    tokens = torch.from_numpy(flat).to(device)
    counts = torch.tensor(lengths, dtype=torch.long, device=device)
    rows = torch.arange(len(token_lists), device=device)
    # output_size avoids a device-to-host sync on CUDA
    return rows.repeat_interleave(counts, output_size=total), tokens
