"""Online serving benchmark: N concurrent streaming chat clients against a running Pagoda.

Each client sends the prompts of bench/prompts.json in turn to POST /v1/chat/completions with
stream=true and stream_options.include_usage (so output tokens are the server's own count),
greedy, EOS ignored so every request yields exactly --max-tokens tokens. ``--endpoint
completions`` sends each prompt as plain text to /v1/completions instead (a base model without a
chat template, Gemma 3 270M's GGUF).

    .venv/bin/python bench/serve.py --url http://127.0.0.1:8000 --key pgd-... \\
        [--model smollm2] [--concurrency 8] [--requests 64] [--max-tokens 128] [--endpoint chat]

Time to first token runs from sending the request to the first content event. Inter-token
latency of a request is (last content event - first content event) / (output tokens - 1): the
server batches deltas (~20 ms), so gaps between events would overstate it. Any OpenAI-compatible
server works (bench/peers.py points it at llama.cpp's); without usage in the stream, output
tokens are counted as content events.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import statistics
import sys
import time
from dataclasses import dataclass, field

import httpx

ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclass
class Result:
    ttft: float
    itl: float | None
    output_tokens: int
    latency: float


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Events:
    """What a streamed chat completion's events said: when content came, how many tokens, its id."""

    first: float | None = None  # perf_counter() of the first content event
    last: float | None = None
    output_tokens: int = 0  # the usage chunk's count, else one per content event
    request_id: str = ""
    server_timing: dict[str, float] = field(default_factory=dict)  # Pagoda's phases, ms (its Server-Timing)


def server_timing(header: str) -> dict[str, float]:
    """``key;dur=2.9, admit;dur=0.3`` -> {"key": 2.9, "admit": 0.3} (entries without a duration skipped)."""
    phases = {}
    for entry in header.split(","):
        name, _, params = entry.strip().partition(";")
        for param in params.split(";"):
            field_name, _, value = param.strip().partition("=")
            if name and field_name == "dur":
                phases[name] = float(value)
    return phases


async def read_events(http: httpx.AsyncClient, url: str, body: dict, headers: dict | None = None,
                      path: str = "/v1/chat/completions") -> Events:
    """POST ``body`` to ``path`` (a chat or text completion, stream=true) and read its events to
    the end."""
    read = Events()
    num_content_events = 0
    async with http.stream("POST", f"{url}{path}", json=body, headers=headers) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread()).decode()[:300]}")
        read.server_timing = server_timing(response.headers.get("server-timing", ""))
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            read.request_id = event.get("id", read.request_id)
            if event.get("usage"):
                read.output_tokens = event["usage"]["completion_tokens"]
            choice = event["choices"][0] if event["choices"] else {}
            if choice.get("text") or choice.get("delta", {}).get("content"):
                read.last = time.perf_counter()
                read.first = read.first or read.last
                num_content_events += 1
    # a server that sends no usage (llama.cpp's, some versions) streams one event per token
    read.output_tokens = read.output_tokens or num_content_events
    if read.first is None:
        raise RuntimeError("the stream carried no content")
    return read


async def one_request(http: httpx.AsyncClient, args, prompt: str) -> Result:
    body = {"model": args.model, "temperature": 0, "max_tokens": args.max_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    if getattr(args, "endpoint", "chat") == "completions":
        body["prompt"], path = prompt, "/v1/completions"
    else:
        body["messages"], path = [{"role": "user", "content": prompt}], "/v1/chat/completions"
    start = time.perf_counter()
    read = await read_events(http, args.url, body, path=path)
    end = time.perf_counter()
    tokens = read.output_tokens
    itl = (read.last - read.first) / (tokens - 1) if tokens > 1 else None
    return Result(read.first - start, itl, tokens, end - start)


async def client_loop(http, args, prompts: list[str], queue: asyncio.Queue, results: list[Result]) -> None:
    while True:
        try:
            index = queue.get_nowait()
        except asyncio.QueueEmpty:
            return
        results.append(await one_request(http, args, prompts[index % len(prompts)]))


async def run(args) -> int:
    prompts = json.loads((ROOT / "bench" / "prompts.json").read_text())
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(args.requests):
        queue.put_nowait(i)
    results: list[Result] = []
    headers = {"Authorization": f"Bearer {args.key}"}
    # One connection per request: llama.cpp's server closes kept-alive connections after a few
    # requests, and a reused closed one fails the request (RemoteProtocolError).
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=0)
    async with httpx.AsyncClient(headers=headers, timeout=args.timeout, limits=limits) as http:
        if args.warmup:
            await one_request(http, args, prompts[0])
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(http, args, prompts, queue, results) for _ in range(args.concurrency)))
        elapsed = time.perf_counter() - start
    ttfts = [r.ttft for r in results]
    itls = [r.itl for r in results if r.itl is not None]
    tokens = sum(r.output_tokens for r in results)
    rows = [
        ("requests", f"{len(results)}"),
        ("concurrency", f"{args.concurrency}"),
        ("wall time (s)", f"{elapsed:.2f}"),
        ("requests/s", f"{len(results) / elapsed:.2f}"),
        ("output tokens/s", f"{tokens / elapsed:.1f}"),
        ("TTFT p50 (ms)", f"{1000 * percentile(ttfts, 50):.1f}"),
        ("TTFT p95 (ms)", f"{1000 * percentile(ttfts, 95):.1f}"),
        ("inter-token latency p50 (ms)", f"{1000 * percentile(itls, 50):.1f}"),
        ("inter-token latency p95 (ms)", f"{1000 * percentile(itls, 95):.1f}"),
        ("mean request latency (s)", f"{statistics.fmean(r.latency for r in results):.2f}"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"Pagoda serving benchmark: {args.model} at {args.url} ({args.endpoint}), max_tokens {args.max_tokens}")
    for name, value in rows:
        print(f"  {name:<{width}}  {value:>10}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--key", required=True, help="an API key (manage.py create_api_key)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--endpoint", choices=("chat", "completions"), default="chat",
                    help="chat: /v1/chat/completions with the prompt as a user turn; completions: "
                         "/v1/completions with the prompt as text (a model without a chat template)")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false")
    args = ap.parse_args()
    args.url = args.url.rstrip("/")
    if args.concurrency < 1 or args.requests < 1 or args.max_tokens < 1:
        ap.error("--concurrency, --requests and --max-tokens must be positive")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
