"""How much CUDA memory the KV pool may take: measured, not guessed; and the start-up memory
summary (weights, KV pool, workspace) on any device.

After the weights are loaded, one dummy step of the largest shape the scheduler can produce
(max_num_batched_tokens prompt tokens, then logits, log-softmax and top-k/top-p sampling for
max_num_seqs rows) runs on a throw-away cache; its peak allocation is the activation memory every
later step stays under. The pool gets what is left of ``gpu_memory_utilization * total``:

    kv_budget = utilization * total - in_use - activation_peak

where ``in_use = total - free`` once the dummy step's memory is released: the CUDA context,
the weights, library workspaces, compiled kernels and any other process on the device.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import torch

from engine.scheduling.input_batch import build_input_batch
from engine.layers.attention import Workspace, kv_cache_shape
from engine.sampling.sampling_metadata import SamplingMetadata
from engine.sampling_params import MAX_LOGPROBS, SamplingParams
from engine.scheduling.scheduler import ScheduledSequence
from engine.scheduling.sequence import Sequence

GiB = 2**30


@dataclass
class MemoryProfile:
    total_bytes: int  # device memory
    weights_bytes: int  # the model's parameters and buffers
    in_use_bytes: int  # total - free after the dummy step, its memory released
    activation_peak_bytes: int  # peak the dummy step allocated beyond its inputs and cache
    kv_budget_bytes: int  # utilization * total - in_use - activation_peak (may be negative)

    def summary(self, kv_pool_bytes: int, num_blocks: int, block_size: int) -> str:
        return (f"GPU memory: {self.total_bytes / GiB:.1f} GiB total, weights "
                f"{self.weights_bytes / GiB:.2f} GiB, in use {self.in_use_bytes / GiB:.2f} GiB, "
                f"activation peak {self.activation_peak_bytes / GiB:.2f} GiB, KV pool "
                f"{kv_pool_bytes / GiB:.2f} GiB = {num_blocks} blocks = "
                f"{num_blocks * block_size} tokens")


def dummy_prefill_entries(num_tokens: int, max_model_len: int,
                          block_size: int) -> list[ScheduledSequence]:
    """Whole-prompt prefills of ``num_tokens`` tokens in all, each as long as the context allows
    (the costliest attention shape), on consecutive blocks from 0. Every entry samples."""
    entries = []
    next_block = 0
    remaining = num_tokens
    while remaining > 0:
        n = min(remaining, max_model_len)
        if remaining - n == 1 and n > 2:  # leave no one-token entry (a decode, not a prefill)
            n -= 1
        seq = Sequence(f"profile-{len(entries)}", [0] * n, SamplingParams())
        num_blocks = -(-n // block_size)
        seq.block_table = list(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        entries.append(ScheduledSequence(seq, n, 0))
        remaining -= n
    return entries


def dummy_caches(entries: list[ScheduledSequence], block_size: int, num_kv_heads: int,
                 head_dim: int, num_layers: int, dtype: torch.dtype,
                 device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A throw-away paged cache holding exactly the blocks of ``entries``, one (K, V) per layer."""
    num_blocks = sum(len(e.seq.block_table) for e in entries)
    shape = kv_cache_shape(num_blocks, block_size, num_kv_heads, head_dim)
    pool = torch.zeros((2, num_layers, *shape), dtype=dtype, device=device)
    return [(pool[0, i], pool[1, i]) for i in range(num_layers)]


def run_dummy_step(model, sampler, entries: list[ScheduledSequence], caches, *,
                   num_sampled_rows: int, block_size: int, device: torch.device,
                   use_triton: bool) -> torch.Tensor:
    """Forward ``entries``, then logits and sampling for ``num_sampled_rows`` rows; returns the
    sampled ids [num_sampled_rows]."""
    batch = build_input_batch(entries, block_size, device, use_triton)
    batch.meta.workspace = Workspace(device)
    # Sampling with every feature that allocates [S, vocab] tensors: logprobs, top-k, top-p.
    params = [SamplingParams(temperature=1.0, top_k=50, top_p=0.9, logprobs=MAX_LOGPROBS)
              ] * num_sampled_rows
    empty = [[] for _ in params]
    meta = SamplingMetadata.build(params, prompt_token_ids=empty, output_token_ids=empty,
                                  generators=[None] * num_sampled_rows, suppress_token_ids=empty,
                                  device=device)
    hidden = model(batch.input_ids, batch.positions, caches, batch.meta)  # [T, hidden]
    rows = torch.arange(num_sampled_rows, device=device) % hidden.shape[0]
    logits = model.compute_logits(hidden[rows])  # [S, vocab] float32
    return sampler(logits, meta).sampled_token_ids


@torch.inference_mode()
def profile_memory(model, sampler, *, utilization: float, max_num_batched_tokens: int,
                   max_num_seqs: int, max_model_len: int, block_size: int, num_kv_heads: int,
                   head_dim: int, num_layers: int, dtype: torch.dtype, device: torch.device,
                   use_triton: bool) -> MemoryProfile:
    """Measure the dummy step on ``device`` (CUDA) and derive the KV pool's budget."""
    weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    entries = dummy_prefill_entries(max_num_batched_tokens, max_model_len, block_size)
    caches = dummy_caches(entries, block_size, num_kv_heads, head_dim, num_layers, dtype, device)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)  # weights, the throw-away cache, anything else
    torch.cuda.reset_peak_memory_stats(device)
    run_dummy_step(model, sampler, entries, caches, num_sampled_rows=max_num_seqs,
                   block_size=block_size, device=device, use_triton=use_triton)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del caches
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    in_use = total - free
    budget = int(utilization * total) - in_use - peak
    return MemoryProfile(total_bytes=total, weights_bytes=weights, in_use_bytes=in_use,
                         activation_peak_bytes=peak, kv_budget_bytes=budget)


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.zeros, but on CPU from anonymous pages the kernel zeroes when first touched, so the
    KV pool's resident memory grows with the blocks used rather than its size at start-up.

    The pages are 4 KiB ones (MADV_NOHUGEPAGE): numpy's and glibc's large buffers may get 2 MiB
    transparent huge pages, and a pool layer's K (or V) is one run of every block, so the first
    few blocks written made 2-6 MiB of each of the 2 x 30 runs resident: SmolLM2's 360 MiB pool
    was all resident after 555 blocks (195 MiB) had been used (bench/memory.py)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    numel = 1
    for n in shape:
        numel *= n
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):  # (not POSIX: calloc's lazy pages)
        return torch.zeros(shape, dtype=dtype)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux
        pages.madvise(mmap.MADV_NOHUGEPAGE)
    # The tensor holds the mapping (frombuffer keeps its buffer alive); unmapped when freed.
    return torch.frombuffer(pages, dtype=torch.uint8).view(dtype).view(shape)


def weights_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of the model's tensors by kind: "float" parameters and buffers, "int4" / "int8"
    quantized layers, "dense bf16 copies" (their weights for steps of many rows), "lm_head copies"
    (the LM head's extra products). Shared tensors count once."""
    from engine.layers.int8_embedding import Int8Embedding
    from engine.layers.linear import Int4Linear, Int8Linear
    from engine.quantization.int4 import Int4WeightOnlyLinear
    from engine.quantization.int8 import Int8WeightOnlyLinear

    seen: set[int] = set()
    totals: dict[str, int] = {}
    for name, module in model.named_modules():
        kind = ("lm_head copies" if name.startswith("lm_head.") else
                "int4" if isinstance(module, (Int4Linear, Int4WeightOnlyLinear)) else
                "int8" if isinstance(module, (Int8Linear, Int8WeightOnlyLinear, Int8Embedding))
                else "float")
        for tensor in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            if tensor is None or tensor.is_mkldnn or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            key = ("dense bf16 copies" if kind in ("int4", "int8")
                   and tensor is getattr(module, "weight_dense", None) else
                   "int8" if name == "lm_head" and tensor.dtype in (torch.uint8, torch.float16)
                   else kind)  # the LM head's int8 table (and the tied embedding's)
            totals[key] = totals.get(key, 0) + tensor.numel() * tensor.element_size()
        extra = getattr(module, "extra_bytes", 0)  # tensors kept outside parameters and buffers
        if extra:
            totals["lm_head copies"] = totals.get("lm_head copies", 0) + extra
    return totals


def memory_summary(model: torch.nn.Module, kv_pool_bytes: int, kv_tokens: int, model_config,
                   dtype: torch.dtype, device: torch.device) -> str:
    """One start-up line: weights (by kind), the KV pool, and the attention workspace's bound
    (one layer's K and V gathered for every token the pool holds; allocated on first use)."""
    MiB = 2**20
    kinds = weights_bytes(model)
    weights = ", ".join(f"{k} {v / MiB:.1f}" for k, v in kinds.items())
    elem = torch.empty((), dtype=dtype).element_size()
    workspace = 2 * kv_tokens * model_config.num_key_value_heads * model_config.head_dim * elem
    line = (f"memory: weights {sum(kinds.values()) / MiB:.1f} MiB ({weights}), KV pool "
            f"{kv_pool_bytes / MiB:.1f} MiB for {kv_tokens} tokens, attention workspace up to "
            f"{workspace / MiB:.1f} MiB (on demand)")
    if device.type == "cpu":
        try:
            with open("/proc/self/statm") as f:
                resident = int(f.read().split()[1]) * 4096
            line += f"; process resident now {resident / MiB:.0f} MiB"
        except (OSError, IndexError, ValueError):
            pass
    return line
