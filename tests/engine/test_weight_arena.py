"""The native kernels' weights in one huge-page arena (engine/memory/weight_arena.py): an engine
on the CPU moves every int4/int8 projection's and the LM head's kernel tensors there, in the
order a step reads them, the pages are huge where the kernel grants them, and the products give
the same bits from the arena as from the tensors the loader made."""

import mmap
import pathlib

import pytest
import torch

from engine import LLM
from engine.kernels.cpu import qmatmul
from engine.memory.weight_arena import HUGE_PAGE, WeightArena, holders, move_kernel_weights
from engine.quantization.int4 import Int4WeightOnlyLinear
from engine.quantization.int8 import Int8WeightOnlyLinear

pytestmark = pytest.mark.skipif(qmatmul.library() is None, reason="the native int4/int8 kernels do not build here")


def _thp_granted() -> bool:
    try:
        mode = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return hasattr(mmap, "MADV_HUGEPAGE") and "[never]" not in mode


def test_an_engine_reads_every_kernel_weight_from_its_arena_in_step_order(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), quantization="int4", num_kv_blocks=32, max_model_len=128)
    runner = llm.engine.runner
    arena = runner.weight_arena
    assert arena is not None
    movers = holders(runner.model)
    assert sum(isinstance(h, Int4WeightOnlyLinear) for h in movers) == 4 * len(runner.model.model.layers)
    assert movers[-1] is runner.model.lm_head
    addresses = [t.data_ptr() for h in movers for t in h.kernel_weights()]
    assert len(addresses) == 4 * 3 * len(runner.model.model.layers) + 2  # (w, d, m) x 4 a layer; the head's
    start = arena.address + arena.start
    assert all(start <= a < start + arena.nbytes for a in addresses)
    assert addresses == sorted(addresses)  # layer by layer, as the step reads them
    assert start % HUGE_PAGE == 0
    for layer in runner.model.model.layers:  # the buffers are the kernel's arguments, not stale copies
        proj = layer.mlp.down_proj
        assert proj.weight_packed.data_ptr() == proj._native_args[0].data_ptr()
    # the fused step reads them there (it took their addresses after the move; the fused tests
    # check what it computes from them against the torch path)
    fused = runner.fused_decode
    assert fused is not None
    for layer in fused.layers:
        for proj in (layer.qkv, layer.o, layer.gate_up, layer.down):
            assert all(start <= p < start + arena.nbytes for p in (proj.w, proj.d, proj.m))


@pytest.mark.skipif(not _thp_granted(), reason="transparent huge pages are off here")
def test_the_arena_lies_on_huge_pages():
    arena = WeightArena(8 * HUGE_PAGE)
    arena.place(torch.ones(8 * HUGE_PAGE // 4))
    assert arena.huge_bytes() >= HUGE_PAGE


@pytest.mark.parametrize("bits", [4, 8])
def test_a_projection_gives_the_same_bits_from_the_arena(bits):
    torch.manual_seed(0)
    weight = torch.randn(96, 128)
    layer = (Int4WeightOnlyLinear.from_float(weight) if bits == 4
             else Int8WeightOnlyLinear(*qmatmul.quantize_int8_blocks(weight), None, torch.float32))
    assert layer.kernel_weights(), "the layer is not on the native kernel"
    x = torch.randn(3, 128)
    before = layer(x)
    model = torch.nn.Sequential(layer)
    arena = move_kernel_weights(model)
    assert arena is not None
    assert all(arena.address <= t.data_ptr() < arena.address + arena.nbytes + HUGE_PAGE
               for t in layer.kernel_weights())
    assert torch.equal(layer(x), before)


def test_the_arena_refuses_what_does_not_fit():
    arena = WeightArena(4096)
    with pytest.raises(ValueError, match="contiguous"):
        arena.place(torch.ones(8, 8).t())
    arena.place(torch.ones(1024))
    with pytest.raises(ValueError, match="full"):
        arena.place(torch.ones(1))


def test_the_switch_leaves_the_weights_where_the_loader_put_them(tiny_llama_dir, monkeypatch):
    monkeypatch.setenv("PAGODA_WEIGHT_ARENA", "0")
    llm = LLM(str(tiny_llama_dir), quantization="int4", num_kv_blocks=32, max_model_len=128)
    assert llm.engine.runner.weight_arena is None
    assert llm.engine.runner.fused_decode is not None
