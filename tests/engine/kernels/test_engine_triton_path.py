"""The whole engine on the Triton kernels (interpreted on CPU here) against its PyTorch path.

Same tiny random Llama, same float32 weights, same scheduler settings: only the layers'
use_triton differs, so every prefill, chunk, prefix-cache hit and decode step runs through
reshape_and_cache, the paged prefill and decode kernels, rotary, RMSNorm and SiLU kernels in one
engine and through plain PyTorch in the other. Greedy tokens must be identical and the raw
logprobs equal to float32 rounding.
"""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.runtime.cuda_graphs import CudaGraphRunner
from engine.memory.gpu_memory import dummy_caches, dummy_prefill_entries, run_dummy_step
from engine.scheduling.input_batch import build_input_batch

BLOCK_SIZE = 16
MAX_BATCHED_TOKENS = 32  # below the longest prompt, so prompts are prefilled in chunks
SETTINGS = dict(num_kv_blocks=64, max_model_len=256, block_size=BLOCK_SIZE,
                max_num_batched_tokens=MAX_BATCHED_TOKENS, device="cpu", dtype="float32")
PARAMS = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module")
def engines(tiny_llama_dir):
    torch_llm = LLM(str(tiny_llama_dir), use_triton=False, **SETTINGS)
    triton_llm = LLM(str(tiny_llama_dir), use_triton=True, **SETTINGS)
    assert all(layer.self_attn.attn.use_triton
               for layer in triton_llm.engine.runner.model.model.layers)
    return torch_llm, triton_llm


def generate_both(engines, prompts):
    return [llm.generate(prompts, PARAMS) for llm in engines]


def assert_same_outputs(reference, actual):
    for i, (ref, out) in enumerate(zip(reference, actual)):
        assert out.token_ids == ref.token_ids, \
            f"prompt {i}: triton {out.token_ids} != torch {ref.token_ids}"
        for step, (a, b) in enumerate(zip(out.logprobs, ref.logprobs)):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4), f"prompt {i} step {step}"
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            assert [lp for _, lp in a.top] == pytest.approx([lp for _, lp in b.top], abs=1e-4)


@pytest.mark.slow
def test_triton_path_greedy_matches_pytorch_on_mixed_lengths_with_chunked_prefill(engines):
    # 70 and 45 tokens need three and two chunks; 1- and 2-token prompts decode beside them.
    prompts = [[5, 6, 7], list(range(100, 170)), [9, 10], [11] * 17, [1], list(range(300, 345))]
    assert max(map(len, prompts)) > MAX_BATCHED_TOKENS
    reference, actual = generate_both(engines, prompts)
    assert_same_outputs(reference, actual)
    assert all(len(o.token_ids) == PARAMS.max_tokens for o in actual)


@pytest.mark.slow
def test_triton_path_matches_pytorch_after_prefix_cache_hits(engines):
    base = list(range(1000, 1033))  # two full blocks and one token more
    generate_both(engines, [base])  # publishes base's two full blocks to the prefix cache
    # An exact repeat computes one token over 32 cached ones (a one-token query); the others
    # prefill a suffix, in one piece or in chunks, over the same cached blocks.
    prompts = [base, base + [7, 8, 9], base + list(range(2000, 2040))]
    reference, actual = generate_both(engines, prompts)
    assert [o.num_cached_tokens for o in actual] == [2 * BLOCK_SIZE] * 3
    assert [o.num_cached_tokens for o in reference] == [2 * BLOCK_SIZE] * 3
    assert_same_outputs(reference, actual)


@pytest.mark.slow
def test_memory_profiling_step_runs_on_the_triton_path(engines):
    # The step CUDA start-up measures, here interpreted: prefills filling the token budget on a
    # throw-away cache, then logits and sampling with logprobs for more rows than prompts.
    runner = engines[1].engine.runner
    cfg = runner.model_config
    entries = dummy_prefill_entries(MAX_BATCHED_TOKENS, 20, BLOCK_SIZE)
    caches = dummy_caches(entries, BLOCK_SIZE, cfg.num_key_value_heads, cfg.head_dim,
                          cfg.num_hidden_layers, torch.float32, runner.device)
    with torch.inference_mode():
        ids = run_dummy_step(runner.model, runner.sampler, entries, caches, num_sampled_rows=5,
                             block_size=BLOCK_SIZE, device=runner.device, use_triton=True)
    assert ids.shape == (5,)
    assert bool(((ids >= 0) & (ids < cfg.vocab_size)).all())
    assert caches[0][0].abs().sum() > 0


@pytest.mark.slow
def test_cuda_graph_inputs_staged_with_padding_give_the_eager_decode(tiny_llama_dir):
    # What a CUDA graph replays, run eagerly here: a real 3-sequence decode step staged into
    # the static buffers of the size-4 graph, whose padding row must neither write the cache
    # (slot -1) nor attend (context 0), after a larger step left valid-looking values there.
    llm = LLM(str(tiny_llama_dir), use_triton=True, **SETTINGS)
    engine, runner = llm.engine, llm.engine.runner
    for i, prompt in enumerate([[5, 6, 7], list(range(100, 120)), [9, 10]]):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=4))
    engine.step()  # the three prefills
    step = engine.scheduler.schedule()
    assert [e.num_new_tokens for e in step.scheduled] == [1, 1, 1]
    batch = build_input_batch(step.scheduled, BLOCK_SIZE, runner.device, use_triton=True)
    graphs = CudaGraphRunner(runner.model, runner.kv_caches, max_batch_size=6,
                             max_blocks_per_seq=256 // BLOCK_SIZE, device=runner.device)
    with torch.inference_mode():
        graphs.slot_mapping.copy_(torch.arange(6))  # stale rows from an earlier step of 6
        graphs.context_lens.fill_(5)
        graphs.block_tables.fill_(1)
        eager = runner.model(batch.input_ids, batch.positions, runner.kv_caches, batch.meta)
        cache_before = runner.kv_pool.clone()
        size = graphs.stage(batch.input_ids, batch.positions, batch.meta)
        assert size == 4 and graphs.sizes == [1, 2, 4, 6]
        assert graphs.slot_mapping[3].item() == -1 and graphs.context_lens[3].item() == 0
        staged = graphs.forward_static(size)
    torch.testing.assert_close(staged[:3], eager, rtol=1e-5, atol=1e-5)
    # the same three slots rewritten with the same values; nothing else touched
    torch.testing.assert_close(runner.kv_pool, cache_before, rtol=1e-5, atol=1e-5)
    assert staged[3].isfinite().all()
