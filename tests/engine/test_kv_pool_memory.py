"""The CPU KV pool's resident memory follows the blocks written, not the pool's size."""

import sys

import pytest
import torch

from engine.memory.gpu_memory import lazy_zeros
from engine.layers.attention import kv_cache_shape

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")


def _resident_kib(tensor: torch.Tensor) -> int:
    """Rss of the mappings that overlap ``tensor``'s bytes (madvise may split one mapping)."""
    first = tensor.data_ptr()
    last = first + tensor.numel() * tensor.element_size()
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start < last and first < end
            elif inside and head == "Rss:":
                total += int(line.split()[1])
    return total


@pytest.mark.slow
def test_kv_pool_starts_zeroed_and_only_written_blocks_become_resident():
    # SmolLM2-135M's pool at llama.cpp's capacity: 2 x 30 layers x 1,024 blocks of 16 tokens.
    layers, shape = 30, kv_cache_shape(1024, 16, 3, 64)
    pool = lazy_zeros((2, layers, *shape), torch.bfloat16, torch.device("cpu"))  # 360 MiB
    assert pool.shape == (2, layers, *shape) and pool.dtype == torch.bfloat16
    assert _resident_kib(pool) < 1024
    for kv in range(2):
        for layer in range(layers):
            pool[kv, layer, :2] = 1.0  # the first two blocks of every layer's K and V: 12 KiB each
    written = 2 * layers * 2 * 16 * 3 * 64 * 2 // 1024  # 720 KiB
    # 4 KiB pages: at most one more page at each end of each run (2 MiB huge pages made 120+ MiB).
    assert _resident_kib(pool) <= written + 2 * layers * 2 * 4 + 64
    assert pool[:, :, :2].eq(1).all() and not pool[:, :, 2:].any()


def _mapping_of(tensor: torch.Tensor) -> tuple[int, int] | None:
    """The (start, end) of the mapping in /proc/self/maps that holds ``tensor``'s first byte."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            start, end = (int(x, 16) for x in line.split(maxsplit=1)[0].split("-"))
            if start <= address < end:
                return start, end
    return None


def _mappings() -> set[tuple[int, int]]:
    with open("/proc/self/maps") as maps:
        return {tuple(int(x, 16) for x in line.split(maxsplit=1)[0].split("-")) for line in maps}


def test_kv_pool_memory_is_returned_when_the_pool_is_freed():
    # The pool's pages go back to the kernel when its mapping is unmapped: the mapping itself is
    # checked, not the process's anonymous total, which other threads (torch's, the test
    # runner's) move by megabytes meanwhile (57.7 of 64 MiB "came back" on an AVX-512 EPYC).
    pool = lazy_zeros((64, 1024, 1024), torch.uint8, torch.device("cpu"))  # 64 MiB
    pool.fill_(7)
    assert _resident_kib(pool) >= 64 * 1024
    mapping = _mapping_of(pool)
    assert mapping is not None and mapping[1] - mapping[0] >= 64 * 1024 * 1024
    del pool
    assert mapping not in _mappings()
