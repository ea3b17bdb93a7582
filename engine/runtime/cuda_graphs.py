"""CUDA graphs for pure-decode steps: one graph per padded batch size, captured at start-up.

A decode step is a few hundred small kernels whose launch cost on the host exceeds their GPU
time at small batches; a graph replays them all with one launch. A graph reads fixed addresses,
so every input of the step lives in a static buffer sized for the largest graph: a step copies
its n rows in and pads the graph's other rows with slot -1 (no cache write) and context length 0
(the decode kernel reads nothing and writes zeros). The block tables have one fixed width,
ceil(max_model_len / block_size), from which the decode kernel picks its number of splits, so
nothing inside a graph reads a device value on the host. The graph ends at the final norm's
hidden states; logits and sampling run eagerly after the replay. Steps with prefill tokens, or
more sequences than the largest graph, run eagerly.
"""

from __future__ import annotations

import bisect
import logging
import time

import torch

from engine.layers.attention_metadata import AttentionMetadata

logger = logging.getLogger(__name__)

NUM_WARMUP_STEPS = 2  # eager runs per size before capture: Triton compiles, cuBLAS picks kernels


def capture_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, ... below max_batch_size, then
    max_batch_size itself: beyond 16 a batch is padded by at most half its size."""
    sizes = {1, 2, 4, 8}
    n = 16
    while n < max_batch_size:
        sizes.update((n, n * 3 // 2))
        n *= 2
    return sorted({s for s in sizes if s < max_batch_size} | {max_batch_size})


class CudaGraphRunner:
    def __init__(self, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 max_batch_size: int, max_blocks_per_seq: int, device: torch.device):
        self.model = model
        self.kv_caches = kv_caches
        self.device = device
        self.sizes = capture_sizes(max_batch_size)
        n = self.sizes[-1]
        with torch.inference_mode():
            self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
            self.positions = torch.zeros(n, dtype=torch.long, device=device)
            self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
            self.block_tables = torch.zeros((n, max_blocks_per_seq), dtype=torch.int32,
                                            device=device)
            self.context_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # [size, hidden] written by each replay
        self.num_replays = 0
        self.memory_bytes = 0

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def forward_static(self, size: int) -> torch.Tensor:
        """The model, eagerly, over the first ``size`` rows of the static buffers: what a graph
        of that size captures. Returns hidden [size, hidden]."""
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], num_prefill_tokens=0, num_decode_tokens=size,
            decode_block_tables=self.block_tables[:size],
            decode_context_lens=self.context_lens[:size])
        return self.model(self.input_ids[:size], self.positions[:size], self.kv_caches, meta)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first so the smaller graphs reuse its pool memory. The
        static buffers hold padding only here (slot -1, context 0): the KV pool is not touched."""
        start = time.perf_counter()
        free_before, _ = torch.cuda.mem_get_info(self.device)
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            for _ in range(NUM_WARMUP_STEPS):
                self.forward_static(size)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self.forward_static(size)
            self.graphs[size] = graph
        torch.cuda.synchronize(self.device)
        free_after, _ = torch.cuda.mem_get_info(self.device)
        self.memory_bytes = free_before - free_after
        logger.info("CUDA graphs: %d decode batch sizes (%s) captured in %.1f s, %.0f MiB",
                    len(self.sizes), ", ".join(map(str, self.sizes)),
                    time.perf_counter() - start, self.memory_bytes / 2**20)

    def can_run(self, meta: AttentionMetadata) -> bool:
        """Whether this step is pure decode and a captured graph fits it."""
        n = meta.num_decode_tokens
        return (meta.num_prefill_tokens == 0 and 0 < n <= self.max_batch_size
                and meta.decode_block_tables.shape[1] <= self.block_tables.shape[1])

    def stage(self, input_ids: torch.Tensor, positions: torch.Tensor,
              meta: AttentionMetadata) -> int:
        """Copy a pure-decode step's n rows into the static buffers and pad the rest of the
        smallest graph holding them; returns that graph's size. Device-side copies only."""
        n = meta.num_decode_tokens
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:size].fill_(-1)
        self.context_lens[:n].copy_(meta.decode_context_lens)
        self.context_lens[n:size].zero_()
        # Columns past a row's context are never read, so stale entries there are harmless;
        # padding rows keep stale ids, positions and tables, all valid and all unread.
        tables = meta.decode_block_tables
        self.block_tables[:n, :tables.shape[1]].copy_(tables)
        return size

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            meta: AttentionMetadata) -> torch.Tensor:
        """Replay the smallest graph holding the step's n sequences; returns hidden [n, hidden],
        a view into the graph's output that the next replay of that size overwrites."""
        size = self.stage(input_ids, positions, meta)
        self.graphs[size].replay()
        self.num_replays += 1
        return self.outputs[size][:meta.num_decode_tokens]
