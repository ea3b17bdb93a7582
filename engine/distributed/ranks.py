"""Rank 0's handle on ranks 1..N-1 (the loop each of them runs is engine/runtime/rank_main.py).

Rank 0 starts one process per other rank (a subprocess), each joining the group on a free
loopback port. Every step rank 0 sends each rank the scheduled entries as
plain tuples over a pipe (a pipe, not a collective, so an idle engine has no collective
waiting to time out), then runs the step itself; the ranks build the same batch and run the
same forward, meeting rank 0 in its all-reduces and the logits gather. A rank that exits makes
the next step (or the collective it fails) raise RankLostError on rank 0; a rank 0 that exits
closes the pipes, and the ranks end.
"""

from __future__ import annotations

import logging
import os
import pickle
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from engine.distributed import parallel_state
from engine.distributed.parallel_state import RankLostError
from engine.scheduling.scheduler import ScheduledSequence

logger = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 5.0  # a rank told to stop gets this long before it is terminated


class _Window:
    """Token ids ``start:start + len(ids)`` of a sequence, sliced like the whole list."""

    def __init__(self, start: int, ids: list[int]):
        self.start, self.ids = start, ids

    def __getitem__(self, s: slice) -> list[int]:
        return self.ids[s.start - self.start:s.stop - self.start]


@dataclass
class _StepSeq:
    """What build_input_batch reads of a Sequence."""

    token_ids: _Window
    block_table: list[int]
    num_tokens: int


def pack_step(entries: list[ScheduledSequence]) -> list[tuple]:
    return [(e.seq.token_ids[e.start:e.start + e.num_new_tokens], e.start, e.num_new_tokens,
             e.seq.block_table, e.seq.num_tokens) for e in entries]


def unpack_step(packed: list[tuple]) -> list[ScheduledSequence]:
    return [ScheduledSequence(_StepSeq(_Window(start, ids), table, num_tokens), n, start)
            for ids, start, n, table, num_tokens in packed]


class RankGroup:
    """Ranks 1..N-1 of a tensor-parallel engine whose rank 0 is this process.

    Each rank is a ``python -m engine.runtime.rank_main`` subprocess (no re-import of the
    caller's main module, as multiprocessing's spawn would do); it reads its start-up arguments
    from stdin, then connects back to a loopback control socket, which becomes its step pipe.
    """

    def __init__(self, config, model_config, max_model_len: int, eos_token_ids: list[int], device):
        size = config.tensor_parallel_size
        port = parallel_state.free_port()
        token = secrets.token_bytes(16)
        self.processes: list[subprocess.Popen] = []
        self.pipes: list[Connection] = []
        self.lost: str | None = None
        self.group: parallel_state.TensorParallelGroup | None = None
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the directory holding engine/
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(size)
            server.settimeout(0.5)
            for r in range(1, size):
                process = subprocess.Popen([sys.executable, "-m", "engine.runtime.rank_main"],
                                           stdin=subprocess.PIPE, env=env)
                process.stdin.write(pickle.dumps((r, port, server.getsockname()[1], token, config,
                                                  model_config, max_model_len, eos_token_ids)))
                process.stdin.close()
                self.processes.append(process)
            try:
                self.pipes = self._accept(server, token, size - 1)
                self.group = parallel_state.TensorParallelGroup(0, size, port, device)
            except Exception as exc:
                self.close()
                raise RankLostError(f"the tensor-parallel ranks did not start: {exc}; "
                                    f"{self._exits() or 'all still running'}") from exc

    def _accept(self, server: socket.socket, token: bytes, count: int) -> list[Connection]:
        """Each rank's control connection, by rank; fails as soon as a rank exits."""
        pipes: dict[int, Connection] = {}
        deadline = time.monotonic() + parallel_state.COLLECTIVE_TIMEOUT_S
        while len(pipes) < count:
            if exits := self._exits():
                raise RuntimeError(exits)
            if time.monotonic() > deadline:
                raise TimeoutError("ranks did not connect")
            try:
                sock, _ = server.accept()
            except TimeoutError:
                continue
            sock.settimeout(None)
            pipe = Connection(sock.detach())
            hello = pipe.recv()
            if hello[0] == token:
                pipes[hello[1]] = pipe
            else:
                pipe.close()
        return [pipes[r] for r in sorted(pipes)]

    def _exits(self) -> str:
        return ", ".join(f"rank {r} exited with code {p.returncode}"
                         for r, p in enumerate(self.processes, 1) if p.poll() is not None)

    def send_step(self, entries: list[ScheduledSequence]) -> None:
        if self.lost is None and (exits := self._exits()):
            self._lose(exits)
        if self.lost is not None:
            raise RankLostError(self.lost)
        packed = pack_step(entries)
        try:
            for pipe in self.pipes:
                pipe.send(packed)
        except OSError as exc:  # a broken pipe: that rank is gone
            self._lose(self._exits() or f"a rank's pipe broke: {exc}")
            raise RankLostError(self.lost) from exc

    def fail(self, exc: BaseException) -> None:
        """Rank 0's forward raised ``exc``: the other ranks may be inside a collective rank 0
        left, so no later collective would match theirs. Stop them; raise RankLostError."""
        if isinstance(exc, RuntimeError):  # a peer's death may reach us before its exit status
            deadline = time.monotonic() + 1.0
            while not self._exits() and time.monotonic() < deadline:
                time.sleep(0.05)
        self._lose(self._exits() or f"rank 0's step failed: {type(exc).__name__}: {exc}")
        raise RankLostError(self.lost) from exc

    def _lose(self, why: str) -> None:
        self.lost = f"a tensor-parallel rank was lost ({why}); this engine cannot run steps any more"
        logger.error("%s", self.lost)
        self.close()

    def close(self) -> None:
        """Stop the ranks (politely, then by force) and leave the group."""
        for pipe in self.pipes:
            try:
                pipe.send(None)
                pipe.close()
            except OSError:
                pass
        for p in self.processes:
            try:
                p.wait(JOIN_TIMEOUT_S if self.lost is None else 0.1)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(JOIN_TIMEOUT_S)
        self.pipes = []
        if self.group is not None:
            self.group.close()


def join(config, model_config, max_model_len: int, eos_token_ids: list[int], device, rank: int,
         port: int | None):
    """Enter the tensor-parallel group as ``rank``: (this rank's device, the RankGroup on rank 0
    or None, the TensorParallelGroup). Rank 0 checks the model splits evenly and starts the
    other ranks first."""
    import torch

    size = config.tensor_parallel_size
    parallel_state.check_divisible(model_config, size, device)
    device = parallel_state.rank_device(device, rank)
    if device.type == "cpu":  # the ranks share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    if rank == 0:
        ranks = RankGroup(config, model_config, max_model_len, eos_token_ids, device)
        return device, ranks, ranks.group
    return device, None, parallel_state.TensorParallelGroup(rank, size, port, device)
