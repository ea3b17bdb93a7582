"""Paged attention: write this step's K/V into the block pool, then attend through block tables.

Two implementations share one interface: plain PyTorch (CPU, and any device as a
fallback) and the Triton kernels of ``engine.kernels`` (CUDA), over one pool layout per
layer: ``[num_blocks, block_size, kv_heads, head_dim]`` (vLLM's flash layout). On a CPU,
decode attention is bound by memory traffic; gathering whole blocks (contiguous 12 KiB
rows for SmolLM2) measured faster than a head-major layout whose gathers are strided.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.attention_metadata import AttentionMetadata
from engine.layers import kv_access


# From this many cached tokens a lone bf16 stream's decode attention uses _decode_long_run.
LONG_DECODE_CONTEXT = 768


def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
    """One layer's K (or V) pool; both implementations read this layout."""
    return (num_blocks, block_size, num_kv_heads, head_dim)


class Workspace:
    """Scratch memory reused by every layer and step, grown geometrically on demand.

    A fresh multi-MiB tensor per layer costs more in page faults than the copy into it.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        self._last: dict[tuple[str, torch.dtype], tuple] = {}  # (shape, views) last handed out

    def pair(self, shape: tuple[int, ...], dtype: torch.dtype,
             name: str = "kv") -> tuple[torch.Tensor, torch.Tensor]:
        """Two [shape] tensors; pairs of different names (or dtypes) never overlap."""
        last = self._last.get((name, dtype))
        if last is not None and last[0] == shape:  # every layer of a step asks the same shape
            return last[1]
        numel = 1
        for n in shape:
            numel *= n
        buf = self._buffers.get((name, dtype))
        if buf is None or buf.numel() < 2 * numel:
            size = max(2 * numel, 0 if buf is None else 2 * buf.numel())
            buf = self._buffers[name, dtype] = torch.empty(size, dtype=dtype, device=self.device)
        views = buf[:numel].view(shape), buf[numel:2 * numel].view(shape)
        self._last[name, dtype] = (shape, views)
        return views


class PagedAttention(nn.Module):
    """sliding_window: each query attends to the last ``sliding_window`` tokens only (its own
    included, as transformers' sliding-window mask); the blocks before stay in the cache."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, use_triton: bool = False,
                 scale: float | None = None, sliding_window: int | None = None):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.group = num_heads // num_kv_heads
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.use_triton = use_triton
        self.sliding_window = sliding_window
        if use_triton and sliding_window is not None:
            raise NotImplementedError(
                f"sliding-window attention ({sliding_window} tokens) runs on the PyTorch path only; "
                f"the Triton kernels attend to the whole context (use_triton=False)")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, ...], meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, KVH, D]; cache tensors in ``kv_cache_shape`` layout: (K, V),
        or (K codes, V codes, K scales, V scales) for an 8-bit cache (``kv_quant``).

        Returns [T, H, D].
        """
        if self.use_triton:
            return self._forward_triton(q, k, v, kv_cache, meta)
        if self.sliding_window is not None and meta.window is not None:
            meta = meta.window  # this layer's cache is the window group's pool
        pool = kv_access.pool_access(kv_cache, q.dtype)
        pool.write(k, v, meta.slot_mapping)
        n = meta.num_prefill_tokens
        if n == 0 and len(meta.decode_groups) == 1:  # e.g. one stream decoding: no output copy
            return self._decode(q, pool, meta.decode_groups[0], meta.workspace)
        out = torch.empty_like(q)
        for p in meta.prefills:
            rows = slice(p.query_start, p.query_start + p.query_len)
            if p.context_slots is None:  # the chunk is the whole context: attend to it directly
                out[rows] = self._prefill(q[rows], *pool.step_rows(rows), 0)
            else:
                out[rows] = self._prefill(q[rows], *pool.context(p.context_slots),
                                          p.context_len - p.query_len)
        for g in meta.decode_groups:
            rows = slice(n + g.row_start, n + g.row_end)
            out[rows] = self._decode(q[rows], pool, g, meta.workspace)
        return out

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int) -> torch.Tensor:
        """q: [n, H, D]; k, v: [ctx, KVH, D] with ctx = offset + n; causal with that offset.

        Four-dimensional inputs, since on a CPU only those reach the flash kernel (three fall
        to the math path, which materialises [H, n, ctx] scores: a 2,048-token chunk took 4.5x
        longer there, bench/prefill.py), and the query groups read their shared K/V head
        (enable_gqa) instead of a repeated copy."""
        n, ctx = q.shape[0], k.shape[0]
        q = q.transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        k = k.transpose(0, 1).unsqueeze(0)  # [1, KVH, ctx, D]
        v = v.transpose(0, 1).unsqueeze(0)
        window = self.sliding_window
        if offset == 0 and (window is None or ctx <= window):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale,
                                               enable_gqa=self.group > 1)
        else:
            rows = torch.arange(n, device=q.device).unsqueeze(1) + offset
            cols = torch.arange(ctx, device=q.device).unsqueeze(0)
            mask = cols <= rows  # [n, ctx]
            if window is not None:
                mask &= cols > rows - window
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                               enable_gqa=self.group > 1)
        return o[0].transpose(0, 1)

    def _decode(self, q: torch.Tensor, pool: kv_access.FloatPool | kv_access.QuantizedPool, g,
                workspace: Workspace) -> torch.Tensor:
        """q: [B, H, D], one token per sequence, attending to its whole cached context."""
        b = q.shape[0]
        block_size, kvh, d = pool.block_size, pool.kvh, pool.d
        window = self.sliding_window
        if window is not None and g.mask.shape[-1] > window:  # a context may reach past the window
            k_buf, v_buf = pool.gather(g.flat_block_ids, workspace)
            length = g.flat_block_ids.shape[0] // b * block_size
            k = k_buf.view(b, length, kvh, d).transpose(1, 2)
            v = v_buf.view(b, length, kvh, d).transpose(1, 2)
            o = F.scaled_dot_product_attention(q.view(b, kvh, self.group, d), k, v,
                                               attn_mask=g.additive_mask(q.dtype, window),
                                               scale=self.scale)
            return o.reshape(b, self.num_heads, d)
        if pool.direct is not None and g.block_run_start is not None and (
                q.dtype == torch.float32 or self._long_run(q.dtype, g.context_len, kvh)):
            return self._decode_one_run(q, *pool.direct, g.block_run_start, g.context_len)
        k_buf, v_buf = pool.gather(g.flat_block_ids, workspace)
        length = g.flat_block_ids.shape[0] // b * block_size
        if b == 1 and k_buf.dtype == torch.float32:  # gathered blocks are a run: the same bits
            return self._decode_one_run(q, k_buf, v_buf, 0, g.context_len)
        if b == 1 and self._long_run(k_buf.dtype, g.context_len, kvh):  # gathered: one run now
            v_run = v_buf.view(-1, kvh, d)[:g.context_len].transpose(0, 1)  # [KVH, L, D]
            return self._decode_long_run(q.view(kvh, self.group, d), k_buf, v_run, g.context_len)
        # [B * blocks, bs, KVH, D] -> [B, KVH, L, D]
        k = k_buf.view(b, length, kvh, d).transpose(1, 2)
        v = v_buf.view(b, length, kvh, d).transpose(1, 2)
        # The `group` query heads sharing a KV head act as `group` query rows: no K/V repeat.
        q = q.view(b, kvh, self.group, d)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=g.additive_mask(q.dtype),
                                           scale=self.scale)
        return o.reshape(b, self.num_heads, d)

    def _decode_one_run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        first_block: int, context_len: int) -> torch.Tensor:
        """q: [1, H, D] of one sequence whose cache is blocks first_block, first_block + 1, ...

        Reads K/V through a view of the pool: no gather into the workspace, no mask. In float32
        two matmuls over the strided views measured 1.3x (40 tokens) to 2.4x (1,000 tokens)
        faster than gathering then scaled_dot_product_attention; a lone float32 sequence whose
        blocks are not a run gathers them and takes this same path over the gathered blocks
        (first_block 0), so both give the same bits. In bfloat16 the same matmuls
        took 15x longer than the gather (a slow strided bf16 bmm), so a short bf16 context is
        gathered: the flash kernel over the views was 1.2x faster at 130 tokens, but not
        bit-identical to the masked gathered path, and a greedy answer must not change with
        whether its prompt's blocks came from the prefix cache. A long one takes
        _decode_long_run, which gives the same bits on the view as on the gathered blocks."""
        _, block_size, kvh, d = k_cache.shape
        end = first_block - (-context_len // block_size)
        k = k_cache[first_block:end].view(-1, kvh, d)[:context_len].transpose(0, 1)  # [KVH, L, D]
        v = v_cache[first_block:end].view(-1, kvh, d)[:context_len].transpose(0, 1)
        # The `group` query heads sharing a KV head act as `group` query rows.
        q = q.view(kvh, self.group, d)
        if k_cache.dtype != torch.float32:
            return self._decode_long_run(q, k_cache[first_block:end], v, context_len)
        scores = torch.matmul(q * self.scale, k.transpose(1, 2))  # [KVH, g, L]
        return torch.matmul(scores.softmax(dim=-1), v).view(1, self.num_heads, d)

    @staticmethod
    def _long_run(dtype: torch.dtype, context_len: int, kvh: int) -> bool:
        return dtype != torch.float32 and context_len >= LONG_DECODE_CONTEXT and kvh <= 4

    def _decode_long_run(self, q: torch.Tensor, k_blocks: torch.Tensor, v: torch.Tensor,
                         context_len: int) -> torch.Tensor:
        """q: [KVH, g, D]; k_blocks: [blocks, bs, KVH, D] of one sequence; v: [KVH, L, D] view.

        Past a few hundred tokens the flash kernel is slower here than one GEMM of every query
        head against the run's K rows taken as they lie ([L * KVH, D], contiguous), which also
        scores each query head against the other KV heads; the matching blocks are kept.
        That is KVH times the QK products, worth it for few KV heads only (one thread,
        AVX512-BF16, SmolLM2's 3: 1.25x faster at 1,000 tokens, 2x at 5,000, slower below ~700).
        """
        kvh, g, d = q.shape
        k_rows = k_blocks.view(-1, d)[:context_len * kvh]  # [L * KVH, D]
        scores = torch.mm(q.view(kvh * g, d), k_rows.t()).view(kvh, g, context_len, kvh)
        scores = torch.diagonal(scores, dim1=0, dim2=3).permute(2, 0, 1)  # [KVH, g, L]
        probs = scores.float().mul_(self.scale).softmax(dim=-1).to(v.dtype)
        return torch.bmm(probs, v).view(1, self.num_heads, d)

    def _forward_triton(self, q, k, v, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        from engine.kernels.attention_decode import paged_decode_attention
        from engine.kernels.attention_prefill import paged_prefill_attention
        from engine.kernels.cache import reshape_and_cache

        k_cache, v_cache, *scales = kv_cache  # scales: [K scales, V scales] of an 8-bit cache
        reshape_and_cache(k, v, k_cache, v_cache, meta.slot_mapping, *scales)
        out = torch.empty_like(q)
        n = meta.num_prefill_tokens
        if n:
            out[:n] = paged_prefill_attention(
                q[:n], k_cache, v_cache, meta.prefill_block_tables, meta.prefill_cu_query_lens,
                meta.prefill_context_lens, self.scale, meta.prefill_max_query_len, *scales)
        if meta.num_decode_tokens:
            out[n:] = paged_decode_attention(
                q[n:], k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens,
                self.scale, None, *scales)
        return out
