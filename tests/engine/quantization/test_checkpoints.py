"""Quantized safetensors checkpoints: `python -m engine convert` output, GPTQ and AWQ 4-bit,
each built here in its own layout from the tiny Llama and loaded straight into int4 layers."""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import engine.layers.linear as linear
from engine import LLM, SamplingParams
from engine.cli.main import main as cli_main
from engine.layers.linear import Int4Linear, Int8Linear
from engine.models.hf_loader import SafetensorsWeights, load_hf_config
from engine.quantization.int4 import Int4Weight

PROMPT = list(range(200, 216))
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def projections(model):
    return [m for m in model.modules() if isinstance(m, (Int4Linear, Int8Linear))]


@pytest.mark.slow
@pytest.mark.parametrize("quantization", ["int4", "int8"])
def test_converted_checkpoint_loads_without_quantizing_again(tiny_llama_dir, tmp_path, monkeypatch,
                                                              quantization):
    dst = tmp_path / "q"
    assert cli_main(["convert", str(tiny_llama_dir), str(dst), "--quantization", quantization,
                     "--group-size", "64"]) == 0
    config = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "pagoda" and config["bits"] == (4 if quantization == "int4" else 8)
    with safe_open(dst / "model.safetensors", framework="pt") as f:
        qweight = f.get_tensor("model.layers.0.mlp.down_proj.qweight")
        assert "model.layers.0.mlp.down_proj.weight" not in f.keys()
    assert (qweight.dtype, tuple(qweight.shape)) == (
        (torch.uint8, (64, 64)) if quantization == "int4" else (torch.int8, (64, 128)))
    assert (dst / "tokenizer.json").is_file()

    at_load = LLM(str(tiny_llama_dir), dtype="float32", quantization=quantization,
                  quantization_group_size=64, num_kv_blocks=16)
    expected = at_load.generate([PROMPT], GREEDY)[0].token_ids
    monkeypatch.setattr(linear, "quantize_int4", None)  # loading must not quantize
    monkeypatch.setattr(linear, "quantize_int8", None)
    converted = LLM(str(dst), dtype="float32", num_kv_blocks=16)  # quantization auto
    assert len(projections(converted.engine.runner.model)) == 8
    assert converted.generate([PROMPT], GREEDY)[0].token_ids == expected


def _asymmetric(weight: torch.Tensor, group: int):
    """weight [N, K] -> integer codes [N, K], zero points and fp16 scales [N, K / group], the
    min/max quantization GPTQ and AWQ both store (w = (q - z) * s)."""
    n, k = weight.shape
    g = weight.reshape(n, k // group, group)
    lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
    scales = ((hi - lo) / 15).clamp(min=1e-5).half()
    zeros = torch.round(-lo / scales.float()).clamp(0, 15)
    q = torch.round(g / scales.float()[..., None] + zeros[..., None]).clamp(0, 15)
    return q.reshape(n, k).int(), zeros.int(), scales


def _pack_sequential(values: np.ndarray) -> np.ndarray:
    """AutoGPTQ's packing of uint values [R, C] along the last axis: value j of 8 in bits 4j."""
    out = np.zeros((values.shape[0], values.shape[1] // 8), dtype=np.uint32)
    for j in range(8):
        out |= values[:, j::8].astype(np.uint32) << (4 * j)
    return out.view(np.int32)


def _pack_awq(values: np.ndarray) -> np.ndarray:
    """AutoAWQ's WQLinear_GEMM packing along the last axis: nibble i holds column order_map[i]."""
    order_map = [0, 2, 4, 6, 1, 3, 5, 7]
    out = np.zeros((values.shape[0], values.shape[1] // 8), dtype=np.uint32)
    for i in range(8):
        out |= values[:, order_map[i]::8].astype(np.uint32) << (4 * i)
    return out.view(np.int32)


def write_quantized(src, dst, method: str, group: int) -> dict[str, torch.Tensor]:
    """A GPTQ (v1) or AWQ copy of the checkpoint at ``src``; returns the float weights its
    projections stand for, by HF weight name."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    expected = {}
    for name in [n for n in tensors if n.endswith("_proj.weight")]:
        prefix = name.removesuffix(".weight")
        q, zeros, scales = _asymmetric(tensors.pop(name), group)
        expected[name] = ((q.float().reshape(*zeros.shape, group) - zeros[..., None])
                          * scales.float()[..., None]).reshape(q.shape)
        if method == "gptq":  # qweight [K / 8, N] along K; zeros stored minus one
            tensors[f"{prefix}.qweight"] = torch.from_numpy(_pack_sequential(q.t().numpy().T).T.copy())
            tensors[f"{prefix}.qzeros"] = torch.from_numpy(_pack_sequential((zeros - 1).t().numpy()))
            tensors[f"{prefix}.g_idx"] = torch.arange(q.shape[1], dtype=torch.int32) // group
        else:  # qweight [K, N / 8] and qzeros [K / G, N / 8] along N, interleaved
            tensors[f"{prefix}.qweight"] = torch.from_numpy(_pack_awq(q.t().contiguous().numpy()))
            tensors[f"{prefix}.qzeros"] = torch.from_numpy(_pack_awq(zeros.t().contiguous().numpy()))
        tensors[f"{prefix}.scales"] = scales.t().contiguous()  # [K / G, N] fp16
    save_file(tensors, dst / "model.safetensors")
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = (
        {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False, "sym": False}
        if method == "gptq" else
        {"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm", "zero_point": True})
    (dst / "config.json").write_text(json.dumps(config))
    return expected


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_gptq_and_awq_4bit_checkpoints_load_into_int4_codes(tiny_llama_dir, tmp_path, method):
    dst = tmp_path / method
    expected = write_quantized(tiny_llama_dir, dst, method, group=32)
    source = SafetensorsWeights(dst, load_hf_config(dst))
    assert source.native_layouts() == {name: ("int4", 32) for name in expected}
    seen = dict(source)
    for name, weight in expected.items():
        assert isinstance(seen[name], Int4Weight), name
        # exact codes; only the bf16 rounding of s and (8 - z) s separates the two
        torch.testing.assert_close(seen[name].dequantize(), weight, atol=0.01 * weight.abs().max().item(),
                                   rtol=0.0)

    llm = LLM(str(dst), dtype="float32", num_kv_blocks=16)
    assert len(projections(llm.engine.runner.model)) == 8
    as_float = LLM(str(dst), dtype="float32", quantization=None, num_kv_blocks=16)
    assert not projections(as_float.engine.runner.model)
    a = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1, logprobs=5))[0]
    b = as_float.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1, logprobs=5))[0]
    assert len({t for t, _ in a.logprobs[0].top} & {t for t, _ in b.logprobs[0].top}) >= 4
