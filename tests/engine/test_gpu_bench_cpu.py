"""The CPU-runnable parts of the GPU work, run here so that typos never wait for a GPU:
bench/gpu.py end to end on a tiny random model, its arithmetic, the random-weight runner, the
memory profiler's dummy step and the CUDA graph batch sizes."""

import pytest
import torch

from bench import gpu as bench
from engine.runtime.cuda_graphs import capture_sizes
from engine.memory.gpu_memory import dummy_caches, dummy_prefill_entries, run_dummy_step

CPU_ARGS = ["--device", "cpu", "--dtype", "float32", "--models", "tiny", "--batch-sizes", "1,3",
            "--prompt-len", "8", "--decode-tokens", "3", "--warmup-steps", "1",
            "--max-num-batched-tokens", "16", "--skip-parity"]


@pytest.mark.slow
def test_bench_runs_end_to_end_on_cpu_and_prints_both_engines(capsys):
    assert bench.main(CPU_ARGS) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("tiny ")]
    assert [r[1] for r in rows[:2]] == ["1", "3"]
    for r in rows[:2]:  # pagoda tok/s, hf tok/s, ratio, ms/step: all positive numbers
        assert float(r[2]) > 0 and float(r[3]) > 0 and r[4].endswith("x") and float(r[5]) > 0
        assert float(r[4][:-1]) == pytest.approx(float(r[2]) / float(r[3]), rel=0.02, abs=0.01)
    assert "batch 1 memory bandwidth" in out


def test_bench_defaults_and_argument_errors():
    args = bench.parse_args([])
    assert args.models == ["llama3-8b", "smollm2"]
    assert args.batch_sizes == [1, 16, 64, 256]
    assert args.device == "cuda" and args.dtype == "bfloat16"
    for bad in (["--models", "gpt5"], ["--batch-sizes", "1,x"], ["--batch-sizes", "0"],
                ["--batch-sizes", "512", "--max-num-batched-tokens", "256"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_decode_result_arithmetic():
    r = bench.DecodeResult(batch_size=4, num_steps=10, seconds=2.0, mean_context_len=100)
    assert r.tokens_per_second == 20.0
    assert r.ms_per_step == 200.0


def test_weight_bytes_match_the_engine_model_and_llama3_8b():
    runner = bench.build_runner(bench.TINY, None, bench.parse_args(CPU_ARGS), 64)
    model = runner.model
    embed = model.model.embed_tokens.weight
    read = sum(p.numel() for p in model.parameters()) - embed.numel()
    assert bench.weight_bytes_read_per_step(bench.TINY, 4) == read * 4
    # Llama-3-8B has 8,030,261,248 parameters, 525,336,576 of them in the input embedding.
    assert bench.weight_bytes_read_per_step(bench.LLAMA3_8B, 2) == (8_030_261_248 - 525_336_576) * 2
    cfg = bench.LLAMA3_8B
    kv_per_token = 2 * 32 * 8 * 128 * 2
    assert bench.decode_bytes_per_step(cfg, 2, 1, 100.0) == \
        bench.weight_bytes_read_per_step(cfg, 2) + 100 * kv_per_token


def test_peak_bandwidth_table_prefers_the_most_specific_name():
    assert bench.peak_bandwidth("NVIDIA H200") == 4.8e12
    assert bench.peak_bandwidth("NVIDIA GH200 480GB") == 4.0e12
    assert bench.peak_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert bench.peak_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert bench.peak_bandwidth("NVIDIA L40S") == 0.864e12
    assert bench.peak_bandwidth("NVIDIA L4") == 0.3e12
    assert bench.peak_bandwidth("Some Future GPU") is None


def test_random_weight_runner_is_seeded_and_matches_transformers_shapes():
    args = bench.parse_args(CPU_ARGS)
    a = bench.build_runner(bench.TINY, None, args, 64).model.state_dict()
    b = bench.build_runner(bench.TINY, None, args, 64).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.all(a["model.norm.weight"] == 1.0)
    assert 0.015 < a["model.layers.0.mlp.down_proj.weight"].std() < 0.025
    hf = bench.build_hf_random(bench.TINY, torch.float32, torch.device("cpu"))
    assert sum(p.numel() for p in hf.parameters()) == sum(v.numel() for v in a.values())


@pytest.mark.slow
def test_bench_greedy_parity_reports_identical_outputs_for_the_same_weights(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    from engine import LLM

    llm = LLM(str(tiny_llama_dir), num_kv_blocks=32, max_model_len=128)
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    prompts = [[5, 6, 7], list(range(100, 130))]
    assert bench.greedy_parity(llm, hf, prompts, 6) == [(6, True), (6, True)]
    hf.model.norm.weight.data.mul_(-1.0)  # a different model must be reported as one
    assert all(not same for _, same in bench.greedy_parity(llm, hf, prompts, 6))


def test_profiling_step_covers_the_token_budget_in_prefills_within_the_context():
    entries = dummy_prefill_entries(num_tokens=300, max_model_len=128, block_size=16)
    assert sum(e.num_new_tokens for e in entries) == 300
    assert all(2 <= e.num_new_tokens <= 128 and e.is_sampling and e.start == 0 for e in entries)
    blocks = [b for e in entries for b in e.seq.block_table]
    assert blocks == list(range(len(blocks)))
    assert all(len(e.seq.block_table) * 16 >= e.num_new_tokens for e in entries)
    # 129 = 128 + 1 would leave a one-token entry, which is a decode, not a prefill
    assert [e.num_new_tokens for e in dummy_prefill_entries(129, 128, 16)] == [127, 2]


def test_profiling_step_runs_the_model_and_samples_every_row():
    use_triton = False  # the Triton variant: tests/engine/kernels/test_engine_triton_path.py
    runner = bench.build_runner(bench.TINY, None, bench.parse_args(CPU_ARGS), 64)
    entries = dummy_prefill_entries(100, 64, 16)
    cfg = bench.TINY
    caches = dummy_caches(entries, 16, cfg.num_key_value_heads, cfg.head_dim,
                          cfg.num_hidden_layers, torch.float32, torch.device("cpu"))
    with torch.inference_mode():
        ids = run_dummy_step(runner.model, runner.sampler, entries, caches, num_sampled_rows=7,
                             block_size=16, device=torch.device("cpu"), use_triton=use_triton)
    assert ids.shape == (7,) and ids.dtype == torch.long
    assert bool(((ids >= 0) & (ids < cfg.vocab_size)).all())
    assert caches[0][0].abs().sum() > 0  # the step wrote its keys into the throw-away cache


def test_cuda_graph_batch_sizes_pad_beyond_16_by_at_most_half():
    assert capture_sizes(128) == [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128]
    assert capture_sizes(256)[-4:] == [96, 128, 192, 256]
    assert capture_sizes(100)[-2:] == [96, 100]
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 3]
    sizes = capture_sizes(512)
    for n in range(1, 513):
        padded = next(s for s in sizes if s >= n)
        assert padded < 2 * n or n == 1
        assert n <= 16 or padded - n <= n // 2
