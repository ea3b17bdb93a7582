"""How large the KV pool is: the bytes one token takes in it, and the blocks a budget holds.

One formula for the runner, which allocates the pool, and for engine/memory/estimate.py, which predicts
it before anything loads; imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.kernels.cpu import cpu_info
from engine.config import CPU_KV_CACHE_MEMORY_FRACTION, EngineConfig

KV_SCALE_BYTES = 4  # the float32 scale of one token's 8-bit K (or V) row of one KV head


def kv_bytes_per_token_head(kv_cache_dtype: str, head_dim: int, elem: int) -> int:
    """Bytes of one token's K (or V) row of one KV head in the pool: head_dim elements of the
    activation dtype (``elem`` bytes; kv_cache_dtype bfloat16: 2 bytes), or 8-bit codes and a
    float32 scale (kv_cache_dtype int8 / fp8_e4m3, engine/kernels/kv_quant.py)."""
    if kv_cache_dtype == "auto":
        return head_dim * elem
    if kv_cache_dtype == "bfloat16":
        return head_dim * 2
    return head_dim + KV_SCALE_BYTES


def kv_bytes_per_token(kv_cache_dtype: str, *, num_layers: int, num_kv_heads: int, head_dim: int,
                       elem: int) -> int:
    """One token's K and V in every layer, over ``num_kv_heads`` (one tensor-parallel rank's)."""
    return 2 * num_layers * num_kv_heads * kv_bytes_per_token_head(kv_cache_dtype, head_dim, elem)


def max_blocks_per_seq(max_model_len: int, block_size: int) -> int:
    return -(-max_model_len // block_size)


def num_kv_blocks(config: EngineConfig, *, device_type: str, max_model_len: int,
                  bytes_per_block: int, device_budget: Callable[[], int | None]) -> int:
    """num_kv_blocks when set; else the blocks of ``bytes_per_block`` that the budget holds:
    kv_cache_memory, or on a GPU ``device_budget()`` (None: no limit known), or on a CPU a share
    of the machine's memory; never more than every running sequence at full length could use.
    MemoryError when the budget does not hold one block."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    ceiling = config.max_num_seqs * max_blocks_per_seq(max_model_len, config.block_size)
    if config.kv_cache_memory is not None:
        budget = config.kv_cache_memory
    elif device_type != "cpu":
        budget = device_budget()
        if budget is None:
            return ceiling
    else:  # what the configuration needs (the ceiling), within a share of memory
        budget = int(CPU_KV_CACHE_MEMORY_FRACTION * cpu_info.total_memory_bytes()) or 1 << 30
    num = min(budget // bytes_per_block, ceiling)
    if num < 1:
        raise MemoryError(f"the KV budget ({budget} bytes) does not hold one block "
                          f"({bytes_per_block} bytes)")
    return int(num)


@dataclass(frozen=True)
class WindowSplit:
    """A pool for a model with sliding-window layers, in two groups of its own (the scheduler's
    engine/scheduling/window_blocks.py): full-attention layers keep every block of a sequence,
    sliding-window layers only those inside the window (plus what one step's chunk writes).

    ``budget_layer_blocks``: the budget in blocks of one layer (all-layer blocks x layers).
    window_split says how it is shared; the window group also keeps one step's chunk and a
    null block.
    """

    num_full_blocks: int  # blocks of the full-attention group (each: every full layer's K/V)
    num_window_blocks: int  # of the window group, its null block (id 0) included
    num_full_layers: int
    num_window_layers: int
    blocks_per_seq: int  # a max_model_len sequence's blocks in the full group
    window_blocks_per_seq: int  # and at most in the window group
    chunk_blocks: int  # the window group's reserve for one step's new tokens

    @property
    def num_seqs(self) -> int:
        """max_model_len sequences that fit at once, with window blocks freed."""
        return min(self.num_full_blocks // self.blocks_per_seq, self.num_window_seqs)

    @property
    def num_window_seqs(self) -> int:
        """Sequences whose whole window the window group holds at once (the seats it is for)."""
        return max(self.num_window_blocks - 1 - self.chunk_blocks, 0) // self.window_blocks_per_seq

    def num_seqs_without_freeing(self) -> int:
        """What the same bytes hold as one pool of every layer with full attention."""
        layers = self.num_full_layers + self.num_window_layers
        budget = self.num_full_blocks * self.num_full_layers + self.num_window_blocks * self.num_window_layers
        return budget // layers // self.blocks_per_seq

    def describe(self, max_model_len: int) -> str:
        return (f"{self.num_seqs} sequences of {max_model_len} tokens fit with sliding-window blocks "
                f"freed ({self.num_window_layers} window layers keep <= {self.window_blocks_per_seq} "
                f"blocks a sequence), {self.num_seqs_without_freeing()} without; windows for "
                f"{self.num_window_seqs} sequences")


def window_split(budget_layer_blocks: int, *, window_layers: list[bool], window: int,
                 max_model_len: int, block_size: int, max_num_batched_tokens: int,
                 max_num_seqs: int) -> WindowSplit | None:
    """Two groups' block counts from one budget (WindowSplit), or None for one pool of every
    layer (nothing split, nothing freed).

    The groups' sizes are fixed when the pool is allocated, so the split chooses which
    sequences it is for. It holds:

    - a window for each of ``max_num_seqs`` seats, as far as one pool would hold window-long
      sequences (``seats``): the window group is never what stops a batch of chats that one
      pool of the same bytes would run. Sized for long contexts alone (the most max_model_len
      sequences), 32 seats of 160-token chats over a 1,024-block budget had 196 window blocks
      for the 320 they need: 13 preemptions, 183 steps for 128 tokens each instead of 128;
    - then as many max_model_len sequences as the rest holds (at least the seats' number of
      windows in the window group).

    None where that holds no more max_model_len sequences than one pool, or where the full
    group would then hold fewer window-long sequences than the seats (a budget sized for the
    seats' windows alone, as a pool of max_num_seqs x window tokens is): the reserve the window
    group keeps for one step's chunk would cost more than freeing gains."""
    num_window = sum(window_layers)
    num_full = len(window_layers) - num_window
    full = max_blocks_per_seq(max_model_len, block_size)
    in_window = min(full, -(-(window - 1) // block_size) + 1)  # a window's tokens span this many
    chunk = min(full, -(-max_num_batched_tokens // block_size) + 1)
    reserve = num_window * (chunk + 1)
    seats = min(max_num_seqs, budget_layer_blocks // len(window_layers) // in_window)
    num_long = max(budget_layer_blocks - reserve, 0) // (num_full * full + num_window * in_window)
    num_window_blocks = max(num_long, seats) * in_window + chunk + 1
    num_full_blocks = (budget_layer_blocks - num_window * num_window_blocks) // num_full
    if num_full_blocks < max(full, seats * in_window):
        return None  # fewer long or window-long sequences than one pool would hold
    split = WindowSplit(num_full_blocks, num_window_blocks, num_full, num_window, full, in_window, chunk)
    return split if split.num_seqs > split.num_seqs_without_freeing() else None
