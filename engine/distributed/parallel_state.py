"""A tensor-parallel group (its rank, size and collectives), which group the model being built
belongs to, and the checks that a model splits evenly.

Each engine has its own group (a ProcessGroupGloo or ProcessGroupNCCL over its own TCPStore),
not torch.distributed's default group, so one process can hold two tensor-parallel engines at
once: a new version loading while the old one still serves. Layers capture the group that is
``current()`` while they are built (``building``); outside tensor parallelism it is None.
"""

from __future__ import annotations

import contextlib
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from engine.errors import EngineError, InvalidParameterError

# A collective waiting longer than this for a peer fails (gloo honours it; NCCL reports it).
COLLECTIVE_TIMEOUT_S = 120.0

_building: TensorParallelGroup | None = None


class RankLostError(EngineError):
    """A tensor-parallel rank died or stopped answering: the engine cannot run another step."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TensorParallelGroup:
    """Rank ``rank`` of ``size`` meeting on 127.0.0.1:``port`` (rank 0 serves the store)."""

    def __init__(self, rank: int, size: int, port: int, device: torch.device,
                 timeout_s: float = COLLECTIVE_TIMEOUT_S):
        self.rank, self.size, self.device = rank, size, device
        timeout = timedelta(seconds=timeout_s)
        self.store = dist.TCPStore("127.0.0.1", port, size, is_master=rank == 0, timeout=timeout)
        if device.type == "cuda":
            torch.cuda.set_device(device)
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(self.store, rank, size, options)
        else:
            self.pg = dist.ProcessGroupGloo(self.store, rank, size, timeout)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; returns it."""
        self.pg.allreduce([x]).wait()
        return x

    def all_reduce_min(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.long, device=self.device)
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MIN
        self.pg.allreduce([t], options).wait()
        return int(t.item())

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor | None:
        """logits [S, V / size] of this rank's vocabulary slice -> [S, V] on rank 0, else None."""
        logits = logits.contiguous()
        options = dist.GatherOptions()
        options.rootRank = 0
        if self.rank != 0:
            self.pg.gather([], [logits], options).wait()
            return None
        parts = [torch.empty_like(logits) for _ in range(self.size)]
        self.pg.gather([parts], [logits], options).wait()
        return torch.cat(parts, dim=1)

    def close(self) -> None:
        self.pg = self.store = None


def current() -> TensorParallelGroup | None:
    """The group of the model being built (None: no tensor parallelism)."""
    return _building


@contextlib.contextmanager
def building(group: TensorParallelGroup | None):
    global _building
    previous, _building = _building, group
    try:
        yield
    finally:
        _building = previous


def rank_device(device: torch.device, rank_: int) -> torch.device:
    """Rank r's device: cuda:(first + r) on CUDA, the CPU otherwise."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank_)


def check_divisible(model_config, tp: int, device: torch.device) -> None:
    """InvalidParameterError naming tensor_parallel_size and the sizes that do not divide by it."""
    if tp == 1:
        return
    sizes = {"num_attention_heads": model_config.num_attention_heads,
             "num_key_value_heads": model_config.num_key_value_heads,
             "intermediate_size": model_config.intermediate_size,
             "vocab_size": model_config.vocab_size}
    bad = [f"{name} {value}" for name, value in sizes.items() if value % tp]
    if bad:
        raise InvalidParameterError(
            "tensor_parallel_size", f"{tp} does not divide the model's {', '.join(bad)} (each rank "
            f"holds an equal share of the attention heads, KV heads, MLP columns and vocabulary)")
    if device.type == "cuda":
        first = device.index or 0
        if first + tp > torch.cuda.device_count():
            raise InvalidParameterError(
                "tensor_parallel_size", f"{tp} ranks from cuda:{first} need {first + tp} CUDA "
                f"devices; this machine has {torch.cuda.device_count()}")
