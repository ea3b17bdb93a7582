"""The engine's one configuration object, validated on construction (no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidParameterError

SCHEDULING_POLICIES = ("fcfs", "priority")
DTYPES = ("auto", "float32", "float16", "bfloat16")
DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30  # 1 GiB


@dataclass
class EngineConfig:
    model: str  # a Hugging Face directory, a .gguf file, or "smollm2" for the bundled model
    dtype: str = "auto"  # float32 on CPU, bfloat16 on CUDA
    device: str = "auto"  # "cuda" when available, else "cpu"
    block_size: int = 16
    kv_cache_memory: int | None = None  # bytes for the KV pool; default 1 GiB on CPU
    gpu_memory_utilization: float = 0.90  # on CUDA, when kv_cache_memory is not set
    num_kv_blocks: int | None = None  # overrides the memory budget (tests force small pools)
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # default: the model's own context length
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"
    seed: int = 0
    enforce_eager: bool = False  # no CUDA graphs
    use_triton: bool | None = None  # None: Triton kernels on CUDA, PyTorch on CPU

    def __post_init__(self) -> None:
        def check(ok: bool, param: str, message: str) -> None:
            if not ok:
                raise InvalidParameterError(param, message)

        check(isinstance(self.model, str) and bool(self.model), "model", "must name a model")
        check(self.dtype in DTYPES, "dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
        check(self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
              "device", f"must be auto, cpu or cuda[:N], got {self.device!r}")
        check(isinstance(self.block_size, int) and self.block_size in (8, 16, 32, 64, 128),
              "block_size", f"must be one of 8, 16, 32, 64, 128, got {self.block_size!r}")
        check(self.kv_cache_memory is None or self.kv_cache_memory > 0,
              "kv_cache_memory", "must be a positive number of bytes")
        check(0.0 < self.gpu_memory_utilization <= 1.0,
              "gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization}")
        check(self.num_kv_blocks is None or self.num_kv_blocks >= 1,
              "num_kv_blocks", "must be at least 1")
        check(self.max_num_seqs >= 1, "max_num_seqs", "must be at least 1")
        check(self.max_num_batched_tokens >= 1, "max_num_batched_tokens", "must be at least 1")
        check(self.max_model_len is None or self.max_model_len >= 1,
              "max_model_len", "must be at least 1")
        check(self.scheduling_policy in SCHEDULING_POLICIES, "scheduling_policy",
              f"must be one of {SCHEDULING_POLICIES}, got {self.scheduling_policy!r}")
