"""Per step shape: quantized projections multiply a dense bf16 copy of their weight at many rows
(quantization_dense_rows), the weight-only kernel at few; both stand for the same weight."""

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.config import DEFAULT_QUANTIZATION_DENSE_ROWS, DENSE_ROWS_CROSSOVER, EngineConfig
from engine.errors import InvalidParameterError
from engine.memory.gpu_memory import weights_bytes
from engine.layers.linear import Int4Linear, Int8Linear
from engine.quantization.int4 import Int4WeightOnlyLinear, dequantize_int4, quantize_int4
from engine.quantization.int8 import Int8WeightOnlyLinear

THRESHOLD = 8


def _int4(dense_rows):
    torch.manual_seed(0)
    weight = torch.randn(96, 128) * 0.05
    return Int4WeightOnlyLinear.from_float(weight, 32) if dense_rows is None else \
        Int4WeightOnlyLinear(*quantize_int4(weight, 32), 32, dense_rows=dense_rows)


@pytest.mark.parametrize("rows", [1, THRESHOLD - 1, THRESHOLD, 33])
def test_int4_dense_copy_is_taken_at_the_threshold_and_agrees_with_the_kernel(rows):
    kernel, chosen = _int4(None), _int4(THRESHOLD)
    x = torch.randn(rows, 128).bfloat16()
    assert kernel.weight_dense is None and chosen.weight_dense.dtype == torch.bfloat16
    codes, scales, zeros = quantize_int4(torch.randn(96, 128) * 0.05, 32)
    # the copy is the dequantized codes, rounded once to bf16
    layer = Int4WeightOnlyLinear(codes, scales, zeros, 32, dense_rows=1)
    assert torch.equal(layer.weight_dense, dequantize_int4(codes, scales, zeros, 32).bfloat16())
    if rows < THRESHOLD:
        assert torch.equal(chosen(x), kernel(x))
    else:
        assert torch.equal(chosen(x), F.linear(x, chosen.weight_dense))
        torch.testing.assert_close(chosen(x), kernel(x), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("rows", [2, 16])
def test_int8_dense_copy_only_for_bf16_and_agrees_with_the_kernel(rows):
    torch.manual_seed(0)
    weight = torch.randn(96, 128) * 0.05
    kernel = Int8WeightOnlyLinear.from_float(weight, dtype=torch.bfloat16)
    chosen = Int8WeightOnlyLinear.from_float(weight, dtype=torch.bfloat16)
    chosen.set_weight(chosen.weight_int8, chosen.scales, torch.bfloat16, dense_rows=THRESHOLD)
    x = torch.randn(rows, 128).bfloat16()
    if rows < THRESHOLD:
        assert torch.equal(chosen(x), kernel(x))
    else:
        assert torch.equal(chosen(x), F.linear(x, chosen.weight_dense))
        torch.testing.assert_close(chosen(x), kernel(x), rtol=2e-2, atol=2e-2)
    fp32 = Int8WeightOnlyLinear(kernel.weight_int8, kernel.scales.float(), dtype=torch.float32,
                                dense_rows=THRESHOLD)
    assert fp32.weight_dense is None and fp32.dense_rows is None  # fp32 activations: unchanged


def test_dense_rows_setting_range_and_default():
    assert EngineConfig(model="x").quantization_dense_rows is DEFAULT_QUANTIZATION_DENSE_ROWS is None
    assert EngineConfig(model="x", quantization_dense_rows=DENSE_ROWS_CROSSOVER).quantization_dense_rows == 17
    for value in (None, 0, 1, 64, 1 << 20):
        EngineConfig(model="x", quantization_dense_rows=value)
    for value in (-1, (1 << 20) + 1, 1.5, True, "17"):
        with pytest.raises(InvalidParameterError, match="quantization_dense_rows"):
            EngineConfig(model="x", quantization_dense_rows=value)


def _engine(directory, monkeypatch, layout, dense_rows, dtype="bfloat16"):
    monkeypatch.setattr("engine.runtime.model_runner.cpu_info.has_fast_bf16", lambda: True)
    # batch_invariant off: the prompt rows take the torch path's projections, whose threshold
    # this is about (invariant, they would run the fused step in the engine without dense copies)
    return LLM(str(directory), dtype=dtype, quantization=layout, quantization_group_size=32,
               quantization_dense_rows=dense_rows, num_kv_blocks=32, enable_prefix_caching=False,
               batch_invariant=False)


def _quantized(llm):
    return [m for m in llm.engine.runner.model.modules() if isinstance(m, (Int4Linear, Int8Linear))]


def _logits_and_rows(llm, prompt):
    """The LM head's logits of a prefill of ``prompt`` and the rows each projection saw."""
    logits, rows = [], set()
    model = llm.engine.runner.model
    hooks = [model.lm_head.register_forward_hook(lambda m, i, out: logits.append(out.clone()))]
    hooks += [m.register_forward_pre_hook(lambda m, args: rows.add(args[0].reshape(
        -1, m.in_features).shape[0])) for m in _quantized(llm)]
    try:
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
    finally:
        for hook in hooks:
            hook.remove()
    return logits[0], rows


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["int4", "int8"])
def test_engine_logits_below_and_above_the_threshold_match_the_kernel_path(
        tiny_llama_dir, monkeypatch, layout):
    kernel = _engine(tiny_llama_dir, monkeypatch, layout, None)
    chosen = _engine(tiny_llama_dir, monkeypatch, layout, THRESHOLD)
    assert all(m.weight_dense is None for m in _quantized(kernel))
    assert all(m.weight_dense is not None and m.dense_rows == THRESHOLD for m in _quantized(chosen))
    short, long = list(range(100, 103)), list(range(200, 200 + 3 * THRESHOLD))
    a, rows = _logits_and_rows(kernel, short)
    b, _ = _logits_and_rows(chosen, short)
    assert max(rows) < THRESHOLD and torch.equal(a, b)  # below: the kernel, bit for bit
    a, rows = _logits_and_rows(kernel, long)
    b, _ = _logits_and_rows(chosen, long)
    assert min(rows) >= THRESHOLD
    assert not torch.equal(a, b)  # the dense copy did run
    torch.testing.assert_close(b, a, rtol=0, atol=0.03 * a.abs().max().item())


@pytest.mark.slow
def test_dense_copy_memory_is_counted_and_absent_when_off(tiny_llama_dir, monkeypatch):
    on = _engine(tiny_llama_dir, monkeypatch, "int4", THRESHOLD)
    off = _engine(tiny_llama_dir, monkeypatch, "int4", 0)
    weights = sum(m.out_features * m.in_features for m in _quantized(on))
    assert weights_bytes(on.engine.runner.model)["dense bf16 copies"] == 2 * weights
    assert "dense bf16 copies" not in weights_bytes(off.engine.runner.model)
    assert all(m.weight_dense is None for m in _quantized(off))
    assert all(b.dtype != torch.bfloat16 or b.dim() != 2 for m in _quantized(off)
               for b in m.buffers())  # no bf16 matrix anywhere in the quantized layers
    # fp32 activations, or a CPU without fast bf16: the setting keeps nothing
    fp32 = _engine(tiny_llama_dir, monkeypatch, "int4", THRESHOLD, dtype="float32")
    assert all(m.weight_dense is None for m in _quantized(fp32))
    monkeypatch.setattr("engine.runtime.model_runner.cpu_info.has_fast_bf16", lambda: False)
    slow = LLM(str(tiny_llama_dir), dtype="bfloat16", quantization="int4",
               quantization_group_size=32, quantization_dense_rows=THRESHOLD, num_kv_blocks=32)
    assert all(m.weight_dense is None for m in _quantized(slow))
