"""LoRA without a model: the adapter's identity roots the prefix cache's chain, the resident set's
LRU, the batched product over float and quantized projections, and the checks of a PEFT folder."""

import json

import pytest
import torch
from safetensors.torch import save_file

from engine.errors import InvalidParameterError
from engine.layers.linear import Linear, QKVLinear, quantized_like
from engine.lora.layers import LoRALinear, LoRAStep
from engine.lora.peft_adapter import read_adapter
from engine.lora.request import LoRARequest
from engine.lora.slots import AdapterSlots
from engine.models.model_config import ModelConfig
from engine.sampling_params import SamplingParams
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.sequence import Sequence
from engine.tenancy import Tenant

X, Y = LoRARequest("x", "/adapters/x/1"), LoRARequest("y", "/adapters/y/1")


def seq(rid, adapter=None, tokens=tuple(range(13)), **kw):
    return Sequence(rid, list(tokens), SamplingParams(max_tokens=4), adapter=adapter, **kw)


# ------------------------------------------------------------------ the prefix cache's identity
def test_block_hash_chain_is_rooted_in_the_adapter():
    bm = BlockManager(num_blocks=16, block_size=4)
    chains = {name: bm.full_block_hashes(seq(name, a)) for name, a in
              (("base", None), ("x", X), ("y", Y), ("x-again", X),
               ("x-moved", LoRARequest("x", "/adapters/x/2")))}
    assert len(chains["base"]) == 3
    assert chains["x"] == chains["x-again"]
    blocks = [set(c) for name, c in chains.items() if name != "x-again"]
    assert all(a.isdisjoint(b) for i, a in enumerate(blocks) for b in blocks[i + 1:])


def test_blocks_cached_under_an_adapter_are_hit_only_under_it():
    bm = BlockManager(num_blocks=16, block_size=4)
    first = seq("a", X)
    assert bm.allocate(first, 13)
    first.num_computed_tokens = 13
    bm.cache_full_blocks(first)
    assert bm.get_computed_blocks(seq("b", X)) == first.block_table[:3]
    assert bm.get_computed_blocks(seq("c", Y)) == []
    assert bm.get_computed_blocks(seq("d")) == []
    # a staff-shared prefix is public across tenants, but still the adapter's alone
    shared = dict(shared_prefix_len=12)
    assert bm.get_computed_blocks(seq("e", X, tenant=Tenant("t2"), **shared)) == []
    assert bm.get_computed_blocks(seq("f", None, **shared)) == []


# ------------------------------------------------------------------ the resident set
def test_slots_evict_the_least_recently_used_adapter_no_running_sequence_uses():
    a, b, c = (LoRARequest(n, f"/p/{n}") for n in "abc")
    slots = AdapterSlots(2)
    assert slots.acquire(a, []) == 0 and slots.acquire(b, []) == 1
    assert slots.acquire(a, []) == 0  # a is now the most recent
    running = [seq("r", a)]
    assert slots.acquire(c, running) == 1  # b: least recent and idle
    assert slots.resident == [a.identity, c.identity]
    assert slots.acquire(b, [seq("r1", a), seq("r2", c)]) is None  # both in use: b waits
    assert slots.acquire(b, [seq("r1", c)]) == 0  # a is idle again: its slot goes to b
    assert (slots.num_loads, slots.num_evictions) == (4, 2)


# ------------------------------------------------------------------ the batched product
def _wrapped(base, shards, rows_per_slot, num_rows, masked):
    step = LoRAStep()
    layer = LoRALinear(base, shards, num_slots=3, max_rank=4, step=step, dtype=torch.float32,
                       device=torch.device("cpu"))
    if masked:  # what the runtime sets for a step of several adapters
        step.mask = torch.zeros(num_rows, 3)
        for slot, rows in rows_per_slot.items():
            step.mask[rows, slot] = 1
    else:
        step.groups = [(s, torch.tensor(r)) for s, r in rows_per_slot.items()]
    return layer, step


@pytest.mark.parametrize("masked", [False, True], ids=["per-slot", "masked"])
@pytest.mark.parametrize("layout", ["float", "int8", "int4"])
def test_batched_product_adds_each_rows_adapter_on_top_of_the_base_product(layout, masked):
    torch.manual_seed(0)
    plain = QKVLinear(64, 16, 4, 2)  # q 64 rows, k 32, v 32
    plain.weight.data.normal_(0, 0.1)
    base = plain if layout == "float" else quantized_like(plain, layout, group_size=32)
    if base is not plain:
        for shard, (start, n) in plain.shards.items():
            if shard is not None:
                base.weight_loader(base.weight, plain.weight.data[start:start + n].clone(), shard)
    shards = [plain.shards[s] for s in ("q", "k", "v")]
    layer, step = _wrapped(base, shards, {0: [1, 3], 1: [2]}, 5, masked)
    layer.set_slot(2, {1: (torch.randn(4, 64), torch.randn(32, 4))}, scale=1.0)  # resident, unused
    a_q, b_q = torch.randn(3, 64), torch.randn(64, 3)  # slot 0: q only, rank 3
    a_v, b_v = torch.randn(4, 64), torch.randn(32, 4)  # slot 1: v only, rank 4
    layer.set_slot(0, {0: (a_q, b_q)}, scale=0.5)
    layer.set_slot(1, {2: (a_v, b_v)}, scale=2.0)
    x = torch.randn(5, 64)
    expected = base(x).clone()
    expected[[1, 3], :64] += 0.5 * (x[[1, 3]] @ a_q.T @ b_q.T)
    expected[2, 96:] += 2.0 * (x[2] @ a_v.T @ b_v.T)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-4)
    step.groups, step.mask = [], None  # a base-only step: the base's product alone
    torch.testing.assert_close(layer(x), base(x))


# ------------------------------------------------------------------ the adapter's checks
CFG = ModelConfig("llama", vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8)
PREFIX = "base_model.model.model.layers"


def write_adapter(path, tensors, **config):
    path.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "down_proj"],
              **config}
    (path / "adapter_config.json").write_text(json.dumps(config))
    save_file({k: torch.zeros(s) for k, s in tensors.items()}, path / "adapter_model.safetensors")
    return str(path)


GOOD = {f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": (4, 32),
        f"{PREFIX}.0.self_attn.q_proj.lora_B.weight": (32, 4),
        f"{PREFIX}.1.mlp.down_proj.lora_A.weight": (4, 64),
        f"{PREFIX}.1.mlp.down_proj.lora_B.weight": (32, 4)}


def test_a_fitting_adapter_reads_with_its_scale(tmp_path):
    spec = read_adapter(write_adapter(tmp_path, GOOD), CFG, max_lora_rank=8)
    assert (spec.rank, spec.scale, len(spec.modules)) == (4, 2.0, 2)
    rs = read_adapter(write_adapter(tmp_path / "rs", GOOD, use_rslora=True), CFG, max_lora_rank=8)
    assert rs.scale == 4.0  # 8 / sqrt(4)


@pytest.mark.parametrize("tensors, config, message", [
    ({**GOOD, f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": (4, 48)}, {},
     "model.layers.0.self_attn.q_proj: lora_A is [4, 48], the base's q_proj takes [4, 32]"),
    ({**GOOD, f"{PREFIX}.1.mlp.down_proj.lora_B.weight": (64, 4)}, {},
     "model.layers.1.mlp.down_proj: lora_B is [64, 4], the base's down_proj takes [32, 4]"),
    (GOOD, {"target_modules": ["q_proj", "c_attn"]}, "target module 'c_attn' is not a projection"),
    (GOOD, {"target_modules": ["q_proj"]}, "model.layers.1.mlp.down_proj: not among target_modules"),
    ({**GOOD, f"{PREFIX}.5.mlp.up_proj.lora_A.weight": (4, 32)}, {"target_modules": "all"},
     "model.layers.5.mlp.up_proj: the base has 2 layers"),
    ({f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": (4, 32)}, {}, "q_proj: lora_B is missing"),
    (GOOD, {"r": 16}, "rank r=16 exceeds the engine's max_lora_rank 8"),
    (GOOD, {"use_dora": True}, "sets use_dora=True"),
    (GOOD, {"peft_type": "IA3"}, "not a LoRA adapter"),
])
def test_a_mismatched_adapter_is_refused_naming_the_module_and_shapes(tmp_path, tensors, config, message):
    with pytest.raises(InvalidParameterError, match="adapter") as err:
        read_adapter(write_adapter(tmp_path, tensors, **config), CFG, max_lora_rank=8)
    assert message in str(err.value)


def test_a_truncated_adapter_names_the_tensor_it_broke_at(tmp_path):
    path = write_adapter(tmp_path, GOOD)
    weights = tmp_path / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(InvalidParameterError, match=r"truncated at tensor '.*down_proj.lora_B"):
        read_adapter(path, CFG, max_lora_rank=8)
