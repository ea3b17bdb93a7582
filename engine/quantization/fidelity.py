"""How closely a quantized model follows its float reference on greedy decoding.

The candidate generates greedily; the reference then reads prompt + generated tokens in one
teacher-forced pass, and at each generated position we ask whether the generated token is the
reference's argmax (top-1 agreement) and within its five most likely tokens (top-5 containment).
Models are given as callables ``logits(token_ids) -> [len(token_ids), vocab]`` so any model
(engine, transformers, a bare module) can be measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

LogitsFn = Callable[[list[int]], torch.Tensor]


@dataclass(frozen=True)
class Fidelity:
    num_tokens: int
    num_top1: int
    num_top5: int

    @property
    def top1(self) -> float:
        return self.num_top1 / max(self.num_tokens, 1)

    @property
    def top5(self) -> float:
        return self.num_top5 / max(self.num_tokens, 1)

    def __add__(self, other: Fidelity) -> Fidelity:
        return Fidelity(self.num_tokens + other.num_tokens, self.num_top1 + other.num_top1,
                        self.num_top5 + other.num_top5)


@torch.no_grad()
def greedy_generate(logits: LogitsFn, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation by full re-reads (no KV cache): for small models and tests."""
    ids = list(prompt)
    for _ in range(max_new_tokens):
        ids.append(int(logits(ids)[-1].argmax()))
    return ids[len(prompt):]


@torch.no_grad()
def teacher_forced_fidelity(reference: LogitsFn, prompt: Sequence[int],
                            generated: Sequence[int]) -> Fidelity:
    """Score `generated` (the candidate's greedy tokens after `prompt`) against the reference."""
    if not generated:
        return Fidelity(0, 0, 0)
    ids = list(prompt) + list(generated)
    # row p of the logits predicts token p + 1: [num_generated, vocab]
    rows = reference(ids[:-1])[len(prompt) - 1:].float()
    target = torch.tensor(generated, device=rows.device)
    top5 = rows.topk(5, dim=-1).indices
    return Fidelity(len(generated), int((rows.argmax(-1) == target).sum()),
                    int((top5 == target[:, None]).any(-1).sum()))


def compare_greedy(candidate: LogitsFn, reference: LogitsFn, prompts: Sequence[Sequence[int]],
                   max_new_tokens: int) -> Fidelity:
    """Candidate generates greedily from each prompt; totals over all prompts."""
    total = Fidelity(0, 0, 0)
    for prompt in prompts:
        total = total + teacher_forced_fidelity(
            reference, prompt, greedy_generate(candidate, prompt, max_new_tokens))
    return total
