"""This process's rank in its tensor-parallel group, the group's collectives, and the checks
that a model splits evenly.

One tensor-parallel engine per process: ``init`` sets the default process group, ``destroy``
ends it. Outside tensor parallelism (the default) rank is 0 and size 1 and nothing here runs.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from engine.errors import EngineError, InvalidParameterError

# A collective waiting longer than this for a peer fails (gloo honours it; NCCL reports it).
COLLECTIVE_TIMEOUT_S = 120.0

_rank, _size = 0, 1


class RankLostError(EngineError):
    """A tensor-parallel rank died or stopped answering: the engine cannot run another step."""


def rank() -> int:
    return _rank


def size() -> int:
    return _size


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init(rank_: int, size_: int, port: int, device: torch.device,
         timeout_s: float = COLLECTIVE_TIMEOUT_S) -> None:
    """Join the group of ``size_`` ranks meeting on 127.0.0.1:``port``."""
    global _rank, _size
    if dist.is_initialized():
        raise RuntimeError("this process already runs a tensor-parallel engine; shut it down "
                           "(ModelRunner.shutdown) before starting another")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend_for(device), init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank_, world_size=size_, timeout=timedelta(seconds=timeout_s))
    _rank, _size = rank_, size_


def destroy() -> None:
    global _rank, _size
    if dist.is_initialized():
        dist.destroy_process_group()
    _rank, _size = 0, 1


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the ranks, in place; returns it."""
    dist.all_reduce(x)
    return x


def all_reduce_min(value: int, device: torch.device) -> int:
    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def gather_vocab(logits: torch.Tensor) -> torch.Tensor | None:
    """logits [S, V / size] of this rank's vocabulary slice -> [S, V] on rank 0, None elsewhere."""
    logits = logits.contiguous()
    if _rank != 0:
        dist.gather(logits, None, dst=0)
        return None
    parts = [torch.empty_like(logits) for _ in range(_size)]
    dist.gather(logits, parts, dst=0)
    return torch.cat(parts, dim=1)


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
