"""What a running batch costs interactive users: single-stream inter-token latency, idle vs while
a Batch API job runs on the same model.

Starts an embedded Pagoda (Daphne with the engine worker in the web process, as ``make run``) on
the bundled SmolLM2 in a temporary folder, then:

for each of ``--rounds`` rounds (alternated, so that a shared machine's drifting load hits both alike):

1. idle: ``--requests`` streamed chat completions one after another (bench/serve.py's client,
   greedy, EOS ignored, ``--max-tokens`` each); each gives its inter-token latency
   ((last content event - first) / (tokens - 1));
2. batch: a batch of ``--batch-lines`` chat requests (``--batch-max-tokens`` each, uploaded once to
   /v1/files) is created, and once its lines run the same interactive requests are sent; the batch
   is cancelled afterwards (it must still be running at the end, or the run says so).

and prints the p50 of both, their ratio (target: within 1.2x) and the batch lines finished meanwhile.
The runner's limits come from --in-flight, --busy-in-flight and --max-starvation
(PAGODA_BATCH_MAX_IN_FLIGHT, PAGODA_BATCH_MAX_IN_FLIGHT_BUSY and PAGODA_BATCH_MAX_STARVATION_S: the
batch's minimum share, one line let in after that long held off with none running). The machine is shared and noisy: only the ratio of one run means
anything, and the load average is printed with it.

    .venv/bin/python bench/batch_interference.py [--rounds 3] [--requests 4] [--max-tokens 64]
        [--batch-lines 200] [--batch-max-tokens 64] [--in-flight 4] [--busy-in-flight 0]
        [--max-starvation 10]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import time
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its sibling modules
from serve import one_request, percentile  # noqa: E402
from serve_compare import PY, Services, free_port, prepare_workdir  # noqa: E402

MODEL = "smollm2"
PROMPTS = json.loads((Path(__file__).resolve().parent / "prompts.json").read_text())


async def interactive(url: str, key: str, args) -> list[float]:
    """Inter-token latencies (s) of ``args.requests`` single streams, one after another."""
    client_args = argparse.Namespace(url=url, model=MODEL, max_tokens=args.max_tokens)
    itls = []
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=300) as http:
        for i in range(args.requests):
            result = await one_request(http, client_args, PROMPTS[i % len(PROMPTS)])
            if result.itl is not None:
                itls.append(result.itl)
    return itls


def batch_file(args) -> bytes:
    lines = [{"custom_id": f"bench-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[(i + 7) % len(PROMPTS)]}],
                       "max_tokens": args.batch_max_tokens, "temperature": 0, "ignore_eos": True}}
             for i in range(args.batch_lines)]
    return "\n".join(json.dumps(line) for line in lines).encode()


def wait_running(api: openai.OpenAI, batch_id: str, timeout: float = 300.0):  # a shared machine is slow
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = api.batches.retrieve(batch_id)
        if batch.status == "in_progress" and batch.request_counts and batch.request_counts.completed >= 1:
            return batch
        if batch.status not in ("validating", "in_progress"):
            raise RuntimeError(f"batch {batch_id} is {batch.status}: {batch.errors}")
        time.sleep(0.2)
    raise RuntimeError(f"batch {batch_id} did not start within {timeout} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4, help="interactive requests per phase of a round")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch-lines", type=int, default=200)
    ap.add_argument("--batch-max-tokens", type=int, default=64)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--busy-in-flight", type=int, default=0)
    ap.add_argument("--max-starvation", type=float, default=10.0,
                    help="seconds a batch held off with no line running waits before one line is let in")
    args = ap.parse_args()
    if min(args.rounds, args.requests, args.max_tokens, args.batch_lines, args.batch_max_tokens, args.in_flight) < 1 \
            or args.busy_in_flight < 0 or args.max_starvation < 0:
        ap.error("every count must be positive (--busy-in-flight may be 0, --max-starvation not negative)")

    root, env, key = prepare_workdir("pagoda-batch-interference-")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with Services(root, env) as services:
        services.spawn("daphne", [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                  "webapp.config.asgi:application"],
                       {"PAGODA_EMBEDDED_WORKERS": "1", "PAGODA_BATCH_MAX_IN_FLIGHT": str(args.in_flight),
                        "PAGODA_BATCH_MAX_IN_FLIGHT_BUSY": str(args.busy_in_flight),
                        "PAGODA_BATCH_MAX_STARVATION_S": str(args.max_starvation)})
        services.wait_ready(url)
        asyncio.run(interactive(url, key, argparse.Namespace(requests=1, max_tokens=8)))  # warm-up
        api = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)
        file = api.files.create(file=("bench.jsonl", io.BytesIO(batch_file(args))), purpose="batch")
        idle, during, loads, lines_done, elapsed, still_running = [], [], [], 0, 0.0, True
        for _ in range(args.rounds):  # alternated, so that the machine's drifting load hits both alike
            loads.append(os.getloadavg()[0])
            idle += asyncio.run(interactive(url, key, args))
            batch = api.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                       completion_window="24h")
            before = wait_running(api, batch.id).request_counts.completed
            started = time.monotonic()
            during += asyncio.run(interactive(url, key, args))
            elapsed += time.monotonic() - started
            after = api.batches.retrieve(batch.id)
            lines_done += after.request_counts.completed - before
            still_running = still_running and after.status == "in_progress"
            api.batches.cancel(batch.id)
            while api.batches.retrieve(batch.id).status != "cancelled":
                time.sleep(0.2)
        load_idle = sum(loads) / len(loads)

    p50_idle, p50_batch = percentile(idle, 50), percentile(during, 50)
    rows = [
        ("interactive requests x tokens", f"{args.requests} x {args.max_tokens}"),
        ("batch lines x tokens", f"{args.batch_lines} x {args.batch_max_tokens}"),
        ("runner in flight (idle / busy)", f"{args.in_flight} / {args.busy_in_flight}"),
        ("minimum share: one line after (s)", f"{args.max_starvation:g}"),
        ("inter-token p50, idle (ms)", f"{1000 * p50_idle:.1f}"),
        ("inter-token p50, batch running (ms)", f"{1000 * p50_batch:.1f}"),
        ("inter-token p95, idle (ms)", f"{1000 * percentile(idle, 95):.1f}"),
        ("inter-token p95, batch running (ms)", f"{1000 * percentile(during, 95):.1f}"),
        ("ratio of p50s (target <= 1.2)", f"{p50_batch / p50_idle:.2f}"),
        ("rounds (idle, then batch running)", f"{args.rounds}"),
        ("batch lines done while measuring", f"{lines_done} in {elapsed:.1f} s"),
        ("batch still running at the end", "yes" if still_running else "NO: the figure is not under load"),
        ("load average (mean of rounds)", f"{load_idle:.1f}"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"Batch interference on {MODEL} (embedded server, workdir {root})")
    for name, value in rows:
        print(f"  {name:<{width}}  {value:>18}")
    return 0 if still_running else 1


if __name__ == "__main__":
    sys.exit(main())
