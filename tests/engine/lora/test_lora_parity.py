"""Each adapter's greedy tokens equal peft's merged model (fp32) on a tiny random Llama, with two
adapters and the base mixed in one batch: whole, with prefill chunked into 8-token steps, and in a
pool small enough that sequences are preempted and recomputed; blocks computed under one adapter
are never reused for another or for the base."""

import pytest
import torch

from engine import LLM, LoRARequest, SamplingParams

from tests.engine.lora.adapters import ADAPTERS, make_adapter, merged_reference
from tests.engine.test_hf_parity import EXACT, assert_same, hf_greedy
from tests.engine.test_model_families import SIZES, prompts_of, save_tiny

NUM_TOKENS = 32
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_lora(tmp_path_factory, smollm2_tokenizer):
    """(base dir, {name: adapter dir}) for a tiny Llama and the two ADAPTERS."""
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("lora")
    base = save_tiny(root / "base", LlamaForCausalLM, LlamaConfig(**SIZES), smollm2_tokenizer)
    adapters = {name: make_adapter(base, root / name, seed=i + 1, **lora)
                for i, (name, lora) in enumerate(ADAPTERS.items())}
    return str(base), adapters


@pytest.fixture(scope="module")
def mixed_batch(tiny_lora):
    """Six prompts, each under the base, 'terse' or 'chatty' in turn, and each one's tokens from
    its own fp32 reference (transformers for the base, peft's merged model for an adapter)."""
    from transformers import AutoModelForCausalLM

    base, adapters = tiny_lora
    prompts = prompts_of((3, 17, 40, 9, 31, 22))
    names = [None, "terse", "chatty", "chatty", None, "terse"]
    models = {None: AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval(),
              **{n: merged_reference(base, d) for n, d in adapters.items()}}
    reference = [hf_greedy(models[n], p, NUM_TOKENS, [-1]) for n, p in zip(names, prompts)]
    base_reference = [hf_greedy(models[None], p, NUM_TOKENS, [-1]) for p in prompts]
    # the adapters matter: every adapter row's tokens differ from the base's on its prompt
    assert all((ref != base_ref) == (n is not None)
               for n, ref, base_ref in zip(names, reference, base_reference))
    requests = [None if n is None else LoRARequest(n, adapters[n]) for n in names]
    return prompts, requests, reference


PARAMS = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)


@pytest.mark.parametrize("settings", [
    dict(num_kv_blocks=64),
    dict(num_kv_blocks=64, max_num_batched_tokens=8),
    dict(num_kv_blocks=10, enable_prefix_caching=False, max_num_batched_tokens=16),
], ids=["whole", "chunked", "preempted"])
def test_mixed_adapter_batch_matches_peft_merged(tiny_lora, mixed_batch, settings):
    base, _ = tiny_lora
    prompts, requests, reference = mixed_batch
    llm = LLM(base, **settings, **EXACT)
    assert_same(llm.generate(prompts, PARAMS, adapters=requests), reference)
    if settings["num_kv_blocks"] == 10:
        assert llm.engine.stats().num_preemptions > 0
    llm.engine.block_manager.check_all_free()


def test_prefix_cache_never_crosses_adapters(tiny_lora, mixed_batch):
    """One 40-token prompt (two full blocks) under 'terse', then 'chatty', then the base, then
    'terse' again: only the last reuses blocks, and every answer is its own reference's."""
    base, adapters = tiny_lora
    prompts, requests, reference = mixed_batch
    terse, chatty = (LoRARequest(n, adapters[n]) for n in ("terse", "chatty"))
    prompt = prompts[2]  # 40 tokens; reference[2] is 'chatty' on it
    llm = LLM(base, num_kv_blocks=64, **EXACT)
    runs = [llm.generate([prompt], PARAMS, adapters=a)[0] for a in (terse, chatty, None, terse)]
    assert [r.num_cached_tokens for r in runs] == [0, 0, 0, 32]
    assert runs[1].token_ids == reference[2]
    assert runs[0].token_ids == runs[3].token_ids != runs[2].token_ids
    llm.engine.block_manager.check_all_free()


def test_lru_evicts_an_idle_adapter_while_serving(tiny_lora, mixed_batch):
    """One slot, two adapters and the base in one stream of requests: the second adapter waits for
    the first's request to finish, then replaces it; every answer equals its reference."""
    base, _ = tiny_lora
    prompts, requests, reference = mixed_batch
    llm = LLM(base, num_kv_blocks=64, max_loras=1, **EXACT)
    engine = llm.engine
    for i in (1, 2, 0):  # 'terse', 'chatty', base
        engine.add_request(f"r{i}", prompts[i], PARAMS, adapter=requests[i])
    tokens: dict[str, list[int]] = {}
    first = True
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids_delta)
        if first:  # 'chatty' waits: the one slot holds 'terse', which r1 runs under
            assert {s.request_id for s in engine.scheduler.running} == {"r1", "r0"}
            first = False
    slots = engine.scheduler.lora_slots
    assert (slots.num_loads, slots.num_evictions) == (2, 1)
    assert slots.resident == [requests[2].identity]
    stats = engine.stats()  # what the worker's heartbeat and /metrics publish
    assert (stats.num_lora_resident, stats.num_lora_loads) == (1, 2)
    for i in (0, 1, 2):
        assert tokens[f"r{i}"] == reference[i]
