"""How the torch attention path writes one layer's KV pool and reads it back, per storage kind.

Three kinds of pool share ``PagedAttention``'s one loop over a step's prefills and decode groups:

- ``FloatPool``: K/V stored in the activations' dtype. Reads are the stored tensors, and decode
  may read a sequence whose blocks are a run through views of the pool (``direct``).
- ``WidenedPool``: a pool narrower than the activations (``kv_cache_dtype="bfloat16"`` under
  float32). K/V are rounded on write, and every read widens what was stored.
- ``QuantizedPool``: an 8-bit pool of codes and scales (``kv_quant``), dequantized on every read.

In the last two, this step's own K/V are read back as they were stored, not as computed, so an
answer does not depend on which of its tokens were cached before the step (prefix cache,
chunking), and the fused CPU decode step, which reads the pool itself, agrees.
"""

from __future__ import annotations

import torch

from engine.kernels import kv_quant


class FloatPool:
    """A (K, V) pool in the activations' dtype, ``[num_blocks, block_size, KVH, D]`` each."""

    def __init__(self, kv_cache: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype):
        self.k_cache, self.v_cache = kv_cache
        self.dtype = dtype  # what every read returns
        num_blocks, self.block_size, self.kvh, self.d = self.k_cache.shape
        self.k_flat = self.k_cache.view(num_blocks * self.block_size, self.kvh, self.d)
        self.v_flat = self.v_cache.view(num_blocks * self.block_size, self.kvh, self.d)
        self._k = self._v = None

    @property
    def direct(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The pools, when a decode may attend through views of them as they lie."""
        return self.k_cache, self.v_cache

    def write(self, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store this step's k, v [T, KVH, D] in their slots."""
        self.k_flat.index_copy_(0, slot_mapping, k)
        self.v_flat.index_copy_(0, slot_mapping, v)
        self._k, self._v = k, v

    def step_rows(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of this step's K/V as a read of their slots returns them."""
        return self._k[rows], self._v[rows]

    def context(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V [len(slots), KVH, D] of the given flat slots."""
        return self.k_flat[slots], self.v_flat[slots]

    def gather(self, block_ids: torch.Tensor, workspace) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the given blocks in the workspace: [len(block_ids), block_size, KVH, D]."""
        k_buf, v_buf = workspace.pair((block_ids.shape[0], self.block_size, self.kvh, self.d),
                                      self.k_cache.dtype)
        torch.index_select(self.k_cache, 0, block_ids, out=k_buf)
        torch.index_select(self.v_cache, 0, block_ids, out=v_buf)
        return k_buf, v_buf


class WidenedPool(FloatPool):
    """A (K, V) pool narrower than the activations: rounded on write, widened on every read."""

    direct = None  # decode gathers, then widens

    def write(self, k, v, slot_mapping) -> None:
        super().write(k.to(self.k_cache.dtype), v.to(self.v_cache.dtype), slot_mapping)

    def step_rows(self, rows):
        k, v = super().step_rows(rows)
        return k.to(self.dtype), v.to(self.dtype)

    def context(self, slots):
        k, v = super().context(slots)
        return k.to(self.dtype), v.to(self.dtype)

    def gather(self, block_ids, workspace):
        # index_select cannot write into another dtype: gather as stored, then widen
        k_buf, v_buf = super().gather(block_ids, workspace)
        k_wide, v_wide = workspace.pair(tuple(k_buf.shape), self.dtype, name="widened")
        return k_wide.copy_(k_buf), v_wide.copy_(v_buf)


class QuantizedPool:
    """An 8-bit pool: (K codes, V codes, K scales, V scales), ``kv_quant``'s layout."""

    direct = None  # decode gathers and dequantizes

    def __init__(self, kv_cache: tuple, dtype: torch.dtype):
        self.kv_cache = kv_cache
        self.dtype = dtype
        _, self.block_size, self.kvh, self.d = kv_cache[0].shape
        self._step = None

    def write(self, k, v, slot_mapping) -> None:
        self._step = kv_quant.write(self.kv_cache, k, v, slot_mapping)

    def step_rows(self, rows):
        k_codes, k_scales, v_codes, v_scales = self._step
        return (kv_quant.dequantize(k_codes[rows], k_scales[rows], self.dtype),
                kv_quant.dequantize(v_codes[rows], v_scales[rows], self.dtype))

    def context(self, slots):
        return kv_quant.read_slots(self.kv_cache, slots, self.dtype)

    def gather(self, block_ids, workspace):
        return kv_quant.gather_blocks(self.kv_cache, block_ids, self.dtype, workspace)


def pool_access(kv_cache: tuple, dtype: torch.dtype) -> FloatPool | WidenedPool | QuantizedPool:
    """The access to a layer's cache tuple for activations of ``dtype``."""
    if kv_quant.is_quantized(kv_cache):
        return QuantizedPool(kv_cache, dtype)
    if kv_cache[0].dtype != dtype:
        return WidenedPool(kv_cache, dtype)
    return FloatPool(kv_cache, dtype)
