"""``n > 1``: one request, n samples that share the prompt's KV blocks.

Sample 0 runs as an ordinary request under the caller's id. Samples 1..n-1 wait outside the
scheduler until sample 0 has computed the prompt (its first token is sampled); then each is
forked: it references the prompt's full blocks (refcount + 1, copy-free) and computes only the
prompt's tail (the tokens after the last full block, at least the last one, whose logits it
samples from), never the whole prompt again. From there every sample is an ordinary sequence: it
can be preempted and recomputed alone (its prefix then usually comes back from the prefix cache).

Seeds: sample i draws from ``derive_seed(seed, i)`` (sample 0 from ``seed`` itself, so n=1 is
unchanged), so seeded samples are distinct and each one equals running that sample alone with
its derived seed. Without a seed each sample draws from the global generator.

An n == 1 request never meets this module: the engine's step checks one (usually empty) dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import xxhash

from engine.scheduling.block_manager import BlockManager
from engine.errors import InvalidParameterError
from engine.scheduling.sequence import Sequence

MAX_N = 64  # samples per request (each its own sequence in the batch)
_SEED_SPACE = 2**63


def derive_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample ``index`` of a request seeded with ``seed`` (None stays None)."""
    if seed is None or index == 0:
        return seed
    return _mix(seed, index)


def position_seed(seed: int, position: int) -> int:
    """The seed of the noise a request seeded with ``seed`` samples its token at ``position`` with:
    a function of the two alone, so the token does not depend on how many were drawn before it
    (a speculative step draws for rows it then discards, engine/speculative/verify.py)."""
    return _mix(seed, position, b"position")


def _mix(seed: int, value: int, tag: bytes = b"") -> int:
    """A seed from ``seed`` and a non-negative ``value`` (``tag`` keeps uses apart)."""
    h = xxhash.xxh3_64()
    h.update(seed.to_bytes(16, "little", signed=True))
    h.update(value.to_bytes(8, "little"))
    h.update(tag)
    return h.intdigest() % _SEED_SPACE


def check_n(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise InvalidParameterError("n", f"must be an integer from 1 to {MAX_N}, got {n!r}")
    return n


def sample_id(request_id: str, index: int) -> str:
    """The engine-internal id of sample ``index`` (sample 0 keeps the request's own id)."""
    return request_id if index == 0 else f"{request_id}#{index}"


@dataclass
class SampleGroup:
    """The samples of one n > 1 request, by index (the engine's _Request objects)."""

    request_id: str
    samples: list = field(default_factory=list)  # index -> _Request
    unforked: list = field(default_factory=list)  # samples 1.. not yet given to the scheduler
    num_live: int = 0  # samples not finished yet

    def sample_finished(self) -> bool:
        """Count one sample's end; True when it was the last one."""
        self.num_live -= 1
        return self.num_live == 0


def fork(parent: Sequence, child: Sequence, block_manager: BlockManager) -> None:
    """Give ``child`` (a fresh copy of ``parent``'s prompt) the prompt's full computed blocks.

    Called once ``parent`` has computed its whole prompt and before it may free anything. The
    block holding the last prompt token is never shared: the child recomputes from there, so it
    never writes into a block another sequence reads.
    """
    bs = block_manager.block_size
    num_shared = (parent.num_prompt_tokens - 1) // bs
    block_manager.share(parent, child, num_shared)
    child.num_computed_tokens = num_shared * bs
    child.num_cached_tokens = parent.num_cached_tokens
    child.is_first_schedule = False  # its prompt is not a new prefix-cache query
