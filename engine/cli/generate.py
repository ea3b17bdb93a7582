"""`generate`: complete one prompt and print the text (streamed as it is produced)."""

from __future__ import annotations

import sys

from engine.sampling_params import SamplingParams

HELP = "complete a prompt (use --chat to wrap it in the model's chat template)"


def add_args(p) -> None:
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true", help="apply the chat template to the prompt")
    p.add_argument("--adapter", metavar="PEFT_DIR", help="run under this LoRA adapter folder")


def run(args, load_llm) -> int:
    llm = load_llm(args)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.seed, stop=args.stop)
    prompt = args.prompt
    if args.chat:
        from engine.text.tokenizer import apply_chat_template
        prompt = apply_chat_template(llm.tokenizer, [{"role": "user", "content": prompt}])
    adapter = None
    if args.adapter:
        from engine.lora.request import LoRARequest
        adapter = LoRARequest("cli", args.adapter)
    last = None
    for out in llm.stream(prompt, params, adapter=adapter):
        sys.stdout.write(out.text_delta)
        sys.stdout.flush()
        last = out
    sys.stdout.write("\n")
    if last is not None:
        m = last.metrics
        elapsed = m.finished_time - m.arrival_time
        print(f"[{last.num_output_tokens} tokens, finish_reason={last.finish_reason}, "
              f"{last.num_output_tokens / elapsed:.1f} tokens/s, "
              f"time to first token {m.time_to_first_token * 1000:.0f} ms]", file=sys.stderr)
    return 0
