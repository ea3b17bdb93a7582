"""One request's token state as the scheduler and block manager see it (no torch here)."""

from __future__ import annotations

import enum
import itertools
import time

from engine.lora.request import LoRARequest
from engine.sampling_params import SamplingParams
from engine.tenancy import Tenant

_arrival_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Prompt plus generated tokens, how many of them have KV in the cache, and where.

    ``num_computed_tokens`` counts tokens whose K/V are in the cache; the tokens
    from there to ``num_tokens`` are what the next step must feed through the model
    (the whole prompt at first, in chunks if needed; then one token per decode step).

    ``tenant`` scopes its prefix-cache blocks; the full blocks inside its first
    ``shared_prefix_len`` prompt tokens (a prefix staff marked as shared) are every tenant's.
    ``adapter`` (a LoRA adapter, None for the base) is part of what its tokens mean: it roots the
    blocks' hash chain, and ``lora_slot`` is where the scheduler made it resident.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 *, priority: int = 0, arrival_time: float | None = None, tenant: Tenant | None = None,
                 shared_prefix_len: int = 0, adapter: LoRARequest | None = None):
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.priority = priority
        self.tenant = Tenant() if tenant is None else tenant
        self.shared_prefix_len = shared_prefix_len
        self.adapter = adapter
        self.lora_slot = -1  # set at each admission (engine/lora/slots.py); -1: the base
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.arrival_order = next(_arrival_counter)  # ties in arrival_time broken FIFO
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at first admission
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of the full blocks registered so far
        # sliding-window layers' blocks (window_blocks.py), the same logical blocks; empty otherwise
        self.window_table: list[int] = []
        self.num_preemptions = 0
        self.is_first_schedule = True
        self.fed_at = (0, 0)  # (the scheduler's step, the place in it) it was last fed tokens
        self.grammar = None  # a constrained request's RequestGrammar (engine/structured/grammar.py)
        # the most tokens (prompt + output) it may reach, set by the engine; speculative drafts stay
        # inside it (None: it never drafts)
        self.max_num_tokens: int | None = None
        self.draft_state = None  # engine/speculative/drafting.py's DraftState, once it drafts

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        if self.grammar is not None and not self.grammar.accept(token_id):  # fails this request alone
            raise ValueError(f"token {token_id} breaks the request's grammar: {self.grammar.matcher.get_error()}")
        self.token_ids.append(token_id)

    def sort_key(self, policy: str) -> tuple:
        """Smaller is served first (and preempted last)."""
        if policy == "priority":
            return (self.priority, self.arrival_time, self.arrival_order)
        return (self.arrival_time, self.arrival_order)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, status={self.status.value}, "
                f"tokens={self.num_tokens}, computed={self.num_computed_tokens})")
