"""Run the Triton kernels under the interpreter when there is no GPU, and build paged caches.

@triton.jit picks the interpreter when the decorator runs, so TRITON_INTERPRET must be set
before any kernel module is imported. pytest imports this conftest before the test modules of
this directory, and the engine's CPU path never imports engine.kernels; kernel modules that
something else imported earlier are re-executed so their kernels are built again interpreted.
"""

import importlib
import os
import sys

import pytest
import torch

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    os.environ["TRITON_INTERPRET"] = "1"
    # engine.kernels.cpu has no Triton, and re-executing it would make new ctypes struct classes
    # that the library's declared signatures no longer accept
    for _name in sorted(n for n in sys.modules
                        if n.startswith("engine.kernels.") and not n.startswith("engine.kernels.cpu")):
        importlib.reload(sys.modules[_name])


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build_paged_kv(keys, values, block_size, device, num_spare_blocks=3, seed=0):
    """Scatter per-sequence contiguous K/V into a paged cache, token by token.

    keys, values: lists of [context_len, num_kv_heads, head_dim] tensors (one per sequence).
    Block ids are a random permutation, so every table is non-contiguous and shuffled; unused
    cache rows hold random values and unused table entries are 0 (a block some sequence owns),
    so reading past a context or through a wrong table entry changes the result.
    Returns k_cache, v_cache [num_blocks, block_size, kv_heads, head_dim] and int32 tables.
    """
    gen = torch.Generator().manual_seed(seed)
    num_kv_heads, head_dim = keys[0].shape[1:]
    blocks_per_seq = [-(-k.shape[0] // block_size) for k in keys]
    max_blocks = max(max(blocks_per_seq), 1) + 1  # one extra column of unused entries
    num_blocks = sum(blocks_per_seq) + num_spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(keys[0].dtype)
    v_cache = torch.randn(shape, generator=gen).to(keys[0].dtype)
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    block_tables = torch.zeros((len(keys), max_blocks), dtype=torch.int32)
    for n, (k, v) in enumerate(zip(keys, values)):
        for j in range(blocks_per_seq[n]):
            block_tables[n, j] = ids.pop()
        for pos in range(k.shape[0]):
            block = int(block_tables[n, pos // block_size])
            k_cache[block, pos % block_size] = k[pos]
            v_cache[block, pos % block_size] = v[pos]
    return k_cache.to(device), v_cache.to(device), block_tables.to(device)


@pytest.fixture
def paged_kv():
    return build_paged_kv


# Under the interpreter a float32 -> bfloat16 cast truncates (compiled kernels round to
# nearest), so bfloat16 results may sit a couple of units in the last place from the reference.
TOLERANCES = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}


@pytest.fixture
def assert_close():
    def check(actual: torch.Tensor, expected: torch.Tensor) -> None:
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        tol = TOLERANCES[expected.dtype]
        torch.testing.assert_close(actual.cpu().float(), expected.cpu().float(), atol=tol, rtol=tol)

    return check
