"""Block tables for a model with sliding-window layers (Gemma 3): two layer groups, each with a
pool of its own (engine/memory/kv_pool_sizing.py WindowSplit says how the bytes are shared).

The full-attention group is the BlockManager itself (``seq.block_table``, prefix hashes, fair
share's counts). The window group (``seq.window_table``, the same logical blocks) keeps only
what its layers still read: a query at position p attends to positions p - window + 1 .. p,
so before a step starting at position s the blocks wholly before s - window + 1 go back to the
window pool, their entries pointing at the null block 0 (never allocated, read only under the
mask). A prompt chunk's blocks are all allocated while it runs: the step writes their K/V.

Prefix caching: window blocks are registered under the same chained hashes as the full group's
and, once freed, stay cached until evicted, least recently used first. A hit of n blocks needs
the full group's n blocks and the window group's blocks of the window before position n x
block_size (those a query after the hit reads); it is shortened until both are resident. So a
hit on a long shared prefix lasts as long as its last window's blocks are not evicted.
"""

from __future__ import annotations

from engine.scheduling.block_manager import BlockManager
from engine.scheduling.sequence import Sequence

NULL_BLOCK = 0  # the window pool's placeholder for a block that left the window


class WindowedBlockManager(BlockManager):
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, *,
                 num_window_blocks: int, window: int):
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.window = window
        self.pool = BlockManager(num_window_blocks, block_size, enable_prefix_caching)
        del self.pool._free[NULL_BLOCK]  # never handed out
        self.pool.blocks[NULL_BLOCK].ref_count = 1

    @property
    def num_window_blocks(self) -> int:
        return self.pool.num_blocks - 1

    @property
    def num_free_window_blocks(self) -> int:
        return len(self.pool._free)

    def first_window_block(self, start: int) -> int:
        """The first logical block a step whose first new token is at ``start`` reads."""
        return max(start + 1 - self.window, 0) // self.block_size

    # ----------------------------------------------------------------- queries
    def get_computed_blocks(self, seq: Sequence, hashes: list[int] | None = None) -> list[int]:
        hits = super().get_computed_blocks(seq, hashes)
        for n in range(len(hits), 0, -1):  # the longest hit whose last window is resident too
            first = self.first_window_block(n * self.block_size)
            if all(self.blocks[b].block_hash in self.pool._cached for b in hits[first:n]):
                return hits[:n]
        return []

    # ----------------------------------------------------------------- writes
    def allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] = ()) -> bool:
        """BlockManager.allocate in both groups: the window group first gives back what left the
        window, then takes the hits' last window (get_computed_blocks checked it is cached) and
        the new tokens' blocks. False, the window group's release aside, when either pool is short."""
        start = seq.num_computed_tokens + len(computed_blocks) * self.block_size
        first = self.first_window_block(start)
        self._release(seq, first)
        hits = [self.pool._cached[self.blocks[b].block_hash] for b in computed_blocks[first:]]
        num_needed = (self.num_blocks_for(start + num_new_tokens) - len(seq.window_table)
                      - len(computed_blocks))
        num_revived = sum(1 for b in hits if self.pool.blocks[b].ref_count == 0)
        if num_needed > len(self.pool._free) - num_revived:
            return False
        if not super().allocate(seq, num_new_tokens, computed_blocks):
            return False
        if computed_blocks:  # admission: the table is empty
            seq.window_table.extend([NULL_BLOCK] * first)
        for block_id in hits:
            block = self.pool.blocks[block_id]
            if block.ref_count == 0:
                del self.pool._free[block_id]
            block.ref_count += 1
            seq.window_table.append(block_id)
        while len(seq.window_table) < len(seq.block_table):
            seq.window_table.append(self._take())
        return True

    def _take(self) -> int:
        """A free window block, evicting its cached content."""
        pool = self.pool
        block_id, _ = pool._free.popitem(last=False)
        block = pool.blocks[block_id]
        if block.block_hash is not None:
            if pool._cached.get(block.block_hash) == block_id:
                del pool._cached[block.block_hash]
            block.block_hash = None
        block.ref_count = 1
        return block_id

    def _release(self, seq: Sequence, stop: int) -> None:
        """Give back ``seq``'s window blocks before logical block ``stop``."""
        for i in range(min(stop, len(seq.window_table))):
            if seq.window_table[i] != NULL_BLOCK:
                self._drop(seq.window_table[i])
                seq.window_table[i] = NULL_BLOCK

    def _drop(self, block_id: int) -> None:
        block = self.pool.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"window block {block_id} freed twice"
        if block.ref_count == 0:
            self.pool._free[block_id] = None
            if block.block_hash is None:  # nothing worth keeping: reuse it first
                self.pool._free.move_to_end(block_id, last=False)

    def share(self, src: Sequence, dst: Sequence, num_blocks: int) -> None:
        super().share(src, dst, num_blocks)
        dst.window_table = src.window_table[:num_blocks]
        for block_id in dst.window_table:
            if block_id != NULL_BLOCK:
                self.pool.blocks[block_id].ref_count += 1

    def cache_full_blocks(self, seq: Sequence) -> None:
        start = len(seq.block_hashes)
        super().cache_full_blocks(seq)
        for i in range(start, len(seq.block_hashes)):
            block = self.pool.blocks[seq.window_table[i]]
            block_hash = seq.block_hashes[i]
            if (seq.window_table[i] != NULL_BLOCK and block.block_hash is None
                    and block_hash not in self.pool._cached):
                block.block_hash = block_hash
                self.pool._cached[block_hash] = block.block_id

    def free(self, seq: Sequence) -> None:
        super().free(seq)
        for block_id in reversed(seq.window_table):
            if block_id != NULL_BLOCK:
                self._drop(block_id)
        seq.window_table = []

    def reset_prefix_cache(self) -> None:
        super().reset_prefix_cache()
        self.pool.reset_prefix_cache()

    def check_all_free(self) -> None:
        super().check_all_free()
        held = [b.block_id for b in self.pool.blocks[1:] if b.ref_count]
        if held or len(self.pool._free) != self.num_window_blocks:
            raise AssertionError(f"window blocks still referenced: {held[:10]}")
