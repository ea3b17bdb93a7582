"""The paged KV cache's bookkeeping: block tables, reference counts, a free list, prefix caching.

No tensors live here: a block is an index into the pool the model runner allocated
once at start-up. Full blocks are keyed by a chained hash of their token ids
(parent block's hash + this block's tokens), so two requests with the same prefix
map it to the same physical blocks. A block whose reference count drops to zero
keeps its hash and stays reusable until it is evicted, least-recently-used first.

The chain is scoped to the sequence's tenant: its first private block chains from the
tenant's salt (``tenant_salted``), so identical tokens of two tenants never share a block
and one cannot observe the other's prefixes through hits. Only the full blocks wholly
inside ``seq.shared_prefix_len`` (a prefix staff marked as shared) chain from
``PUBLIC_ROOT``; the block after them chains from the last public hash salted with the
tenant.

``PUBLIC_ROOT`` is a random 128-bit secret drawn once per process, so every hash of the chain (and
every tenant's salt) depends on it. xxh3 is fast, not collision resistant: with a known root, a
tenant could search offline for a prompt whose block hashes like a shared block's and have its
own KV served to others, or theirs to it (vLLM's CVE-2025-25183, with Python's hash). Nothing
outside this process ever sees or compares the hashes, so the secret costs nothing.

A sequence under a LoRA adapter computes other K/V for the same tokens, so its whole chain,
public blocks included, roots in ``chain_root``: the public root salted with the adapter's
identity. Blocks computed under adapter X are never reused for adapter Y or for the base.
"""

from __future__ import annotations

import secrets
from array import array
from collections import OrderedDict

import xxhash

from engine.scheduling.sequence import Sequence

# The root of the chain every tenant may share (staff-marked prefixes only); secret: see above
PUBLIC_ROOT = secrets.randbits(128)


def tenant_salted(parent_hash: int, tenant_id: str) -> int:
    """The parent of a tenant's first private block: ``parent_hash`` (the last public block's
    hash, PUBLIC_ROOT when nothing is shared) mixed with the tenant's id."""
    h = xxhash.xxh3_128()
    h.update(b"pagoda-tenant\x00")
    h.update(parent_hash.to_bytes(16, "little"))
    h.update(tenant_id.encode("utf-8"))
    return h.intdigest()


def chain_root(seq: Sequence) -> int:
    """The parent of ``seq``'s block 0: PUBLIC_ROOT for the base model, else salted with its
    adapter's identity."""
    if seq.adapter is None:
        return PUBLIC_ROOT
    h = xxhash.xxh3_128()
    h.update(b"pagoda-adapter\x00")
    h.update(seq.adapter.identity.encode("utf-8"))
    return h.intdigest()


def hash_block_tokens(parent_hash: int, token_ids: list[int]) -> int:
    """128-bit chained hash of one full block (collisions are not a practical concern)."""
    h = xxhash.xxh3_128()
    h.update(parent_hash.to_bytes(16, "little"))
    h.update(array("q", token_ids).tobytes())
    return h.intdigest()


class Block:
    __slots__ = ("block_id", "ref_count", "block_hash")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Blocks with ref_count 0, in eviction order (front = evicted first).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id
        self.num_prefix_queried_tokens = 0
        self.num_prefix_hit_tokens = 0

    # ----------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of the pool held by live requests (cached-but-free blocks count as free)."""
        return 1.0 - len(self._free) / self.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def full_block_hashes(self, seq: Sequence) -> list[int]:
        """Chained hashes of the full blocks of ``seq``'s tokens except the last one.

        The last token is always left out because the step that computes it produces
        the logits of the next token, so it can never be served from the cache.
        """
        return self._chain(seq, 0, (seq.num_tokens - 1) // self.block_size, chain_root(seq))

    def _chain(self, seq: Sequence, start: int, stop: int, parent: int) -> list[int]:
        """Hashes of ``seq``'s full blocks ``start``..``stop - 1``; ``parent`` is block
        ``start - 1``'s hash (``chain_root(seq)`` for block 0)."""
        bs = self.block_size
        num_public = seq.shared_prefix_len // bs  # blocks wholly inside the shared prefix
        hashes: list[int] = []
        for i in range(start, stop):
            if i == num_public:  # the first private block: from here on, the tenant's alone
                parent = tenant_salted(parent, seq.tenant.id)
            parent = hash_block_tokens(parent, seq.token_ids[i * bs:(i + 1) * bs])
            hashes.append(parent)
        return hashes

    def get_computed_blocks(self, seq: Sequence, hashes: list[int] | None = None) -> list[int]:
        """Blocks already in the cache for the longest full-block prefix of ``seq``."""
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        for block_hash in self.full_block_hashes(seq) if hashes is None else hashes:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def record_prefix_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.num_prefix_queried_tokens += num_tokens
        self.num_prefix_hit_tokens += num_hit_tokens

    # ----------------------------------------------------------------- writes
    def allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] = ()) -> bool:
        """Give ``seq`` blocks for ``computed_blocks`` plus ``num_new_tokens`` more tokens.

        Returns False, changing nothing, when the pool cannot supply them.
        """
        bs = self.block_size
        num_tokens = seq.num_computed_tokens + len(computed_blocks) * bs + num_new_tokens
        num_needed = self.num_blocks_for(num_tokens) - len(seq.block_table) - len(computed_blocks)
        # Hit blocks nobody references sit in the free list: taking them shrinks it.
        num_revived = sum(1 for b in computed_blocks if self.blocks[b].ref_count == 0)
        if num_needed > len(self._free) - num_revived:
            return False
        for block_id in computed_blocks:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            seq.block_hashes.append(block.block_hash)
        for _ in range(max(num_needed, 0)):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:  # evict its cached content
                if self._cached.get(block.block_hash) == block_id:
                    del self._cached[block.block_hash]
                block.block_hash = None
            block.ref_count = 1
            seq.block_table.append(block_id)
        return True

    def share(self, src: Sequence, dst: Sequence, num_blocks: int) -> None:
        """Let ``dst`` (holding no blocks) reference ``src``'s first ``num_blocks`` blocks."""
        assert not dst.block_table, "share() into a sequence that holds blocks"
        for block_id in src.block_table[:num_blocks]:
            self.blocks[block_id].ref_count += 1
            dst.block_table.append(block_id)
        dst.block_hashes = src.block_hashes[:num_blocks]

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register every block of ``seq`` that became full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        start = len(seq.block_hashes)
        parent = seq.block_hashes[-1] if seq.block_hashes else chain_root(seq)
        # after a verified draft its accepted tokens are computed before the engine appends them:
        # those blocks are registered after the next step
        stop = min(seq.num_computed_tokens, seq.num_tokens) // self.block_size
        for i, block_hash in enumerate(self._chain(seq, start, stop, parent), start):
            seq.block_hashes.append(block_hash)
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is None and block_hash not in self._cached:
                block.block_hash = block_hash
                self._cached[block_hash] = block.block_id

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references; its tail blocks become the first candidates for eviction."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.block_hash is None:  # nothing worth keeping: reuse it first
                    self._free.move_to_end(block_id, last=False)
        seq.block_table = []
        seq.block_hashes = []

    def reset_prefix_cache(self) -> None:
        for block in self.blocks:
            if block.ref_count == 0:
                block.block_hash = None
        self._cached = {h: b for h, b in self._cached.items() if self.blocks[b].ref_count > 0}

    def check_all_free(self) -> None:
        """Raise if any block is still referenced (used by tests and on shutdown)."""
        held = [b.block_id for b in self.blocks if b.ref_count]
        if held or len(self._free) != self.num_blocks:
            raise AssertionError(f"blocks still referenced: {held[:10]} (free {len(self._free)}"
                                 f" of {self.num_blocks})")
