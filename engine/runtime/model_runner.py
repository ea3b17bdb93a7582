"""Owns the model and the KV block pool on one device; runs one scheduled step."""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass

import torch

from engine.kernels.cpu import cpu_info
from engine.config import (EngineConfig, check_kv_cache_dtype, resolve_kv_cache_dtype,
                           resolve_quantization, resolve_use_triton)
from engine.kept_buffer import KeptBuffer
from engine.runtime.cuda_graphs import CudaGraphRunner
from engine.parts import run_to_end
from engine.runtime.device import default_dtype, resolve_device, resolve_dtype
from engine.distributed import parallel_state
from engine.distributed.ranks import join
from engine.errors import InvalidParameterError
from engine.memory.gpu_memory import MemoryProfile, memory_summary, profile_memory
from engine.memory.kv_pool import allocate_kv_pool
from engine.memory.weight_arena import move_kernel_weights
from engine.scheduling.input_batch import build_input_batch
from engine.memory.kv_pool_sizing import (kv_bytes_per_token, max_blocks_per_seq, num_kv_blocks,
                                          window_split)
from engine.kernels import kv_quant
from engine.layers.int8_embedding import Int8Embedding
from engine.layers.attention import Workspace
from engine.lora.runtime import LoRARuntime
from engine.sampling.sampler import Sampler
from engine.models.fused_decode import FusedDecode
from engine.models.loader import (apply_layouts, init_random_weights, load_weights, plan_layouts,
                                  weights_for, with_progress)
from engine.models.model_config import ModelConfig
from engine.models.registry import model_class
from engine.outputs import TokenLogprob
from engine.sampling.parallel_sampling import position_seed
from engine.sampling.sampling_metadata import SamplingMetadata
from engine.scheduling.scheduler import ScheduledSequence
from engine.speculative.verify import accept

LOGITS_BUFFER_BYTES = 64 << 20  # the most _logits_out keeps: Gemma 3, 64 rows; SmolLM2, 341
logger = logging.getLogger(__name__)

@dataclass
class SampledToken:
    """What one scheduled sequence's step produced: one token, or after a speculative draft the
    accepted draft tokens and the model's token after them (engine/speculative/verify.py)."""
    entry: ScheduledSequence
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, max_model_len: int,
                 weights, eos_token_ids: list[int],
                 progress: Callable[[int, int], None] | None = None, *, rank: int = 0,
                 port: int | None = None):
        """weights: HF-named (name, tensor) pairs; None fills the model with seeded random
        values instead (benchmarks of a shape without its checkpoint). With tensor_parallel_size
        > 1 this is rank 0, which starts the other ranks (``rank``/``port``: engine/distributed)."""
        self.config = config
        self.model_config = model_config
        self.max_model_len = max_model_len
        self.eos_token_ids = list(eos_token_ids)
        self.device = resolve_device(config.device)
        self.tp = config.tensor_parallel_size
        self.ranks = None  # rank 0 of a tensor-parallel engine: the other ranks (RankGroup)
        self.tp_group = None  # tensor parallel: this rank's TensorParallelGroup
        if self.tp > 1:
            if weights is None:
                raise InvalidParameterError("tensor_parallel_size", "> 1 needs a checkpoint "
                                            "(each rank loads its shard), not random weights")
            self.device, self.ranks, self.tp_group = join(
                config, model_config, max_model_len, eos_token_ids, self.device, rank, port)
        try:
            self._build(weights, progress)
        except BaseException:
            self.shutdown()  # the other ranks stop with this one
            raise

    def _build(self, weights, progress) -> None:
        """The model with its weights, the sampler and the KV pool."""
        config, model_config = self.config, self.model_config
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.block_size = config.block_size
        self.use_triton = resolve_use_triton(config.use_triton, self.device.type)
        check_kv_cache_dtype(config.kv_cache_dtype, device_type=self.device.type,
                             activation_dtype=str(self.dtype).removeprefix("torch."),
                             use_triton=self.use_triton,
                             compute_capability=lambda: torch.cuda.get_device_capability(self.device))
        with torch.device(self.device), default_dtype(self.dtype), parallel_state.building(
                self.tp_group):
            self.model = model_class(model_config.architecture)(model_config, use_triton=self.use_triton)
        self.model.eval()
        native = getattr(weights, "native_layouts", dict)()
        quantization = resolve_quantization(config.quantization, self.device.type)
        self.quantization_plan = plan_layouts(self.model, native, quantization,
                                              config.quantization_group_size)
        self.kv_cache_dtype = resolve_kv_cache_dtype(  # what the pool stores (auto resolved)
            config.kv_cache_dtype, str(self.dtype).removeprefix("torch."), self.device.type,
            quantized=bool(self.quantization_plan), use_triton=self.use_triton)
        dense_rows = self._dense_rows()
        if weights is None:
            init_random_weights(self.model, config.seed)
            apply_layouts(self.model, self.quantization_plan, self.dtype, keep_values=True,
                          dense_rows=dense_rows)
        else:
            apply_layouts(self.model, self.quantization_plan, self.dtype, dense_rows=dense_rows)
            load_weights(self.model, with_progress(weights_for(weights, self.quantization_plan,
                                                               self.model), progress,
                                                len(weights) if hasattr(weights, "__len__") else 0))
        # the int8 vocabulary projection for small steps where anything is quantized (bf16 only)
        self.model.lm_head.prepare(int8_small_rows=quantization not in (None, "none") and (
            bool(self.quantization_plan) or quantization != "auto" or any(
                native.get(n) for n in ("model.embed_tokens.weight", "lm_head.weight"))))
        # the native kernels' weights on 2 MiB pages, in the order a step reads them (before the
        # embedding shares the head's table and the fused step takes their addresses)
        self.weight_arena = move_kernel_weights(self.model) if self.device.type == "cpu" else None
        self._share_vocabulary_table()
        self.sampler = Sampler()
        self.memory_profile: MemoryProfile | None = None  # set when CUDA memory is profiled
        self.num_blocks = num_kv_blocks(config, device_type=self.device.type,
                                        max_model_len=self.max_model_len,
                                        bytes_per_block=self.bytes_per_block,
                                        device_budget=self._profiled_kv_budget)
        if self.tp > 1:  # every rank holds the same blocks, of its own KV heads
            self.num_blocks = self.tp_group.all_reduce_min(self.num_blocks)
        self.window_split = self._window_split()  # None: one pool, every layer in every block
        self.num_window_blocks = 0
        if self.window_split is not None:
            self.num_blocks = self.window_split.num_full_blocks
            self.num_window_blocks = self.window_split.num_window_blocks
        self.kv_pool, self.kv_scale_pool, self.kv_caches = self._allocate_kv_pool()
        # CPU: a step's decode rows through every layer in one native call where it applies
        self.fused_decode = FusedDecode.build(
            self.model, self.kv_caches, self.block_size, use_triton=self.use_triton,
            tensor_parallel=self.tp > 1, dense_rows=dense_rows) if self.device.type == "cpu" else None
        self.batch_invariant = self._batch_invariant(config, dense_rows)
        # LoRA adapters: projections wrapped (after the fused step took the plain ones) at the first
        self.lora = LoRARuntime(self.model, num_slots=config.max_loras, max_rank=config.max_lora_rank,
                                dtype=self.dtype, device=self.device, tensor_parallel=self.tp > 1)
        # seeded requests: their seed and the generator their rows' noise is drawn with, re-seeded
        # per sampled position (engine/sampling/sampler.py)
        self.seeds: dict[str, int] = {}
        self.generators: dict[str, torch.Generator] = {}
        self.workspace = Workspace(self.device)
        self._logits = KeptBuffer(torch.float32, LOGITS_BUFFER_BYTES)  # _logits_out's
        logger.info("KV cache: %d %sblocks x %d tokens = %d tokens, %.1f MiB (%s, %s)",
                    self.num_blocks, "full-attention layers' " if self.window_split else "",
                    self.block_size, self.num_blocks * self.block_size,
                    self.kv_cache_bytes / 2**20, self._kv_storage(), self.device)
        if self.window_split is not None:
            logger.info("KV capacity: %s; sliding-window layers' pool: %d blocks",
                        self.window_split.describe(self.max_model_len), self.num_window_blocks)
        logger.info(memory_summary(self.model, self.kv_cache_bytes, self.num_blocks * self.block_size,
                                   model_config, self.dtype, self.device))
        if self.memory_profile is not None:
            logger.info(self.memory_profile.summary(self.kv_cache_bytes, self.num_blocks,
                                                    self.block_size))
        self.cuda_graphs = self._capture_cuda_graphs()

    def _share_vocabulary_table(self) -> None:
        """A tied embedding reads the LM head's int8 table when it has one (CPU fast path), and the
        float table is freed (engine/layers/int8_embedding.py)."""
        head, inner = self.model.lm_head, self.model.model
        if (head.q8_weight is None or type(inner.embed_tokens) is not torch.nn.Embedding
                or head.weight is not inner.embed_tokens.weight):  # not tied, or vocabulary-parallel
            return
        inner.embed_tokens = Int8Embedding(head.q8_weight, head.q8_scales, self.dtype)
        head.weight = None  # the head multiplies its int8 copy only

    def _batch_invariant(self, config, dense_rows) -> bool:
        """Whether prompt rows take the fused step's per-row arithmetic too (config.batch_invariant);
        states at start-up whether a request's tokens are independent of its batch."""
        if not config.batch_invariant:
            logger.info("batch_invariant off: prompt chunks take the torch path; a greedy answer may "
                        "change with the batch, the chunking and the prefix cache")
            return False
        if self.fused_decode is None or dense_rows:
            logger.warning("batch_invariant: not guaranteed here (%s); prompt chunks take the torch path",
                           "dense bf16 copies" if dense_rows else "the fused CPU step does not run")
            return False
        logger.info("batch_invariant: every row (prompt tokens and decodes) through the fused step's "
                    "per-row arithmetic; a base-model request's tokens do not depend on its batch")
        return True

    def _logits_out(self, rows: int) -> torch.Tensor | None:
        """A float32 [rows, vocab] view of one buffer the CPU's int8 LM head writes a step's logits
        into (engine/kept_buffer.py), up to LOGITS_BUFFER_BYTES: a fresh one was 14 of the
        head's 47 ms for Gemma 3 at 32 rows (bench: 46.7 -> 32.2 ms). The step's logits are used
        up before the next step's (sampled, copied to the host). None where the head does not take it."""
        vocab = self.model_config.vocab_size
        if (self.device.type != "cpu" or self.tp > 1 or getattr(self.model.lm_head, "q8_weight", None) is None
                or rows * vocab * 4 > LOGITS_BUFFER_BYTES):
            return None
        return self._logits.take(rows, vocab)

    def _dense_rows(self) -> int | None:
        """quantization_dense_rows where it applies (quantized layers, CPU with fast bf16, bf16
        activations), else None: no dense copies."""
        rows = self.config.quantization_dense_rows
        if not (rows and self.quantization_plan):
            return None
        if self.device.type != "cpu" or self.dtype != torch.bfloat16 or not cpu_info.has_fast_bf16():
            logger.info("quantization_dense_rows %d unused: dense bf16 copies need a CPU with fast "
                        "bf16 and bf16 activations (here %s, %s)", rows, self.device,
                        str(self.dtype).removeprefix("torch."))
            return None
        logger.info("quantized projections: steps of >= %d rows use a dense bf16 copy of each "
                    "weight (its memory is 'dense bf16 copies' below), fewer the int4/int8 kernel",
                    rows)
        return rows

    # ----------------------------------------------------------------- memory
    def _window_split(self):
        """The two groups' pools of a model mixing sliding-window and full-attention layers on
        the torch path (kv_pool_sizing.WindowSplit); None for any other."""
        windows = self.model_config.layer_sliding_windows
        if (self.use_triton or self.tp > 1 or not any(windows) or all(windows)
                or len({w for w in windows if w}) != 1):
            return None
        return window_split(self.num_blocks * len(windows), window_layers=[bool(w) for w in windows],
                            window=max(w for w in windows if w), max_model_len=self.max_model_len,
                            block_size=self.block_size, max_num_seqs=self.config.max_num_seqs,
                            max_num_batched_tokens=self.config.max_num_batched_tokens)

    def _allocate_kv_pool(self):
        """engine/memory/kv_pool.py: one group of every layer, or with a window split the
        sliding-window layers (group 1) over blocks of their own."""
        cfg = self.model_config
        groups = [int(bool(self.window_split and cfg.sliding_window(i)))
                  for i in range(cfg.num_hidden_layers)]
        return allocate_kv_pool(groups, [self.num_blocks, self.num_window_blocks][:max(groups) + 1],
                                block_size=self.block_size, num_kv_heads=cfg.num_key_value_heads // self.tp,
                                head_dim=cfg.head_dim, dtype=self.kv_dtype,
                                code_dtype=self._kv_code_dtype(), device=self.device)

    def _kv_code_dtype(self) -> torch.dtype | None:
        return kv_quant.code_dtype(self.kv_cache_dtype)

    @property
    def kv_dtype(self) -> torch.dtype:
        """What a plain (not 8-bit) pool stores: bf16 when asked, else the activation dtype."""
        return torch.bfloat16 if self.kv_cache_dtype == "bfloat16" else self.dtype

    def _kv_storage(self) -> str:
        """The pool's element type in words, for the start-up log."""
        codes = self._kv_code_dtype()
        if codes is None:
            stored = str(self.kv_dtype).removeprefix("torch.")
            return stored if self.kv_dtype == self.dtype else f"{stored}, read as {str(self.dtype).removeprefix('torch.')}"
        return (f"{self.kv_cache_dtype} codes + float32 scale per token and KV head, "
                f"dequantized to {str(self.dtype).removeprefix('torch.')}")

    @property
    def bytes_per_block(self) -> int:
        cfg = self.model_config
        return self.block_size * kv_bytes_per_token(
            self.kv_cache_dtype, num_layers=cfg.num_hidden_layers,
            num_kv_heads=cfg.num_key_value_heads // self.tp, head_dim=cfg.head_dim,
            elem=torch.tensor([], dtype=self.dtype).element_size())

    @property
    def kv_cache_bytes(self) -> int:
        if self.window_split is None:
            return self.num_blocks * self.bytes_per_block
        split = self.window_split  # blocks of one layer, in both groups
        return self.bytes_per_block // self.model_config.num_hidden_layers * (
            self.num_blocks * split.num_full_layers + self.num_window_blocks * split.num_window_layers)

    def _profiled_kv_budget(self) -> int:
        """What gpu_memory_utilization leaves the pool after a profiled step (CUDA)."""
        cfg = self.model_config
        self.memory_profile = profile_memory(
            self.model, self.sampler, utilization=self.config.gpu_memory_utilization,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            max_num_seqs=self.config.max_num_seqs, max_model_len=self.max_model_len,
            block_size=self.block_size, num_kv_heads=cfg.num_key_value_heads // self.tp,
            head_dim=cfg.head_dim, num_layers=cfg.num_hidden_layers, dtype=self.dtype,
            device=self.device, use_triton=self.use_triton)
        return self.memory_profile.kv_budget_bytes

    def _capture_cuda_graphs(self) -> CudaGraphRunner | None:
        """Decode graphs on CUDA unless enforce_eager; they need the Triton attention path,
        whose metadata lives on the device (the PyTorch path builds masks on the host)."""
        if (self.device.type != "cuda" or self.config.enforce_eager or not self.use_triton
                or self.tp > 1):  # no collectives inside graphs yet
            return None
        graphs = CudaGraphRunner(self.model, self.kv_caches, self.config.max_num_seqs,
                                 max_blocks_per_seq(self.max_model_len, self.block_size), self.device)
        graphs.capture()
        return graphs

    # ----------------------------------------------------------------- step
    def add_request(self, request_id: str, seed: int | None) -> None:
        if seed is not None:
            self.seeds[request_id] = seed
            self.generators[request_id] = torch.Generator(self.device)

    def remove_request(self, request_id: str) -> None:
        self.seeds.pop(request_id, None)
        self.generators.pop(request_id, None)

    def execute(self, entries: list[ScheduledSequence]) -> list[SampledToken]:
        """One step, whole."""
        return run_to_end(self.parts(entries))

    @torch.inference_mode()
    def parts(self, entries: list[ScheduledSequence], pause: Callable[[], bool] | None = None
              ) -> Generator[None, None, list[SampledToken]]:
        """One step as a generator (engine/parts.py): where every row runs the fused CPU
        step, it may yield between layers when ``pause()`` says so; it returns the sampled tokens.
        Where the fused CPU decode step runs, LoRA rows beside base decodes make two forwards (the
        base decodes fused, the rest on the torch path): a base request's tokens never depend on
        whether adapters share its step; such a step runs whole."""
        if self.fused_decode is not None and any(e.seq.adapter is not None for e in entries):
            fusable = [e.seq.adapter is None and (e.num_new_tokens == 1 or self.batch_invariant)
                       for e in entries]
            rows = sum(e.num_new_tokens for e, f in zip(entries, fusable) if f)
            if 0 < sum(fusable) < len(entries) and self.fused_decode.takes(rows):
                return (run_to_end(self._parts([e for e, f in zip(entries, fusable) if not f]))
                        + run_to_end(self._parts([e for e, f in zip(entries, fusable) if f])))
        return (yield from self._parts(entries, pause))

    def _parts(self, entries: list[ScheduledSequence], pause: Callable[[], bool] | None = None
               ) -> Generator[None, None, list[SampledToken]]:
        num_adapter_rows = sum(e.num_new_tokens for e in entries if e.seq.adapter is not None)
        every_row = self.batch_invariant and not num_adapter_rows
        fused = self.fused_decode is not None and self.fused_decode.takes(
            sum(e.num_new_tokens if every_row else e.num_new_tokens == 1 for e in entries), num_adapter_rows)
        batch = build_input_batch(entries, self.block_size, self.device, self.use_triton, fused,
                                  window_tables=self.window_split is not None,
                                  fused_prefill=fused and every_row)
        batch.meta.workspace = self.workspace
        if batch.meta.window is not None:
            batch.meta.window.workspace = self.workspace
        if num_adapter_rows:
            self.lora.prepare(batch.ordered)
        # Built before the forward is queued, so its host-to-device copies never wait on it.
        meta = self._sampling_metadata(batch.sampling, batch.sample_positions) if batch.sampling else None
        if self.ranks is not None:  # tensor parallel: the other ranks run the same step
            self.ranks.send_step(entries)
        try:
            if not num_adapter_rows and self.cuda_graphs is not None and self.cuda_graphs.can_run(batch.meta):
                hidden = self.cuda_graphs.run(batch.input_ids, batch.positions, batch.meta)
            elif fused:
                hidden = yield from self._forward_fused(batch, every_row, pause)
            else:
                hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.meta)
            if not batch.sampling:
                return []
            logits = self.model.compute_logits(hidden[batch.logits_rows],  # [S, V]
                                               out=self._logits_out(len(batch.sampling)))
        except Exception as exc:
            if self.ranks is not None:  # the ranks' collectives are out of step now
                self.ranks.fail(exc)  # raises RankLostError
            raise
        finally:
            self.lora.clear()
        out = self.sampler(logits, meta)
        token_ids, logprobs = self._to_host(batch.sampling, out)
        return _per_sequence(batch.sampling, token_ids, logprobs)

    def _forward_fused(self, batch, every_row: bool, pause: Callable[[], bool] | None
                       ) -> Generator[None, None, torch.Tensor]:
        """Every row fused (batch-invariant; it may pause between layers), or prefill rows through
        the model and the decode rows (the flat batch's last) fused, whole."""
        n, meta = batch.meta.num_prefill_tokens, batch.meta
        ids, positions = batch.input_ids, batch.positions
        window_slots = None if meta.window is None else meta.window.slot_mapping
        if every_row:
            return (yield from self.fused_decode.parts(ids, positions, meta.slot_mapping, meta,
                                                       window_slots, pause,
                                                       last_position=batch.last_position))
        decoded = self.fused_decode.run(ids[n:], positions[n:], meta.slot_mapping[n:], meta,
                                        None if window_slots is None else window_slots[n:],
                                        last_position=batch.last_position)
        if n == 0:
            return decoded
        head = self.model(ids[:n], positions[:n], self.kv_caches, meta.prefill_part())
        return torch.cat([head, decoded])

    @torch.inference_mode()
    def run_shard(self, entries: list[ScheduledSequence]) -> None:
        """A rank > 0's step: the forward and its share of the logits, which rank 0 samples."""
        batch = build_input_batch(entries, self.block_size, self.device, self.use_triton)
        batch.meta.workspace = self.workspace
        hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.meta)
        if batch.sampling:
            self.model.compute_logits(hidden[batch.logits_rows])

    def shutdown(self) -> None:
        """Stop a tensor-parallel engine's other ranks and leave the group (no-op otherwise)."""
        if self.ranks is not None:
            self.ranks.close()
            self.ranks = None

    def _sampling_metadata(self, entries: list[ScheduledSequence], positions: list[int]) -> SamplingMetadata:
        """``entries``: one per sampled row; ``positions``: the position each row samples (a
        seeded row's noise comes from its seed and that position alone)."""
        params = [e.seq.params for e in entries]
        needs_history = any(p.has_penalties for p in params)
        suppress = []
        for e in entries:
            p = e.seq.params
            if e.seq.num_output_tokens < p.min_tokens:
                suppress.append(list(p.stop_token_ids) + ([] if p.ignore_eos else self.eos_token_ids))
            else:
                suppress.append([])
        return SamplingMetadata.build(
            params,
            prompt_token_ids=[e.seq.prompt_token_ids if needs_history else [] for e in entries],
            output_token_ids=[e.seq.output_token_ids if needs_history else [] for e in entries],
            generators=[self.generators.get(e.seq.request_id) for e in entries],
            row_seeds=[None if (seed := self.seeds.get(e.seq.request_id)) is None else position_seed(seed, p)
                       for e, p in zip(entries, positions)],
            suppress_token_ids=suppress,
            device=self.device,
            grammars=[e.seq.grammar for e in entries],
        )

    @staticmethod
    def _to_host(entries, out) -> tuple[list[int], list[TokenLogprob | None]]:
        """The step's one device-to-host copy: sampled ids, and their logprobs when asked."""
        if out.logprobs is None:
            return out.sampled_token_ids.tolist(), [None] * len(entries)
        k = out.top_token_ids.shape[1]
        # [S, 2 + 2k] float64 holds token ids (< 2**53) and float32 logprobs exactly.
        rows = torch.cat([out.sampled_token_ids[:, None].double(), out.logprobs[:, None].double(),
                          out.top_token_ids.double(), out.top_logprobs.double()], dim=1).tolist()
        token_ids = [int(r[0]) for r in rows]
        result: list[TokenLogprob | None] = []
        for e, r in zip(entries, rows):
            n = e.seq.params.logprobs
            if n is None:
                result.append(None)
                continue
            top = [(int(t), lp) for t, lp in zip(r[2:2 + n], r[2 + k:2 + k + n])]
            result.append(TokenLogprob(token_id=int(r[0]), logprob=r[1], top=top))
        return token_ids, result


def _per_sequence(rows: list[ScheduledSequence], token_ids: list[int],
                  logprobs: list[TokenLogprob | None]) -> list[SampledToken]:
    """The sampled rows grouped by sequence; a speculative entry's k + 1 rows (consecutive) keep
    the accepted draft and the model's token after it, and the entry learns how many it rejected."""
    out: list[SampledToken] = []
    i = 0
    while i < len(rows):
        e = rows[i]
        if not e.draft:
            out.append(SampledToken(e, [token_ids[i]], [logprobs[i]]))
            i += 1
            continue
        n = len(e.draft) + 1
        a = accept(e.draft, token_ids[i:i + n])
        e.num_rejected = len(e.draft) - a
        out.append(SampledToken(e, token_ids[i:i + a + 1], logprobs[i:i + a + 1]))
        i += n
    return out
