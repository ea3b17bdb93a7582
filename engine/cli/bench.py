"""`bench`: offline throughput of the engine on synthetic or file-supplied prompts."""

from __future__ import annotations

import json
import random
import statistics
import time

from engine.sampling_params import SamplingParams

HELP = "measure offline throughput (output tokens/s, time to first token) on a batch of requests"


def add_args(p) -> None:
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128, help="synthetic prompt length in tokens")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--prompts-file", help="a JSON list of strings, sent through the chat template")
    p.add_argument("--seed", type=int, default=0)


def build_prompts(args, tokenizer) -> list[list[int]]:
    if args.prompts_file:
        from engine.text.tokenizer import apply_chat_template
        with open(args.prompts_file) as f:
            texts = json.load(f)
        texts = (texts * (args.num_prompts // len(texts) + 1))[:args.num_prompts]
        return [apply_chat_template(tokenizer, [{"role": "user", "content": t}]) for t in texts]
    rng = random.Random(args.seed)
    vocab = len(tokenizer)
    return [[rng.randrange(100, vocab - 100) for _ in range(args.input_len)]
            for _ in range(args.num_prompts)]


def run(args, load_llm) -> int:
    llm = load_llm(args)
    prompts = build_prompts(args, llm.tokenizer)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    num_out = sum(len(o.token_ids) for o in outputs)
    num_in = sum(len(p) for p in prompts)
    ttft = sorted(o.metrics.time_to_first_token for o in outputs)
    stats = llm.engine.stats()
    print(f"requests:            {len(prompts)}")
    print(f"prompt tokens:       {num_in}")
    print(f"output tokens:       {num_out}")
    print(f"elapsed:             {elapsed:.2f} s")
    print(f"output tokens/s:     {num_out / elapsed:.1f}")
    print(f"total tokens/s:      {(num_in + num_out) / elapsed:.1f}")
    print(f"requests/s:          {len(prompts) / elapsed:.2f}")
    print(f"TTFT p50 / max:      {statistics.median(ttft) * 1000:.0f} / {ttft[-1] * 1000:.0f} ms")
    print(f"prefix cache hits:   {stats.prefix_cache_hit_tokens} of "
          f"{stats.prefix_cache_queried_tokens} prompt tokens")
    print(f"preemptions:         {stats.num_preemptions}")
    return 0
