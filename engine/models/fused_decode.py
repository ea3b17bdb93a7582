"""A Llama-family decode step in one native call (engine/kernels/cpu/decode_step.c), on the CPU.

At one sequence the int4 products of SmolLM2's 30 layers take ~2 ms of a ~5.8 ms torch step; the
rest was ~4,500 small aten ops (norms, rotary, views, cache writes, attention's gathers) and the
Python around them. ``FusedDecode`` describes the model to the C step once, pointers into its own
weights, norms and KV pool, and then runs every decode row of a step, all layers, in one call
with one OpenMP region. Prefill rows keep the torch path (their products are GEMMs; the C step
is for single tokens).

It applies where every projection runs one of the engine's own kernels (``Int4WeightOnlyLinear``
or ``Int8WeightOnlyLinear`` with ``native``: a GGUF's blocks, ``quantization="int4"`` on an AVX2
CPU), the cache is a plain bf16 or float32 pool (not 8-bit), there is no tensor parallelism and
no Triton; else ``build`` returns None and the torch path runs, unchanged. The layers it computes
are the Llama layer and what Qwen3 (Q/K norms), Phi-3 and Mistral (a sliding window) and Gemma 3
(Gemma's norms around each sublayer, GeGLU, a RoPE table per layer, sliding-window layers over a
pool of their own) add to it; every RoPE scaling is in the tables it reads. A family with experts
(Qwen3-MoE, Mixtral) keeps the torch path. ``PAGODA_FUSED_DECODE=0`` turns it off.
It knows no LoRA: a step with any row under an adapter is declined (``takes``) and runs the torch
path, whose projections carry the batched LoRA product (engine/lora/); a base-only step runs here.

A decode row's arithmetic does not depend on its neighbours, the thread count or where its
blocks lie (decode_step.c's header), so a sequence's tokens are the same alone or batched.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Generator

import torch

from engine.layers.activation import GeluAndMul, SiluAndMul
from engine.layers.attention_metadata import AttentionMetadata
from engine.layers.layernorm import GemmaRMSNorm, RMSNorm
from engine.kept_buffer import KeptBuffer
from engine.parts import run_to_end
from engine.kernels.cpu import build, decode_step, qmatmul
from engine.quantization.int4 import Int4WeightOnlyLinear
from engine.quantization.int8 import Int8WeightOnlyLinear

logger = logging.getLogger(__name__)

ENV = "PAGODA_FUSED_DECODE"
PAUSABLE_ROWS = 8  # a step of fewer rows is short (~4-10 ms on 2 cores): it runs whole
PARTS = 6  # a step of more runs in this many parts of its layers, a pause possible between them
KEPT_ROWS = 256  # steps of at most this many rows reuse one work area (decodes, short prompts)
ACTIVATIONS = {SiluAndMul: 0, GeluAndMul: 1}  # pg_shape.gelu


def enabled() -> bool:
    return build.env_switch(ENV)


class FusedDecode:
    """Runs the decode rows of a step through decode_step.c; see the module docstring."""

    def __init__(self, lib: ctypes.CDLL, model: torch.nn.Module, kv_caches: list, block_size: int,
                 dense_rows: int | None):
        inner, cfg = model.model, model.config
        self.lib, self.dtype = lib, inner.norm.weight.dtype
        self.dense_rows = dense_rows
        self._keep: list[torch.Tensor] = []  # float32 norms and biases the structs point into
        layers = (decode_step.Layer * len(inner.layers))()
        tables = []  # each layer's RoPE table, float32 [max_position, D]: cos, then sin
        for layer, kv, out in zip(inner.layers, kv_caches, layers):
            attn, mlp = layer.self_attn, layer.mlp
            out.in_norm = self._norm(layer.input_layernorm)
            if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma: a norm on each sublayer's output
                out.post_norm = self._norm(layer.pre_feedforward_layernorm)
                out.attn_out_norm = self._norm(layer.post_attention_layernorm)
                out.mlp_out_norm = self._norm(layer.post_feedforward_layernorm)
            else:
                out.post_norm = self._norm(layer.post_attention_layernorm)
            if attn.q_norm is not None:
                out.q_norm, out.k_norm = self._norm(attn.q_norm), self._norm(attn.k_norm)
            out.qkv, out.o = self._proj(attn.qkv_proj), self._proj(attn.o_proj)
            out.gate_up, out.down = self._proj(mlp.gate_up_proj), self._proj(mlp.down_proj)
            out.k_cache, out.v_cache = kv[0].data_ptr(), kv[1].data_ptr()
            tables.append(attn.rotary_emb.cos_sin_cache)
            out.cos_sin = tables[-1].data_ptr()
            out.window = attn.attn.sliding_window or 0
        self.layers, self.kv_caches = layers, kv_caches  # the pool stays alive with the structs
        self.rope_tables = tables
        self.max_position = min(t.shape[0] for t in tables)
        self.windowed = any(layer.window for layer in layers)
        self.final_norm = self._norm(inner.norm)
        k_cache = kv_caches[0][0]
        first = inner.layers[0]
        self.shape = decode_step.Shape(
            hidden=cfg.hidden_size, heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim, inter=cfg.intermediate_size, block_size=block_size, table_width=0,
            eps=cfg.rms_norm_eps, scale=first.self_attn.attn.scale,
            kv_bf16=int(k_cache.dtype == torch.bfloat16), num_threads=0,
            bf16_products=int(self.dtype == torch.bfloat16 and k_cache.dtype == torch.bfloat16),
            gelu=ACTIVATIONS[type(first.mlp.act)])
        self.embed = inner.embed  # the token embeddings as the model's forward takes them
        self._work = KeptBuffer(torch.float32)  # the step's work areas, for decode-sized steps
        self._paused_work = KeptBuffer(torch.float32)  # a step run in parts (``parts``) keeps its own
        self._scratch = KeptBuffer(torch.uint8)

    def attention_arithmetic(self) -> str:
        """'bf16 products' where a bf16 model's attention takes AVX512-BF16's (q and p rounded to
        bf16, float32 sums; attention.c), else 'float32 products'."""
        s = self.shape
        if s.bf16_products and s.head_dim % 32 == 0 and self.lib.pagoda_attention_bf16_products():
            return "bf16 products"
        return "float32 products"

    @classmethod
    def build(cls, model: torch.nn.Module, kv_caches: list, block_size: int, *, use_triton: bool,
              tensor_parallel: bool, dense_rows: int | None) -> FusedDecode | None:
        """The fused step for this model and pool, or None where it does not apply (logged why)."""
        reason = cls._unsupported(model, kv_caches, block_size, use_triton, tensor_parallel)
        if reason is None:
            lib = decode_step.library()
            reason = "the native kernels did not build" if lib is None else None
        if reason is not None:
            logger.info("fused CPU decode step off: %s", reason)
            return None
        fused = cls(lib, model, kv_caches, block_size, dense_rows)
        logger.info("fused CPU decode step on: every layer of a step's decode rows in one native call, "
                    "products on the %s path, attention in %s (%s=0 turns it off)", qmatmul.isa(),
                    fused.attention_arithmetic(), ENV)
        return fused

    @staticmethod
    def _unsupported(model, kv_caches, block_size, use_triton, tensor_parallel) -> str | None:
        if not enabled():
            return f"{ENV}=0"
        if use_triton or tensor_parallel:
            return "Triton or tensor parallel"
        inner = getattr(model, "model", None)
        if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "embed") or not kv_caches:
            return "not a Llama-family model"
        reason = FusedDecode._layers_unsupported(model)
        if reason is not None:
            return f"the {model.config.architecture} layer: {reason}"
        k_cache = kv_caches[0][0]
        if k_cache.device.type != "cpu" or any(len(kv) != 2 for kv in kv_caches):
            return "not a CPU pool of plain K/V (8-bit caches take the torch path)"
        if k_cache.dtype not in (torch.bfloat16, torch.float32) or inner.norm.weight.dtype not in (
                torch.bfloat16, torch.float32):
            return f"{k_cache.dtype} cache or activations (bf16 and float32 are fused)"
        cfg = model.config
        if cfg.head_dim > decode_step.MAX_HEAD_DIM or block_size > decode_step.MAX_BLOCK_SIZE:
            return f"head_dim {cfg.head_dim} or block_size {block_size} beyond the step's buffers"
        if cfg.head_dim % 2 or cfg.num_attention_heads % cfg.num_key_value_heads:
            return "odd head_dim or query heads not a multiple of KV heads"
        for layer in inner.layers:
            for proj in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                         layer.mlp.down_proj):
                if not (isinstance(proj, (Int4WeightOnlyLinear, Int8WeightOnlyLinear))
                        and proj._native_args is not None):
                    return "a projection is not on the engine's int4 or int8 kernel"
        return None

    @staticmethod
    def _layers_unsupported(model) -> str | None:
        """Why decode_step.c does not compute these layers, None where it does (see pg_layer)."""
        first = model.model.layers[0]
        for layer in model.model.layers:
            attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            if not hasattr(mlp, "gate_up_proj") or not hasattr(attn, "qkv_proj"):
                return "experts or another block than attention and a gated MLP"
            if type(mlp.act) not in ACTIVATIONS or type(mlp.act) is not type(first.mlp.act):
                return f"activation {type(mlp.act).__name__}"
            if attn.attn.scale != first.self_attn.attn.scale:
                return "attention scaled per layer"
            rope = attn.rotary_emb
            if rope.use_triton or rope.cos_sin_cache.dtype != torch.float32 or not rope.cos_sin_cache.is_contiguous():
                return "a RoPE table other than a float32 [positions, head_dim] of cos and sin"
            norms = [layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm,
                     getattr(layer, "pre_feedforward_layernorm", None),
                     getattr(layer, "post_feedforward_layernorm", None)]
            if any(n is not None and (type(n) not in (RMSNorm, GemmaRMSNorm)
                                      or getattr(n, "use_triton", False)) for n in norms):
                return "a norm other than RMSNorm or Gemma's"
        return None

    def _norm(self, norm: torch.nn.Module) -> int:
        """A norm's float32 scale: Gemma's (1 + weight), as GemmaRMSNorm computes it, else the weight."""
        w = norm.weight.detach().float()
        return self._fp32(1.0 + w if isinstance(norm, GemmaRMSNorm) else w)

    def _fp32(self, t: torch.Tensor) -> int:
        t = t.detach().float().contiguous()
        self._keep.append(t)
        return t.data_ptr()

    def _proj(self, layer: Int4WeightOnlyLinear | Int8WeightOnlyLinear) -> decode_step.Proj:
        bias = 0 if layer.bias is None else self._fp32(layer.bias)
        if isinstance(layer, Int8WeightOnlyLinear):  # q + 128 and fp16 scales, blocks of 32
            packed, d = layer._native_args
            return decode_step.Proj(bits=8, w=packed.data_ptr(), d=d.data_ptr(), m=None,
                                    bias=bias or None, n=layer.out_features)
        packed, d, m = layer._native_args
        return decode_step.Proj(bits=4, w=packed.data_ptr(), d=d.data_ptr(), m=m.data_ptr(),
                                bias=bias or None, n=layer.out_features)

    def takes(self, num_decode_rows: int, num_adapter_rows: int = 0) -> bool:
        """Whether a step with this many decode rows runs them here: not when a dense bf16 copy
        is asked to take that many rows, nor when any row runs under a LoRA adapter (the C step
        has no LoRA product)."""
        if num_adapter_rows:
            return False
        return num_decode_rows > 0 and not (self.dense_rows and num_decode_rows >= self.dense_rows)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
            meta: AttentionMetadata, window_slots: torch.Tensor | None = None, *,
            last_position: int | None = None) -> torch.Tensor:
        """The decode rows' ids, positions and cache slots [B] (long), their block tables and
        context lengths in ``meta`` -> final-norm hidden states [B, hidden] in the model's dtype.
        Writes each row's K/V into the pool, as the torch path does. A model whose sliding-window
        layers keep a pool of their own (``meta.window``): those layers' slots for the same rows in
        ``window_slots``, their tables in ``meta.window`` (the same width as ``meta``'s).
        ``last_position``: the largest of ``positions`` (or more) where the caller knows it, so
        that the check of the rotary tables' bound needs no reduction over the tensor."""
        return run_to_end(self.parts(input_ids, positions, slots, meta, window_slots,
                                     last_position=last_position))

    def parts(self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
              meta: AttentionMetadata, window_slots: torch.Tensor | None = None,
              pause: Callable[[], bool] | None = None, *, last_position: int | None = None
              ) -> Generator[None, None, torch.Tensor]:
        """``run`` as a generator that may stop between layers: a step of PAUSABLE_ROWS rows or
        more runs in PARTS parts, and before each part after the first ``pause()`` is asked; True
        yields there (the engine runs a newcomer's short step, then resumes this one with next()).
        It returns run's result, the same bits (decode_step.c's pagoda_decode_layers). Only one
        step may be part-way at a time: it keeps its work area apart, and any number of whole
        steps may run while it waits."""
        b = input_ids.shape[0]
        if last_position is None:
            last_position = int(positions.max())
        if last_position >= self.max_position:  # C reads the tables unchecked
            raise ValueError(f"position beyond the model's {self.max_position} rotary positions")
        x = self.embed(input_ids).contiguous()
        tables, ctx = meta.decode_block_tables, meta.decode_context_lens
        window_tables = tables
        if meta.window is not None and self.windowed:
            window_tables = meta.window.decode_block_tables
            if window_slots is None or window_tables is None or window_tables.shape != tables.shape:
                raise ValueError("the window layers' slots and tables are missing or of another shape")
        else:
            window_slots = slots
        shape = decode_step.Shape.from_buffer_copy(self.shape)  # this step's own: another may run meanwhile
        shape.table_width = tables.shape[1]
        shape.num_threads = torch.get_num_threads()
        lib = self.lib
        n = len(self.layers)
        bounds = [0, n]
        if pause is not None and b >= PAUSABLE_ROWS:
            bounds = sorted({n * i // PARTS for i in range(PARTS + 1)})
        kept = self._work if len(bounds) == 2 else self._paused_work
        work = self._buffer(kept, lib.pagoda_decode_work_floats(ctypes.byref(shape), b), b)
        scratch = self._buffer(self._scratch, lib.pagoda_decode_scratch_bytes(ctypes.byref(shape), b), b)
        out = torch.empty(b, shape.hidden, dtype=self.dtype)
        for first, last in zip(bounds, bounds[1:]):
            if first and pause():
                yield
                # (the steps run meanwhile used the scratch too: it holds nothing from one product to the next)
            lib.pagoda_decode_layers(
                self.layers, n, self.final_norm, ctypes.byref(shape), b,
                x.data_ptr(), int(x.dtype is torch.bfloat16), positions.data_ptr(), slots.data_ptr(),
                tables.data_ptr(), window_slots.data_ptr(), window_tables.data_ptr(), ctx.data_ptr(),
                out.data_ptr(), int(self.dtype is torch.bfloat16), work.data_ptr(), scratch.data_ptr(),
                first, last)
        return out

    @staticmethod
    def _buffer(kept: KeptBuffer, numel: int, rows: int) -> torch.Tensor:
        """A step's work area: the kept one for decode-sized steps; a prompt chunk's thousands of
        rows (batch-invariant prefill: 31 KiB a row for SmolLM2, 64 MiB at 2,048) get one for the
        call, so the process does not hold its largest prefill's area for good."""
        return torch.empty(numel, dtype=kept.dtype) if rows > KEPT_ROWS else kept.take(numel)
