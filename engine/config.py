"""The engine's one configuration object, the schema of its user-settable fields, and the rules
that resolve its settings against a device.

``SETTINGS`` describes every field a user may set (name, type, default, choices or range,
help); the webapp, the console form, the CLI and the worker read it rather than copy it.
``EngineConfig`` checks each value alone; the ``resolve_*`` / ``check_*`` functions decide what a
setting means, or refuse it, once the device and the activation dtype are known (the runner, and
engine/memory/estimate.py beside it). Imports no torch (a test checks it), so the web process may import
this module.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from engine.errors import InvalidParameterError

SCHEDULING_POLICIES = ("fcfs", "priority")
DTYPES = ("auto", "float32", "float16", "bfloat16")
BLOCK_SIZES = (8, 16, 32, 64, 128)
CONVERT_DTYPES = ("float16", "bfloat16", "float32")  # what a safetensors checkpoint converts to
# auto: keep a checkpoint's own precision (GGUF Q4_0/Q4_1 -> int4, Q8_0 -> int8, a quantized
# safetensors checkpoint as it is, float as stored); none (or None): float weights; int8 / int4:
# quantize the projections at load.
QUANTIZATIONS = ("auto", "none", "int8", "int4")
# auto: K/V stored in the activation dtype (resolve_kv_cache_dtype says where not); bfloat16: bf16
# whatever the activations; int8 / fp8_e4m3: codes with one float32 scale per (token, KV head),
# written with the token (engine/kernels/kv_quant.py says why).
KV_CACHE_DTYPES = ("auto", "bfloat16", "int8", "fp8_e4m3")

CONVERT_QUANTIZATIONS = ("int8", "int4")  # what `python -m engine convert` writes
INT4_GROUP_SIZES = (32, 64, 128, 256)
# Rows of a step from which a quantized projection multiplies a dense bf16 copy of its weight
# instead of running the int4/int8 kernel (CPU with fast bf16 only). Measured on AVX512-BF16
# (bench/linear_kernels.py, SmolLM2's 30 layers): int4 g32 11.5 ms vs bf16 12.0 at 16 rows,
# 13.9 vs 12.0 at 17 (the int4 kernel works in tiles of 16 rows), 21 vs 17 at 32. Off by
# default: the copy costs 2 bytes a weight (202 MiB for SmolLM2, against a 1.5x-of-llama.cpp
# memory goal), served 32 streams did not measurably gain, and mixing the two kernels within
# one request (prefill dense, decode int4) flipped SmolLM2's near-tie answer to "What is the
# capital of France?". Offline batch jobs gain 1.24x from it: set it to this for them.
DENSE_ROWS_CROSSOVER = 17
DEFAULT_QUANTIZATION_DENSE_ROWS = None
# On CPU with fair share, the default cap on the decodes of one step (max_num_decodes_per_step)
CPU_MAX_NUM_DECODES_PER_STEP = 32
# On CPU the default KV pool holds max_num_seqs x max_model_len tokens, at most this fraction
# of the machine's memory.
CPU_KV_CACHE_MEMORY_FRACTION = 0.1


def resolve_kv_cache_dtype(setting: str, activation_dtype: str, device_type: str, *,
                           quantized: bool, use_triton: bool) -> str:
    """What the pool stores for a kv_cache_dtype setting: auto is the activation dtype, except on
    a CPU computing float32 over quantized projections (the fast path where bf16 is not fast,
    already rounding its weights and activations), where it is bfloat16: attention there reads
    the pool from memory every step, and bf16 halves those bytes and the pool's size."""
    if (setting == "auto" and device_type == "cpu" and activation_dtype == "float32" and quantized
            and not use_triton):
        return "bfloat16"
    return setting


def check_kv_cache_dtype(setting: str, *, device_type: str, activation_dtype: str, use_triton: bool,
                         compute_capability: Callable[[], tuple[int, int]]) -> None:
    """InvalidParameterError naming kv_cache_dtype when the device, the activation dtype and the
    kernels cannot serve ``setting``; ``compute_capability`` (the CUDA device's) is asked only
    where it decides."""
    if setting == "fp8_e4m3" and device_type == "cpu":
        # torch's CPU float8 -> bf16 conversion is scalar: decode measured 4-5x the auto
        # cache's step at 1,000 tokens and at 32 x 200 (bench/kv_cache_dtype.py)
        raise InvalidParameterError("kv_cache_dtype", "fp8_e4m3 needs a CUDA device; on a CPU "
                                    "use int8 (the same memory, the same tokens)")
    if (setting == "fp8_e4m3" and use_triton and device_type == "cuda"
            and compute_capability() < (8, 9)):
        raise InvalidParameterError("kv_cache_dtype", "fp8_e4m3 in the Triton kernels needs a GPU "
                                    "of compute capability 8.9 or later (Ada, Hopper); use int8")
    if setting == "bfloat16" and use_triton and activation_dtype != "bfloat16":
        raise InvalidParameterError("kv_cache_dtype", "bfloat16 under float32 activations is "
                                    "the torch path's; the Triton kernels read the pool in the "
                                    "activation dtype: use dtype bfloat16 (the same cache)")


def resolve_use_triton(setting: bool | None, device_type: str) -> bool:
    """use_triton unset: the Triton kernels on CUDA, the torch path (and native kernels) on a CPU."""
    return setting if setting is not None else device_type == "cuda"


def resolve_quantization(setting: str | None, device_type: str) -> str | None:
    """Off the CPU auto keeps float weights: the int4/int8 layers' Triton kernels
    (engine/kernels/quant_matmul.py) are tested interpreted and compiled for sm_90 but not yet
    timed against bf16 cuBLAS on a GPU (bench/quant_matmul.py); int4 / int8 opt in."""
    if setting == "auto" and device_type != "cpu":
        return None
    return setting


@dataclass(frozen=True)
class Setting:
    """One user-settable EngineConfig field: what values it takes and what it means."""

    name: str
    type: type  # bool, int, float or str; an int is accepted for a float
    default: object
    help: str
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False  # the value must be greater than ``minimum``
    pattern: str | None = None  # a full-match regex for str values, beside ``choices``
    is_nullable: bool = False  # None is accepted although the default is not None

    @property
    def nullable(self) -> bool:
        return self.default is None or self.is_nullable

    def expected(self) -> str:
        """What the value must be, in words: 'one of 8, 16, ...', 'an integer >= 1', ..."""
        if self.choices:
            text = "one of " + ", ".join(map(str, self.choices))
            if self.pattern:
                text += f" (or matching {self.pattern})"
        elif self.type is bool:
            text = "true or false"
        else:
            text = {int: "an integer", float: "a number", str: "a string"}[self.type]
            if self.minimum is not None:
                text += f" {'>' if self.exclusive_minimum else '>='} {self.minimum:g}"
            if self.maximum is not None:
                text += f" and <= {self.maximum:g}" if self.minimum is not None else f" <= {self.maximum:g}"
        return text + (" or null" if self.nullable else "")

    def is_valid(self, value: object) -> bool:
        if value is None:
            return self.nullable
        if self.type is float:
            ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif self.type is int:
            ok_type = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok_type = isinstance(value, self.type)
        if not ok_type:
            return False
        if self.choices or self.pattern:
            return value in self.choices or bool(
                self.pattern and isinstance(value, str) and re.fullmatch(self.pattern, value))
        if self.minimum is not None and (value <= self.minimum if self.exclusive_minimum
                                         else value < self.minimum):
            return False
        return self.maximum is None or value <= self.maximum

    def check(self, value: object) -> None:
        """InvalidParameterError naming this setting when ``value`` is not one it takes."""
        if not self.is_valid(value):
            raise InvalidParameterError(self.name, f"must be {self.expected()}, got {value!r}")


def _setting(default, help: str, type: type = int, **rules):
    """A dataclass field carrying its Setting (named when SETTINGS is built below)."""
    return field(default=default, metadata={"setting": dict(type=type, default=default, help=help, **rules)})


@dataclass(frozen=True)
class EngineConfig:
    model: str  # a Hugging Face directory, a .gguf file, or "smollm2" for the bundled model
    dtype: str = _setting("auto", "activation dtype; auto: bfloat16 on CUDA and on CPUs with native "
                          "bf16 (avx512_bf16 / amx_bf16), else float32", str, choices=DTYPES)
    quantization: str | None = _setting(
        "auto", "weight-only quantization of the projections; auto: keep the checkpoint's own "
        "(GGUF Q4 -> int4, Q8_0 -> int8, safetensors as stored), none: float, int8 / int4: "
        "quantize at load", str, choices=QUANTIZATIONS, is_nullable=True)
    quantization_group_size: int = _setting(
        32, "input columns per int4 scale and zero when quantizing (GGUF Q4 blocks are 32)",
        choices=INT4_GROUP_SIZES)
    quantization_dense_rows: int | None = _setting(
        DEFAULT_QUANTIZATION_DENSE_ROWS, "on a CPU with fast bf16 and bf16 activations, steps of at "
        "least this many rows multiply a dense bf16 copy of each int4/int8 projection (2 bytes a "
        "weight more) instead of the weight-only kernel; 0 or null (the default): no dense copy; 17 is "
        "the crossover against torch's int4 kernel on AVX512-BF16; the engine's own CPU kernels "
        "beat the bf16 GEMM up to at least 128 rows there (bench/cpu_kernels.py); on a CPU with AMX "
        "128 prefills long prompts 1.4-1.5x faster (bench/prefill.py --dense-rows)",
        minimum=0, maximum=1 << 20, is_nullable=True)
    device: str = _setting("auto", "auto (cuda when available, else cpu), cpu, cuda or cuda:N", str,
                           choices=("auto", "cpu", "cuda"), pattern=r"cuda:\d+")
    block_size: int = _setting(16, "tokens per KV cache block", choices=BLOCK_SIZES)
    kv_cache_dtype: str = _setting(
        "auto", "what the KV cache stores; auto: the activation dtype (bfloat16 on a CPU computing "
        "float32 over quantized projections); bfloat16: bf16 whatever the "
        "activations (float32 ones: half the pool's bytes, read back as float32); int8 / fp8_e4m3: 8-bit codes "
        "with a float32 scale per token and KV head, so the same memory holds about twice the "
        "tokens of bf16 (four times float32's); fp8_e4m3 on CUDA only", str, choices=KV_CACHE_DTYPES)
    kv_cache_memory: int | None = _setting(
        None, "size of the KV pool in bytes; default on CPU: max_num_seqs x max_model_len tokens, "
        f"at most {CPU_KV_CACHE_MEMORY_FRACTION:g} of the machine's memory", minimum=1)
    gpu_memory_utilization: float = _setting(
        0.90, "fraction of GPU memory to use, when kv_cache_memory is not set", float,
        minimum=0.0, maximum=1.0, exclusive_minimum=True)
    num_kv_blocks: int | None = _setting(None, "KV blocks in the pool; overrides the memory budget",
                                         minimum=1)
    max_num_seqs: int = _setting(128, "most sequences running at once", minimum=1)
    max_num_batched_tokens: int = _setting(2048, "most tokens in one step", minimum=1)
    max_num_decodes_per_step: int | None = _setting(
        None, "most running sequences fed a decode token in one step; past it they take turns, those "
        f"that waited longest first. Default (null): {CPU_MAX_NUM_DECODES_PER_STEP} on a CPU with "
        "fair_share (a step's time grows with its rows there: 128 decodes take 4x what 32 take, "
        "for the same tokens/s, and a request arriving waits for the step in progress), no cap on "
        "CUDA or without fair_share; 0: no cap", minimum=0, is_nullable=True)
    max_model_len: int | None = _setting(None, "context length in tokens; default: the model's own",
                                         minimum=1)
    enable_prefix_caching: bool = _setting(True, "reuse the KV blocks of a shared prompt prefix", bool)
    batch_invariant: bool = _setting(
        True, "a request's tokens do not depend on the rest of its batch, how its prompt was chunked, "
        "the prefix cache, the thread count or a preemption: where the fused CPU step runs (Llama, "
        "Mistral, Qwen2/3, Phi-3 or Gemma 3 layers over the engine's int4/int8 kernels, a bf16 or "
        "float32 pool, no dense bf16 copies), prompt tokens take its per-row arithmetic as decodes "
        "do. false: prompt chunks take the torch path (SDPA's flash kernel, whose bits depend on "
        "where the prompt was cut). Where the fused step does not run (CUDA, experts, float "
        "projections, 8-bit caches, LoRA rows) it is not guaranteed; start-up states which holds", bool)
    speculative_tokens: int = _setting(
        8, "speculative decoding by prompt lookup: most draft tokens a decoding sequence proposes "
        "in a step, copied from where its last tokens occurred before in its prompt or output, and "
        "verified in the same step (greedy and seeded answers are unchanged; a draft is shortened "
        "after misses and paused after a whole one is rejected); 0: off", minimum=0, maximum=64)
    speculative_max_decodes: int = _setting(
        4, "steps with more decoding sequences than this draft nothing (many decodes already make "
        "a step compute-bound, and draft rows would slow every stream)", minimum=1)
    speculative_model: str | None = _setting(
        None, "a smaller model that shares this one's vocabulary (a .gguf file or a Hugging Face "
        "directory) drafts instead of prompt lookup: greedy, up to speculative_tokens a step, "
        "verified as prompt lookup's drafts are (answers unchanged)", str, is_nullable=True)
    scheduling_policy: str = _setting("fcfs", "fcfs, or priority (lower priority value first)", str,
                                      choices=SCHEDULING_POLICIES)
    fair_share: bool = _setting(
        True, "weighted fair share across tenants (the server's users): waiting requests are admitted, "
        "and running ones preempted, by the tokens each tenant was served per unit of its weight; "
        "false: first come, first served across everyone (and no KV quota). With one tenant (the "
        "engine used alone) the two are the same", bool)
    max_tenant_kv_share: float = _setting(
        0.75, "most of the KV pool one tenant's requests may hold while another tenant's wait (its "
        "first request excepted); 1: no quota. Never binds with one tenant", float,
        minimum=0.0, maximum=1.0, exclusive_minimum=True)
    seed: int = _setting(0, "seed of the random weights of a test model")
    enforce_eager: bool = _setting(False, "no CUDA graphs", bool)
    use_triton: bool | None = _setting(None, "Triton kernels; default: on CUDA yes, on CPU no", bool)
    tensor_parallel_size: int = _setting(
        1, "processes (one per device) the model is split across by attention heads, MLP columns "
        "and vocabulary; heads, KV heads, intermediate and vocabulary sizes must divide by it",
        minimum=1, maximum=64)

    max_loras: int = _setting(
        4, "LoRA adapters resident at once (the least recently used one no running request uses "
        "is unloaded for a new one); their layers are installed at the first adapter request; 0: "
        "no adapters", minimum=0, maximum=256)
    max_lora_rank: int = _setting(16, "largest LoRA rank served; each slot holds this rank",
                                  minimum=1, maximum=1024)

    def __post_init__(self) -> None:
        if not (isinstance(self.model, str) and self.model):
            raise InvalidParameterError("model", "must name a model")
        for setting in SETTINGS:
            setting.check(getattr(self, setting.name))

    @classmethod
    def from_settings(cls, model: str, settings: dict) -> EngineConfig:
        """The config for ``model`` with ``settings``; an unknown key raises InvalidParameterError
        naming it and listing the known ones."""
        unknown = sorted(set(settings) - SETTINGS_BY_NAME.keys())
        if unknown:
            raise InvalidParameterError(unknown[0], f"unknown engine setting; known: {', '.join(SETTINGS_BY_NAME)}")
        return cls(model=model, **settings)


SETTINGS: tuple[Setting, ...] = tuple(
    Setting(name=f.name, **f.metadata["setting"]) for f in fields(EngineConfig) if "setting" in f.metadata)
SETTINGS_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def check_settings(settings: object) -> dict:
    """A key-sorted copy of ``settings`` when every key is known and every value valid;
    InvalidParameterError naming the first bad key otherwise (no model is needed)."""
    if not isinstance(settings, dict):
        raise InvalidParameterError("engine_settings", "must be an object of engine settings")
    EngineConfig.from_settings("unchecked", settings)
    return dict(sorted(settings.items()))


def draft_settings(config: EngineConfig, max_model_len: int) -> dict:
    """The settings speculative_model's engine runs with, over this engine's (``max_model_len``:
    this engine's context): as many sequences as a step drafts for, a KV pool of two of this
    engine's longest sequences (more drafting at once near the longest preempt each other there,
    as in any engine), its own context, no drafts of its own."""
    blocks = -(-max_model_len // config.block_size)
    return {"model": config.speculative_model, "speculative_model": None, "speculative_tokens": 0,
            "max_num_seqs": config.speculative_max_decodes, "num_kv_blocks": 2 * blocks + 1,
            "kv_cache_memory": None, "max_model_len": None, "fair_share": False, "max_loras": 1}


def max_num_decodes(config: EngineConfig, device_type: str) -> int | None:
    """The scheduler's cap on one step's decodes (None: none), its default resolved for the device."""
    if config.max_num_decodes_per_step is not None:
        return config.max_num_decodes_per_step or None
    return CPU_MAX_NUM_DECODES_PER_STEP if device_type == "cpu" and config.fair_share else None
