"""`chat`: an interactive conversation in the terminal, replies streamed token by token."""

from __future__ import annotations

import sys
import time

from engine.sampling_params import SamplingParams
from engine.text.tokenizer import apply_chat_template

HELP = "chat interactively with a model (/reset clears the history, /quit or Ctrl-D exits)"


def add_args(p) -> None:
    p.add_argument("--system", help="system prompt")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--seed", type=int)


def run(args, load_llm) -> int:
    llm = load_llm(args)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, seed=args.seed)
    history: list[dict] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    print("Type a message; /reset clears the history, /quit exits.", file=sys.stderr)
    while True:
        try:
            line = input("you> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            return 0
        if text == "/reset":
            history = history[:1] if args.system else []
            print("(history cleared)", file=sys.stderr)
            continue
        history.append({"role": "user", "content": text})
        prompt = apply_chat_template(llm.tokenizer, history)
        sys.stdout.write("assistant> ")
        reply, start, last = [], time.monotonic(), None
        try:
            for out in llm.stream(prompt, params):
                sys.stdout.write(out.text_delta)
                sys.stdout.flush()
                reply.append(out.text_delta)
                last = out
        except KeyboardInterrupt:
            sys.stdout.write(" [stopped]")
        sys.stdout.write("\n")
        history.append({"role": "assistant", "content": "".join(reply)})
        if last is not None:
            elapsed = time.monotonic() - start
            print(f"[{last.num_output_tokens} tokens, {last.num_output_tokens / elapsed:.1f} tokens/s,"
                  f" {last.num_cached_tokens} prompt tokens from the prefix cache]", file=sys.stderr)
