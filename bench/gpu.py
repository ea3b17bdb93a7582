"""GPU benchmark: decode throughput of Pagoda's engine beside Hugging Face transformers.

Models: a Llama-3-8B-shaped model with random bfloat16 weights built in memory (nothing is
downloaded or written to disk) and the bundled SmolLM2. Workload, the same for both engines:
B requests of --prompt-len random token ids, greedy, EOS ignored; after the prompts are
prefilled (and a few warm-up steps), --decode-tokens decode steps are timed, so tokens/s counts
decode only: B * steps / seconds. Pagoda runs its real scheduler, block manager and model runner
(CUDA graphs, Triton kernels), fed token ids, without a tokenizer. transformers runs generate
with a static cache; its decode time is generate(1 + N tokens) minus generate(1 token).

Also printed: greedy parity of the two on SmolLM2 on the same device, and the memory bandwidth
Pagoda reaches at batch 1 (weights + KV read per step) as a fraction of the device's peak.

    .venv/bin/python bench/gpu.py [--models llama3-8b,smollm2] [--batch-sizes 1,16,64,256]
        [--prompt-len 128] [--decode-tokens 64] [--skip-hf] [--skip-parity] [--hf-compile]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import pathlib
import random
import sys
import time
from dataclasses import dataclass

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from engine.scheduling.block_manager import BlockManager  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.runtime.device import resolve_dtype  # noqa: E402
from engine.runtime.model_runner import ModelRunner  # noqa: E402
from engine.models.model_config import ModelConfig  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.scheduling.scheduler import Scheduler  # noqa: E402
from engine.scheduling.sequence import Sequence  # noqa: E402

LLAMA3_8B = ModelConfig(
    architecture="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    rms_norm_eps=1e-5, rope_theta=500000.0,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    max_position_embeddings=8192, tie_word_embeddings=False)
# Same architecture, a few MB: smoke runs on CPU (tests/engine/test_gpu_bench_cpu.py).
TINY = ModelConfig(
    architecture="llama", vocab_size=512, hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=False)
RANDOM_MODELS = {"llama3-8b": LLAMA3_8B, "tiny": TINY}
BUNDLED_MODEL = "smollm2"

# Peak DRAM bandwidth in bytes/s by a substring of torch.cuda.get_device_name(); the first
# match wins, so more specific names come first.
PEAK_BANDWIDTH = [
    ("GH200", 4.0e12), ("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12), ("H800", 3.35e12), ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12), ("A100", 1.555e12), ("L40S", 0.864e12), ("L40", 0.864e12),
    ("L4", 0.3e12), ("A10G", 0.6e12), ("A10", 0.6e12), ("RTX 4090", 1.008e12),
    ("RTX 3090", 0.936e12), ("V100", 0.9e12), ("T4", 0.32e12),
]


def peak_bandwidth(device_name: str) -> float | None:
    for key, peak in PEAK_BANDWIDTH:
        if key in device_name:
            return peak
    return None


@dataclass
class DecodeResult:
    batch_size: int
    num_steps: int
    seconds: float
    mean_context_len: float  # tokens each sequence attends to, averaged over the timed steps

    @property
    def tokens_per_second(self) -> float:
        return self.batch_size * self.num_steps / self.seconds

    @property
    def ms_per_step(self) -> float:
        return 1000 * self.seconds / self.num_steps


def weight_bytes_read_per_step(cfg: ModelConfig, elem_size: int) -> int:
    """Bytes of weights a decode step reads: every matrix once, but of the input embedding only
    the rows looked up (negligible); a tied embedding is read whole as the output projection."""
    h, inter, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * inter + 2 * h  # qkv, o, gate/up/down, 2 norms
    if cfg.attention_bias:
        per_layer += q + 2 * kv
    numel = cfg.num_hidden_layers * per_layer + h + cfg.vocab_size * h  # + final norm, lm_head
    return numel * elem_size


def decode_bytes_per_step(cfg: ModelConfig, elem_size: int, batch_size: int,
                          mean_context_len: float) -> float:
    kv = cfg.kv_bytes_per_token_per_byte_of_dtype * elem_size * batch_size * mean_context_len
    return weight_bytes_read_per_step(cfg, elem_size) + kv


# ----------------------------------------------------------------------------- Pagoda
def build_runner(model_config: ModelConfig, weights, args, max_model_len: int) -> ModelRunner:
    """A model runner from a ModelConfig: weights None means random (seeded) parameters."""
    config = EngineConfig(
        model="bench", device=args.device, dtype=args.dtype, block_size=16,
        max_num_seqs=max(args.batch_sizes), max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager, enable_prefix_caching=False, seed=0)
    return ModelRunner(config, model_config, max_model_len, weights, eos_token_ids=[])


def random_prompts(batch_size: int, prompt_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(prompt_len)] for _ in range(batch_size)]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def pagoda_decode(runner: ModelRunner, batch_size: int, prompt_len: int, num_steps: int,
                  num_warmup: int, seed: int = 0) -> DecodeResult:
    """The engine's step loop (schedule, execute, update) on token ids; decode steps timed."""
    cfg = runner.config
    block_manager = BlockManager(runner.num_blocks, runner.block_size, enable_prefix_caching=False)
    needed = batch_size * block_manager.num_blocks_for(prompt_len + num_warmup + num_steps + 1)
    if needed > runner.num_blocks:
        raise SystemExit(f"the KV pool holds {runner.num_blocks} blocks, batch {batch_size} "
                         f"needs {needed}: lower --batch-sizes or --prompt-len")
    scheduler = Scheduler(block_manager, max_num_seqs=cfg.max_num_seqs,
                          max_num_batched_tokens=cfg.max_num_batched_tokens)
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=num_warmup + num_steps + 1)
    seqs = [Sequence(f"bench-{i}", p, params) for i, p in
            enumerate(random_prompts(batch_size, prompt_len, runner.model_config.vocab_size, seed))]
    for seq in seqs:
        scheduler.add(seq)

    def step() -> int:
        out = scheduler.schedule()
        sampled = runner.execute(out.scheduled)  # returns after the step's one host sync
        scheduler.update_after_step(out)
        for s in sampled:  # one token each: nothing drafts here (no speculator on this scheduler)
            for token_id in s.token_ids:
                s.entry.seq.append_token(token_id)
        return len(out.scheduled)

    try:
        while any(s.num_output_tokens == 0 for s in seqs):  # prefill, chunked by the budget
            step()
        for _ in range(num_warmup):
            step()
        _synchronize(runner.device)
        context_before = seqs[0].num_tokens
        start = time.perf_counter()
        for _ in range(num_steps):
            if step() != batch_size:
                raise RuntimeError("a timed step did not decode the whole batch")
        _synchronize(runner.device)
        seconds = time.perf_counter() - start
    finally:
        for seq in seqs:
            scheduler.remove(seq)
    # step i of the timed loop attends to context_before + i tokens
    return DecodeResult(batch_size, num_steps, seconds, context_before + (num_steps - 1) / 2)


# ----------------------------------------------------------------------------- transformers
def hf_config(cfg: ModelConfig):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        rope_scaling=cfg.rope_scaling, max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings, attention_bias=cfg.attention_bias)


def build_hf_random(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """transformers' LlamaForCausalLM of that shape, initialised randomly on ``device``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(cfg), dtype=dtype)
    return model.eval()


def build_hf_bundled(dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM

    from engine.models.registry import resolve_model_path

    path = resolve_model_path(BUNDLED_MODEL)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32)
    return model.to(device=device, dtype=dtype).eval()


def hf_decode(model, batch_size: int, prompt_len: int, num_steps: int, compile_model: bool,
              seed: int = 0) -> DecodeResult:
    """generate() with a static cache, timed between the logits of its first token (prompt
    prefilled) and those of token 1 + num_steps: num_steps decode forwards and their sampling."""
    from transformers import LogitsProcessor, LogitsProcessorList

    device = model.device

    class StepClock(LogitsProcessor):
        def __init__(self):
            self.times: list[float] = []

        def __call__(self, input_ids, scores):
            _synchronize(device)  # generate syncs every step anyway (its stopping check)
            self.times.append(time.perf_counter())
            return scores

    ids = torch.tensor(random_prompts(batch_size, prompt_len, model.config.vocab_size, seed),
                       device=device)

    def run(new_tokens: int) -> list[float]:
        clock = StepClock()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 cache_implementation="static", disable_compile=not compile_model,
                                 pad_token_id=0, logits_processor=LogitsProcessorList([clock]))
        assert out.shape == (batch_size, prompt_len + new_tokens)
        return clock.times

    run(1 + min(num_steps, 4))  # warm-up (and compilation, with --hf-compile)
    times = run(1 + num_steps)
    return DecodeResult(batch_size, num_steps, times[num_steps] - times[0],
                        prompt_len + (num_steps + 1) / 2)


# ----------------------------------------------------------------------------- parity
def greedy_parity(llm, hf_model, prompts: list[list[int]],
                  num_tokens: int) -> list[tuple[int, bool]]:
    """Per prompt: how many leading greedy tokens the engine shares with transformers, and
    whether the two outputs are identical (both stop after the first EOS, as the engine does)."""
    from engine.sampling_params import SamplingParams as Params

    eos = llm.engine.eos_token_ids
    ours = llm.generate(prompts, Params(temperature=0, max_tokens=num_tokens))
    result = []
    for prompt, out in zip(prompts, ours):
        ids = torch.tensor([prompt], device=hf_model.device)
        with torch.inference_mode():
            ref = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=num_tokens, eos_token_id=eos,
                                    pad_token_id=eos[0])[0, len(prompt):].tolist()
        ref = next((ref[:i + 1] for i, t in enumerate(ref) if t in eos), ref)
        same = 0
        while same < min(len(ref), len(out.token_ids)) and out.token_ids[same] == ref[same]:
            same += 1
        result.append((same, out.token_ids == ref))
    return result


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    from engine.text.tokenizer import apply_chat_template

    texts = json.loads((ROOT / "bench" / "prompts.json").read_text())[:n]
    return [apply_chat_template(tokenizer, [{"role": "user", "content": t}]) for t in texts]


def run_parity(args) -> None:
    from engine import LLM

    device = torch.device(args.device)
    hf = build_hf_bundled(torch.float32, device)
    for dtype in ("float32", "bfloat16"):
        llm = LLM(BUNDLED_MODEL, device=args.device, dtype=dtype, num_kv_blocks=256,
                  max_model_len=1024, enforce_eager=args.enforce_eager)
        hf = hf.to(resolve_dtype(dtype, device))
        prompts = chat_prompts(llm.tokenizer, args.parity_prompts)
        parity = greedy_parity(llm, hf, prompts, args.parity_tokens)
        print(f"greedy parity, SmolLM2 {dtype}, up to {args.parity_tokens} tokens: "
              f"{sum(same for _, same in parity)}/{len(parity)} prompts identical to "
              f"transformers; leading tokens in agreement {[n for n, _ in parity]}", flush=True)
        del llm
        _free(device)
    del hf
    _free(device)


# ----------------------------------------------------------------------------- main
def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="llama3-8b,smollm2",
                    help=f"comma-separated, from {sorted(RANDOM_MODELS) + [BUNDLED_MODEL]}")
    ap.add_argument("--batch-sizes", default="1,16,64,256")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=64, help="timed decode steps")
    ap.add_argument("--warmup-steps", type=int, default=4)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="default: the model's own context length")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--skip-hf", action="store_true", help="Pagoda only")
    ap.add_argument("--hf-compile", action="store_true",
                    help="let transformers torch.compile its static-cache decode (slow start)")
    ap.add_argument("--skip-parity", action="store_true")
    ap.add_argument("--parity-prompts", type=int, default=5)
    ap.add_argument("--parity-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in RANDOM_MODELS and m != BUNDLED_MODEL]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {sorted(RANDOM_MODELS)} "
                 f"or {BUNDLED_MODEL}")
    try:
        args.batch_sizes = sorted({int(b) for b in args.batch_sizes.split(",") if b})
    except ValueError:
        ap.error(f"--batch-sizes must be comma-separated integers, got {args.batch_sizes!r}")
    if not args.batch_sizes or args.batch_sizes[0] < 1:
        ap.error("--batch-sizes must be positive")
    if args.max_num_batched_tokens < args.batch_sizes[-1]:
        ap.error("--max-num-batched-tokens must be at least the largest batch size")
    return args


def load_model(name: str):
    """(ModelConfig, weights or None for random) of a benchmark model."""
    if name in RANDOM_MODELS:
        return RANDOM_MODELS[name], None
    from engine.models.loader import iter_weights, load_model_config

    cfg = load_model_config(BUNDLED_MODEL)
    return cfg, iter_weights(BUNDLED_MODEL, cfg)


def bench_model(name: str, args, peak: float | None) -> list[str]:
    """Run one model through both engines; returns its table rows."""
    device = torch.device(args.device)
    cfg, weights = load_model(name)
    max_model_len = args.max_model_len or cfg.max_position_embeddings
    start = time.perf_counter()
    runner = build_runner(cfg, weights, args, max_model_len)
    print(f"{name}: engine ready in {time.perf_counter() - start:.1f} s, KV pool "
          f"{runner.num_blocks * runner.block_size} tokens", flush=True)
    ours = {b: pagoda_decode(runner, b, args.prompt_len, args.decode_tokens, args.warmup_steps)
            for b in args.batch_sizes}
    elem = runner.kv_pool.element_size()
    del runner
    _free(device)

    theirs = {}
    if not args.skip_hf:
        dtype = resolve_dtype(args.dtype, device)
        hf = (build_hf_random(cfg, dtype, device) if weights is None
              else build_hf_bundled(dtype, device))
        theirs = {b: hf_decode(hf, b, args.prompt_len, args.decode_tokens, args.hf_compile)
                  for b in args.batch_sizes}
        del hf
        _free(device)

    rows = []
    for b in args.batch_sizes:
        r = ours[b]
        hf_tps, ratio = f"{'-':>12}", f"{'-':>7}"
        if b in theirs:
            hf_tps = f"{theirs[b].tokens_per_second:12.1f}"
            ratio = f"{r.tokens_per_second / theirs[b].tokens_per_second:6.2f}x"
        rows.append(f"{name:<10} {b:>5} {r.tokens_per_second:12.1f} {hf_tps} {ratio} "
                    f"{r.ms_per_step:9.2f}")
    if 1 in ours:
        r = ours[1]
        step_bytes = decode_bytes_per_step(cfg, elem, 1, r.mean_context_len)
        achieved = step_bytes / (r.seconds / r.num_steps)
        frac = f" = {100 * achieved / peak:.0f}% of the {peak / 1e12:.2f} TB/s peak" if peak else ""
        rows.append(f"{name:<10} batch 1 memory bandwidth: {step_bytes / 1e9:.3g} GB per step "
                    f"(weights + KV), {achieved / 1e12:.2f} TB/s{frac}")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    peak = None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("bench/gpu.py: torch sees no CUDA device (a CPU build of torch?)")
        name = torch.cuda.get_device_name(device)
        peak = peak_bandwidth(name)
        total = torch.cuda.get_device_properties(device).total_memory
        print(f"device: {name}, {total / 2**30:.0f} GiB, peak bandwidth "
              f"{f'{peak / 1e12:.2f} TB/s' if peak else 'unknown'}; torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}", flush=True)
    if not args.skip_parity:
        run_parity(args)
    print(f"\ndecode throughput: {args.dtype}, prompt {args.prompt_len} tokens, "
          f"{args.decode_tokens} decode steps timed, greedy", flush=True)
    header = (f"{'model':<10} {'batch':>5} {'pagoda tok/s':>12} {'hf tok/s':>12} {'ratio':>7} "
              f"{'ms/step':>9}")
    rows = []
    for name in args.models:
        model_rows = bench_model(name, args, peak)
        print("\n".join([header, *model_rows]), flush=True)
        rows += model_rows
    if len(args.models) > 1:
        print("\nsummary\n" + "\n".join([header, *rows]), flush=True)
    return 0


if __name__ == "__main__":
    # the engine logs its start-up numbers: memory profile, KV pool, CUDA graphs
    logging.basicConfig(level=logging.INFO, format="  %(name)s: %(message)s")
    sys.exit(main())
