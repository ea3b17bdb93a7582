"""Quantized layers loaded through the model loader: shards, GGUF blocks, the engine's defaults."""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.errors import InvalidParameterError
from engine.kernels.cpu import qmatmul
from engine.layers.linear import Int4Linear, Int8Linear, LMHead, QKVLinear
from engine.models.llama import LlamaForCausalLM
from engine.models.loader import iter_weights, load_model_config, plan_layouts
from engine.quantization.int4 import Int4Weight, Int4WeightOnlyLinear, quantize_int4
from engine.quantization.int8 import Int8Weight, Int8WeightOnlyLinear, quantize_int8


def _qkv():
    layer = QKVLinear(hidden_size=64, head_dim=16, num_heads=4, num_kv_heads=2)  # N = 64 + 32 + 32
    torch.manual_seed(0)
    shards = {"q": torch.randn(64, 64), "k": torch.randn(32, 64), "v": torch.randn(32, 64)}
    return layer, shards, torch.cat([shards["q"], shards["k"], shards["v"]])


@pytest.mark.parametrize("as_int4_weight", [True, False])
def test_int4_shards_concatenate_along_n_like_the_fused_matrix(as_int4_weight):
    layer, shards, fused = _qkv()
    int4 = Int4Linear(layer, 32)
    for shard_id, weight in shards.items():
        loaded = Int4Weight(*quantize_int4(weight, 32), 32) if as_int4_weight else weight
        assert not hasattr(int4, "weight_packed")  # packed only once every shard is in
        int4.weight_loader(int4.weight, loaded, shard_id)
    reference = Int4WeightOnlyLinear.from_float(fused, 32)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert torch.equal(int4(x), reference(x))
    assert "weight" not in dict(int4.named_parameters())  # the staging codes are gone


def test_int8_shards_concatenate_along_n_like_the_fused_matrix():
    layer, shards, fused = _qkv()
    int8 = Int8Linear(layer, torch.bfloat16)
    for shard_id, weight in shards.items():
        int8.weight_loader(int8.weight, Int8Weight(*quantize_int8(weight)), shard_id)
    reference = Int8WeightOnlyLinear.from_float(fused, dtype=torch.bfloat16)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert torch.equal(int8(x), reference(x))


@pytest.mark.skipif(qmatmul.library() is not None, reason="the native int8 kernel takes every step here")
def test_lm_head_takes_int8_for_small_steps_and_the_weight_for_large_ones():
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(256, 64).bfloat16(), requires_grad=False)
    head = LMHead(64, 256, tied=weight)
    head.prepare(int8_small_rows=True)
    small, large = torch.randn(2, 64).bfloat16(), torch.randn(32, 64).bfloat16()
    assert torch.equal(head(large), torch.nn.functional.linear(large, weight).float())
    assert torch.equal(head(small), head.small_rows(small).float())
    assert head(small).dtype == torch.float32


@pytest.mark.slow
def test_auto_keeps_smollm2_q4_1_projections_in_int4_groups_of_32(smollm2_path):
    config = load_model_config(smollm2_path)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    native = iter_weights(smollm2_path, config).native_layouts()
    assert native["model.embed_tokens.weight"] == ("int8", None)  # Q8_0
    plan = plan_layouts(model, native, "auto", 64)
    assert len(plan) == 4 * config.num_hidden_layers
    assert set(plan.values()) == {("int4", 32)}
    assert plan_layouts(model, native, None, 32) == plan_layouts(model, native, "none", 32) == {}
    assert set(plan_layouts(model, native, "int8", 32).values()) == {("int8", None)}


@pytest.mark.slow
def test_gguf_q4_blocks_arrive_as_codes_in_hf_row_order(smollm2_path):
    config = load_model_config(smollm2_path)
    source = iter_weights(smollm2_path, config)
    names = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
             "model.layers.0.mlp.down_proj.weight"}
    floats = {n: t for n, t in source if n in names}
    quantized = {n: t for n, t in source.iterate(frozenset(names)) if n in names}
    for name in names:
        assert isinstance(quantized[name], Int4Weight), name
        # only d and m + 8d rounded to bf16 separate the two: the rows are in the same order
        error = (quantized[name].dequantize() - floats[name]).abs().max()
        assert error < 0.02 * floats[name].abs().max(), name


def test_quantization_setting_takes_none_auto_int8_int4_only():
    for value in (None, "none", "auto", "int8", "int4"):
        EngineConfig(model="x", quantization=value)
    with pytest.raises(InvalidParameterError, match="quantization"):
        EngineConfig(model="x", quantization="int3")
    with pytest.raises(InvalidParameterError, match="quantization_group_size"):
        EngineConfig(model="x", quantization_group_size=48)


@pytest.mark.slow
def test_explicit_int4_of_a_float_checkpoint_generates_close_to_float(tiny_llama_dir):
    prompt = list(range(100, 120))
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=5)
    exact = LLM(str(tiny_llama_dir), dtype="float32", quantization=None, num_kv_blocks=16)
    int4 = LLM(str(tiny_llama_dir), dtype="float32", quantization="int4",
               quantization_group_size=64, num_kv_blocks=16)
    layers = int4.engine.runner.model.model.layers
    assert isinstance(layers[0].self_attn.qkv_proj, Int4Linear)
    assert isinstance(layers[0].mlp.down_proj, Int4Linear) and layers[0].mlp.down_proj.group_size == 64
    assert not any(isinstance(m, (Int4Linear, Int8Linear)) for m in exact.engine.runner.model.modules())
    a, b = exact.generate([prompt], params)[0], int4.generate([prompt], params)[0]
    # random weights have no margin between tokens; the first step's top-5 still agree mostly
    assert len(set(t for t, _ in a.logprobs[0].top) & set(t for t, _ in b.logprobs[0].top)) >= 3
