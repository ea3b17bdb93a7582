"""The CPU kernels' weights moved into one arena of 2 MiB pages.

A decode step of one sequence streams every projection's weights once: ~92 MiB for SmolLM2, in
tensors of 0.1-30 MiB that the loader allocated on 4 KiB pages. That is ~23,000 pages a step, far
beyond the TLB's reach, and each thread's share of a product is a few short streams that start
cold on every page. Copied into one anonymous mapping advised MADV_HUGEPAGE (transparent huge
pages, in Linux's "always" or "madvise" mode), the same bytes lie on ~46 pages, in the order the
step reads them. Measured on SmolLM2 (AMD EPYC, AVX-512 + VNNI, 2 CPUs; bench/weight_pages.py,
alternated step by step in one process, 6 runs): one sequence's step 0.81-0.93x the time, the
fused layers 0.80-0.96x, the LM head 0.68-0.89x; 4 sequences 0.92-0.95x; 32 sequences 0.97-0.98x.
The process's resident memory does not grow: the loader's tensors are freed as they move.

What moves is what the holders name: any module with ``kernel_weights()`` (the tensors its native
kernel streams each call) and ``move_kernel_weights(place)`` (take ``place(t)``'s copy of each in
their stead): the int4 and int8 projections and the LM head's int8 table
(engine/quantization/, engine/layers/linear.py). They are the same values, so nothing computed
changes. Where the kernel says no to huge pages (THP "never", no MADV_HUGEPAGE, not Linux) the
copies stay on small pages; the arena's ``huge_bytes`` says what it got. ``PAGODA_WEIGHT_ARENA=0``
leaves the weights where the loader put them.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Iterable

import torch

from engine.kernels.cpu import build

logger = logging.getLogger(__name__)

ENV = "PAGODA_WEIGHT_ARENA"
HUGE_PAGE = 2 << 20
SLOT_ALIGN = 4096  # each tensor starts on a page: any dtype's view lines up, and a cache line


def _slot(nbytes: int) -> int:
    return (nbytes + SLOT_ALIGN - 1) // SLOT_ALIGN * SLOT_ALIGN


class WeightArena:
    """One private anonymous mapping of ``nbytes`` (and a huge page's slack to align its start),
    advised MADV_HUGEPAGE before anything touches it; ``place`` copies tensors in, one after the
    other."""

    def __init__(self, nbytes: int):
        self._map = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        advice = getattr(mmap, "MADV_HUGEPAGE", None)
        if advice is not None:
            try:
                self._map.madvise(advice)
            except OSError as exc:  # a kernel built without transparent huge pages
                logger.info("weight arena: no huge pages (%s)", exc)
        self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)  # keeps the mapping alive
        self.start = (-self._bytes.data_ptr()) % HUGE_PAGE
        self._next = self.start
        self.nbytes = nbytes

    def place(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of ``tensor`` (contiguous, CPU) in the arena's next slot."""
        if not tensor.is_contiguous() or tensor.device.type != "cpu":
            raise ValueError("the arena takes contiguous CPU tensors")
        end = self._next + tensor.nbytes
        if end > self.start + self.nbytes:
            raise ValueError(f"the arena's {self.nbytes} bytes are full")
        out = self._bytes[self._next:end].view(tensor.dtype).view(tensor.shape)
        out.copy_(tensor)
        self._next += _slot(tensor.nbytes)
        return out

    @property
    def address(self) -> int:
        return self._bytes.data_ptr()

    def huge_bytes(self) -> int:
        """Bytes of the arena on huge pages now (its mapping's AnonHugePages in /proc/self/smaps;
        0 where that cannot be read)."""
        try:
            lines = open("/proc/self/smaps").read().splitlines()
        except OSError:
            return 0
        inside = False
        for line in lines:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:  # a mapping's first line: start-end perms ...
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start <= self.address < end
            elif inside and line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
        return 0


def holders(model: torch.nn.Module) -> Iterable[torch.nn.Module]:
    """The modules whose kernel weights move (``kernel_weights`` and ``move_kernel_weights``)."""
    return [m for m in model.modules() if callable(getattr(m, "move_kernel_weights", None))]


def move_kernel_weights(model: torch.nn.Module) -> WeightArena | None:
    """Moves every native kernel's weights of ``model`` (CPU) into one huge-page arena, in the
    modules' order (a layer's projections as a step reads them); None where there are none."""
    if not build.env_switch(ENV):
        logger.info("kernel weights left where the loader put them (%s=0)", ENV)
        return None
    movers = holders(model)
    total = sum(_slot(t.nbytes) for h in movers for t in h.kernel_weights())
    if total == 0:
        return None
    arena = WeightArena(total)
    for holder in movers:
        holder.move_kernel_weights(arena.place)
    logger.info("kernel weights: %.1f MiB in one arena, %.1f MiB of it on 2 MiB pages",
                total / 2**20, arena.huge_bytes() / 2**20)
    return arena
