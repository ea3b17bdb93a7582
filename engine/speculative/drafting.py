"""Which sequences draft in a step, and how many tokens: prompt lookup (or a draft model,
draft_model.py) under a per-request and a per-batch brake.

Per request: a draft of k tokens costs k more rows in the step whether or not they are accepted.
A sequence drafts ``num_tokens`` at most; after a verification it drafts one more than it had
accepted (all accepted: twice as many, up to the most), and after a draft rejected whole it
pauses 1, 2, 4 .. 64 steps before it looks again. Free-form text, where lookup rarely guesses,
so pays ~one row every 64 steps; a quoting answer drafts long runs.

Per batch: speculation trades arithmetic for weight reads. One stream reads every weight for one
token, so extra rows are nearly free; a step of many decodes is already compute-bound, and extra
rows would slow everyone. Steps with more than ``max_decodes`` decoding sequences draft nothing.

Only requests whose next token depends on nothing but the model's logits draft: not under a
grammar (its state advances per token), penalties (they count earlier tokens), a LoRA adapter,
or before ``min_tokens`` (suppression counts tokens too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.speculative.ngram import TokenBuffer, propose
from engine.scheduling.sequence import Sequence

if TYPE_CHECKING:
    from engine.speculative.draft_model import DraftModel

MAX_PAUSE_STEPS = 64


class DraftState:
    """A sequence's drafting state: its packed ids, current draft length and pause."""

    __slots__ = ("buffer", "length", "misses", "resume_at")

    def __init__(self, length: int) -> None:
        self.buffer = TokenBuffer()
        self.length = length
        self.misses = 0  # drafts rejected whole in a row
        self.resume_at = 0  # the scheduler step from which it drafts again


class Speculator:
    def __init__(self, *, num_tokens: int, max_decodes: int, min_n: int = 2, max_n: int = 4,
                 proposer: DraftModel | None = None):
        self.num_tokens = num_tokens
        self.max_decodes = max_decodes
        self.proposer = proposer  # a draft model (draft_model.py), in place of prompt lookup
        self._prepared: dict[int, list[int]] = {}  # a draft model's drafts for this step, by id(seq)
        self.min_n, self.max_n = min_n, max_n
        # all time: verifications (steps x sequences that drafted), draft tokens, accepted ones
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0

    def prepare(self, decodes: list[Sequence], *, step: int) -> None:
        """Before a step's drafts: a draft model drafts for all of ``decodes`` that may draft at
        once (one batch of its engine's rows, not one run a sequence); draft() then hands each
        its share, cut to the step's budget. Prompt lookup needs nothing here."""
        self._prepared = {}
        if self.proposer is None:
            return
        wanted = [(seq, room) for seq in decodes if (room := self._room(seq, step, budget=None)) > 0]
        if len(wanted) > 1:
            drafts = self.proposer.propose_many([(seq.token_ids, room) for seq, room in wanted])
            self._prepared = {id(seq): tokens for (seq, _), tokens in zip(wanted, drafts)}

    def draft(self, seq: Sequence, *, step: int, budget: int) -> list[int]:
        """Draft tokens for ``seq``'s next step (it decodes one token, ``budget`` tokens are left
        in the step), or []."""
        room = self._room(seq, step, budget)
        if room <= 0:
            return []
        if self.proposer is not None:
            prepared = self._prepared.pop(id(seq), None)
            return prepared[:room] if prepared is not None else self.proposer.propose(seq.token_ids, room)
        state = self._state(seq)
        state.buffer.sync(seq.token_ids)
        return propose(state.buffer, room, min_n=self.min_n, max_n=self.max_n)

    def _room(self, seq: Sequence, step: int, budget: int | None) -> int:
        """How many tokens ``seq`` may draft this step (0: none)."""
        params = seq.params
        if (seq.grammar is not None or params.has_penalties or seq.adapter is not None
                or seq.num_output_tokens < params.min_tokens or seq.max_num_tokens is None):
            return 0
        state = self._state(seq)
        if step < state.resume_at:
            return 0
        # accepted drafts plus the token after them must fit the request's length
        room = min(state.length, seq.max_num_tokens - seq.num_tokens - 1)
        return room if budget is None else min(room, budget - 1)

    def record(self, seq: Sequence, num_draft: int, num_accepted: int, *, step: int) -> None:
        """After ``seq``'s draft of ``num_draft`` tokens was verified: ``num_accepted`` kept."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        state = self._state(seq)
        if num_accepted == num_draft:
            state.length = min(self.num_tokens, 2 * state.length)
        else:
            state.length = max(1, min(self.num_tokens, num_accepted + 1))
        if num_accepted:
            state.misses = 0
        else:
            state.misses += 1
            state.resume_at = step + min(MAX_PAUSE_STEPS, 1 << (state.misses - 1)) + 1

    def _state(self, seq: Sequence) -> DraftState:
        if seq.draft_state is None:
            seq.draft_state = DraftState(self.num_tokens)
        return seq.draft_state
