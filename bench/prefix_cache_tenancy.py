"""What scoping the prefix cache to its tenant costs in hit rate, on multi-user multi-turn chat.

Every user holds one conversation: the same system prompt, then their own questions
(bench/prompts.json), each turn rendered with the model's chat template as the chat page renders it,
so that a user's earlier turns are a prefix of their next prompt. Turn t of every user is sent
together and generated greedily; the replies go into the history. The same conversations run three
times on one engine, each from an empty prefix cache:

- unscoped: every request is the engine's single tenant "" (the cache before issue #31);
- scoped: each user is their own tenant (what the server does now);
- scoped + shared system prompt: as scoped, with the system prompt marked shared by staff
  (shared_prefix_len = its rendered system turn).

The greedy replies should be the same in every mode, so that the three runs send the same prompts,
but on the bundled int4 model on a CPU a reply can change with what the prefix cache served (the
engine's promise of greedy tokens whatever the cache state does not hold there, with one tenant
too: a prompt answered cold and with its system prompt cached can differ): the table says how many
replies differ from the unscoped run's, and the queried tokens show how far the prompts moved.
"prefilled" is the prompt tokens the model computed (queried less hit): the cost that counts. No
times: the hit rates are exact, a shared machine's seconds are not.

    .venv/bin/python bench/prefix_cache_tenancy.py [--users 8] [--turns 4] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import LLM, SamplingParams  # noqa: E402
from engine.kernels.cpu import cpu_info  # noqa: E402
from engine.tenancy import Tenant  # noqa: E402
from engine.text.tokenizer import apply_chat_template  # noqa: E402

SYSTEM_PROMPT = ("You are the assistant of Example Ltd's help desk. Answer the user's question accurately and "
                 "briefly, in plain language; when you are unsure, say so and suggest where to look it up.")
MODES = ("unscoped", "scoped", "scoped + shared system prompt")


def run_mode(llm: LLM, mode: str, questions: list[list[str]], max_tokens: int) -> dict:
    engine = llm.engine
    engine.block_manager.reset_prefix_cache()
    engine.reset_counters()
    system_turn = apply_chat_template(llm.tokenizer, [{"role": "system", "content": SYSTEM_PROMPT}],
                                      add_generation_prompt=False)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    histories = [[{"role": "system", "content": SYSTEM_PROMPT}] for _ in questions]
    per_turn = []
    for turn in range(len(questions[0])):
        before = engine.stats()
        replies: dict[str, list[int]] = {}
        for user, history in enumerate(histories):
            history.append({"role": "user", "content": questions[user][turn]})
            prompt = apply_chat_template(llm.tokenizer, history)
            shared = len(system_turn) if mode == MODES[2] and prompt[:len(system_turn)] == system_turn else 0
            tenant = Tenant() if mode == MODES[0] else Tenant(f"user:{user}")
            rid = f"{user}-{turn}"
            engine.add_request(rid, prompt, params, tenant=tenant, shared_prefix_len=shared)
            replies[rid] = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                replies[out.request_id] += out.token_ids_delta
        for user, history in enumerate(histories):
            text = llm.tokenizer.decode(replies[f"{user}-{turn}"], skip_special_tokens=True)
            history.append({"role": "assistant", "content": text})
        after = engine.stats()
        per_turn.append((after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens,
                         after.prefix_cache_queried_tokens - before.prefix_cache_queried_tokens))
    stats = engine.stats()
    return {"hit": stats.prefix_cache_hit_tokens,
            "queried": stats.prefix_cache_queried_tokens, "per_turn": per_turn,
            "preemptions": stats.num_preemptions, "histories": histories}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48, help="the most tokens of one reply")
    ap.add_argument("--num-kv-blocks", type=int, default=None, help="the KV pool (default: the engine's)")
    args = ap.parse_args()

    texts = json.loads((ROOT / "bench" / "prompts.json").read_text())
    questions = [[texts[(u * args.turns + t) % len(texts)] for t in range(args.turns)] for u in range(args.users)]
    settings = {"num_kv_blocks": args.num_kv_blocks} if args.num_kv_blocks else {}
    llm = LLM(args.model, **settings)
    print(f"{args.users} users x {args.turns} turns of chat, one shared system prompt, greedy replies of at most "
          f"{args.max_tokens} tokens; KV pool {llm.engine.block_manager.num_blocks} blocks of "
          f"{llm.engine.block_manager.block_size}; {cpu_info.describe()}")
    results = {mode: run_mode(llm, mode, questions, args.max_tokens) for mode in MODES}
    reference = [m for h in results[MODES[0]]["histories"] for m in h if m["role"] == "assistant"]
    for r in results.values():
        replies = [m for h in r["histories"] for m in h if m["role"] == "assistant"]
        r["num_changed"] = sum(a != b for a, b in zip(reference, replies))

    turn_heads = "".join(f"{'turn ' + str(t + 1):>9}" for t in range(args.turns))
    print(f"{'prefix cache':<32}{'hit rate':>9}{'hit / queried tokens':>24}{turn_heads}{'prefilled':>11}"
          f"{'replies changed':>17}")
    for mode, r in results.items():
        turns = "".join(f"{hit / queried:>9.1%}" for hit, queried in r["per_turn"])
        print(f"{mode:<32}{r['hit'] / r['queried']:>9.1%}{str(r['hit']) + ' / ' + str(r['queried']):>24}"
              f"{turns}{r['queried'] - r['hit']:>11}{str(r['num_changed']) + ' of ' + str(len(reference)):>17}")
    if any(r["preemptions"] for r in results.values()):
        print("preemptions: " + ", ".join(f"{m} {r['preemptions']}" for m, r in results.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
