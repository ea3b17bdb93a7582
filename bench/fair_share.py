"""Fair share across tenants through a real server: one user's flood against another's requests.

Starts Pagoda's embedded server as ``make run`` does (Daphne with the engine worker in the web
process, the bundled SmolLM2, a temporary folder with its own SQLite database) on 127.0.0.1, with
two users and an API key each, once per mode (``--modes off,on``: the engine setting fair_share,
through PAGODA_ENGINE_FAIR_SHARE; ``on@16`` also caps a step's decodes at 16,
max_num_decodes_per_step). On each server:

1. idle: user B sends ``--probes`` short requests one at a time: B's time to first token (TTFT);
2. user A floods: ``--flood`` streams, each sending its next request (``--flood-tokens`` tokens,
   EOS ignored) as soon as the last ends, for ``--cycles`` cycles of a window alone and a window
   while B sends its probes one at a time again (alternated, so that the machine's drift hits
   both alike);

and prints how many of B's requests under the flood were served and how many refused (the TTFTs
are the served ones'), B's TTFT p50/p95 idle and under the flood (target: at most 2x idle), the flood's
output tokens/s alone and while B is served (target: at least 0.9x), and where B's TTFT goes: the
engine's own TTFT for B (from B's usage records: queueing in the engine, prefill, the step it
shares), and the flood's inter-token time (the step time at the flood's batch). The flood's tokens
are counted in a window pro rata of each request's streaming time. The machine is shared and
noisy: only figures from one run compare. The queue deadline is raised to 600 s
(PAGODA_QUEUE_TIMEOUT_S), so that a request waiting behind the flood is measured, not refused.

    .venv/bin/python bench/fair_share.py [--modes off,on] [--flood 200] [--flood-tokens 64]
        [--probes 12] [--probe-tokens 8] [--window 30] [--cycles 2] [--warmup 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.machine import cpu_line  # noqa: E402
from serve import percentile, read_events  # noqa: E402
from serve_compare import PY, ROOT, Services, free_port, manage, prepare_workdir  # noqa: E402

PROMPTS = json.loads((ROOT / "bench" / "prompts.json").read_text())
PROBE_PROMPT = "Name a colour."
PROBE_GAP_S = 0.5  # B's pause between its requests: one at a time, not a second flood


@dataclass
class Stream:
    request_id: str
    sent: float
    first: float
    last: float
    tokens: int
    phases: dict[str, float]  # the server's Server-Timing (ms): where B's time went before its response began

    @property
    def ttft(self) -> float:
        return self.first - self.sent


async def stream(http: httpx.AsyncClient, url: str, key: str, prompt: str, max_tokens: int) -> Stream:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    read = await read_events(http, url, body, {"Authorization": f"Bearer {key}"})
    return Stream(read.request_id, sent, read.first, read.last, read.output_tokens, read.server_timing)


async def probes(http, url: str, key: str, count: int, max_tokens: int, failures: list[str],
                 client: ProbeProcess | None = None) -> list[Stream]:
    """B: ``count`` requests one at a time (a refused one goes to ``failures``), from its own
    process (``client``) or from this event loop."""
    done = []
    for _ in range(count):
        try:
            done.append(await (client.probe() if client else stream(http, url, key, PROBE_PROMPT, max_tokens)))
        except (RuntimeError, httpx.HTTPError) as exc:
            failures.append(str(exc)[:120])
        await asyncio.sleep(PROBE_GAP_S)
    return done


class ProbeProcess:
    """User B as a client of its own: this script in ``--as-probe`` mode, in a process of its own,
    sending one request per line it reads and answering with its ``Stream`` as JSON. Another tenant
    is another program (usually on another machine); a probe sent from the flood's own event loop
    also waits behind the flood's 200 streams being parsed in that loop, which is the client's
    delay, not the server's. ``--probe-client same`` keeps the in-loop probe for comparison."""

    def __init__(self, url: str, key: str, max_tokens: int):
        self.args = [PY, __file__, "--as-probe", url, key, str(max_tokens)]
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self):
        self.proc = await asyncio.create_subprocess_exec(*self.args, stdin=asyncio.subprocess.PIPE,
                                                         stdout=asyncio.subprocess.PIPE)
        return self

    async def __aexit__(self, *exc):
        self.proc.stdin.close()
        await self.proc.wait()

    async def probe(self) -> Stream:
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()
        answer = json.loads(await self.proc.stdout.readline())
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return Stream(**answer)


async def as_probe(url: str, key: str, max_tokens: int) -> None:
    """The probe process's loop: a request per line on stdin, its Stream (or error) as a JSON line."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        while await reader.readline():
            try:
                answer = vars(await stream(http, url, key, PROBE_PROMPT, max_tokens))
            except (RuntimeError, httpx.HTTPError) as exc:
                answer = {"error": str(exc)[:120]}
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()


async def loop_lag(stop: asyncio.Event, lags: list[float], period: float = 0.005) -> None:
    """How late this event loop runs a timer (the flood's client, parsing 200 streams' events)."""
    while not stop.is_set():
        due = time.perf_counter() + period
        await asyncio.sleep(period)
        lags.append(time.perf_counter() - due)


async def flood_stream(http, url: str, key: str, index: int, max_tokens: int, stop: asyncio.Event,
                       done: list[Stream], failures: list[str]) -> None:
    i = index
    while not stop.is_set():
        try:
            done.append(await stream(http, url, key, PROMPTS[i % len(PROMPTS)], max_tokens))
        except (RuntimeError, httpx.HTTPError) as exc:  # counted; the stream goes on after a pause
            failures.append(str(exc)[:120])
            await asyncio.sleep(1.0)
        i += 1


def failure_kinds(failures: list[str]) -> str:
    """``HTTP 503 x 9,000, HTTP 429 x 12``: what refused the requests, most first (bench/serve.py
    cuts a refusal's body at 300 characters, before its error code, so the status is what is read)."""
    kinds: dict[str, int] = {}
    for failure in failures:
        kind = failure.split(":", 1)[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(f"{kind} x {n:,}" for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1]))


def tokens_in(streams: list[Stream], start: float, end: float) -> float:
    """Output tokens produced in [start, end), each request's spread evenly over its streaming time."""
    total = 0.0
    for s in streams:
        span = s.last - s.first
        if span <= 0:
            total += s.tokens if start <= s.last < end else 0
            continue
        overlap = max(0.0, min(end, s.last) - max(start, s.first))
        total += s.tokens * overlap / span
    return total


def engine_ttfts(db: Path, request_ids: list[str]) -> list[float]:
    """What the engine measured for these requests (usage records: queue to first token)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(f"SELECT time_to_first_token FROM usage_usagerecord WHERE request_id IN "
                            f"({','.join('?' * len(request_ids))})", request_ids).fetchall()
    return [r[0] for r in rows if r[0] is not None]


async def measure(args, url: str, keys: dict[str, str], db: Path) -> dict:
    limits = httpx.Limits(max_connections=args.flood + 8, max_keepalive_connections=0)
    clients = {"own": "own", "same": "same", "both": "own,same"}[args.probe_client].split(",")
    async with httpx.AsyncClient(timeout=600, limits=limits) as http, \
            ProbeProcess(url, keys["b"], args.probe_tokens) as own:
        by = {"own": own, "same": None}
        b_failures, a_failures, idle, loaded = [], [], {c: [] for c in clients}, {c: [] for c in clients}
        for client in clients:
            await probes(http, url, keys["b"], 1, args.probe_tokens, [], by[client])  # warm-up
        for i in range(args.probes):  # one at a time, the clients taking turns
            idle[clients[i % len(clients)]] += await probes(http, url, keys["b"], 1, args.probe_tokens, b_failures,
                                                            by[clients[i % len(clients)]])

        stop, flood, lags = asyncio.Event(), [], []
        tasks = [asyncio.create_task(flood_stream(http, url, keys["a"], i, args.flood_tokens, stop, flood,
                                                  a_failures)) for i in range(args.flood)]
        tasks.append(asyncio.create_task(loop_lag(stop, lags)))
        await asyncio.sleep(args.warmup)
        alone_windows, shared_windows = [], []
        for _ in range(args.cycles):
            start = time.perf_counter()
            await asyncio.sleep(args.window)
            alone_windows.append((start, time.perf_counter()))
            start = time.perf_counter()
            deadline, i = start + args.window, 0
            while time.perf_counter() < deadline:
                client, i = clients[i % len(clients)], i + 1
                loaded[client] += await probes(http, url, keys["b"], 1, args.probe_tokens, b_failures, by[client])
            shared_windows.append((start, time.perf_counter()))
        stop.set()
        await asyncio.gather(*tasks)

    def rate(windows):
        return sum(tokens_in(flood, a, b) for a, b in windows) / sum(b - a for a, b in windows)

    itl = [(s.last - s.first) / (s.tokens - 1) for s in flood if s.tokens > 1]
    main = clients[0]
    return {
        "idle": [s.ttft for s in idle[main]], "loaded": [s.ttft for s in loaded[main]],
        "idle_same": [s.ttft for s in idle.get("same", [])] if main != "same" else [],
        "loaded_same": [s.ttft for s in loaded.get("same", [])] if main != "same" else [],
        "phases_idle": [s.phases for s in idle[main]], "phases_loaded": [s.phases for s in loaded[main]],
        "engine_idle": engine_ttfts(db, [s.request_id for s in idle[main]]),
        "engine_loaded": engine_ttfts(db, [s.request_id for s in loaded[main]]),
        "client_lag": lags,
        "alone_tok_s": rate(alone_windows), "shared_tok_s": rate(shared_windows),
        "flood_itl": itl, "flood_requests": len(flood), "b_failures": b_failures, "a_failures": a_failures,
    }


def run_mode(args, mode: str, root: Path, env: dict, keys: dict[str, str]) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # A deadline past any wait here: what is measured is how long B waits, not the default 30 s
    # queue deadline refusing it (which first come, first served reaches under this flood).
    fair, _, cap = mode.partition("@")
    extra = {"PAGODA_EMBEDDED_WORKERS": "1", "PAGODA_ENGINE_FAIR_SHARE": "true" if fair == "on" else "false",
             "PAGODA_QUEUE_TIMEOUT_S": "600"}
    if cap:  # the engine's max_num_decodes_per_step for this mode (0: no cap)
        extra["PAGODA_ENGINE_MAX_NUM_DECODES_PER_STEP"] = cap
    with Services(root, env) as services:
        services.spawn(f"daphne-{mode}", [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                          "webapp.config.asgi:application"], extra)
        services.wait_ready(url)
        return asyncio.run(measure(args, url, keys, root / "db.sqlite3"))


PHASES = ("django", "key", "admit", "prepare", "engine")  # webapp/openai_api/timing.py


def phase_ms(phases: list[dict[str, float]], name: str) -> str:
    values = [p[name] for p in phases if name in p]
    return f"{percentile(values, 50):8.1f}" if values else "       -"


def ms(values: list[float], q: float) -> str:
    return f"{1000 * percentile(values, q):8.0f}" if values else "       -"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="off,on",
                    help="fair_share off and/or on, in this order; on@N also sets max_num_decodes_per_step N")
    ap.add_argument("--flood", type=int, default=200, help="user A's concurrent streams")
    ap.add_argument("--flood-tokens", type=int, default=64)
    ap.add_argument("--probes", type=int, default=12, help="user B's requests on the idle server")
    ap.add_argument("--probe-tokens", type=int, default=8)
    ap.add_argument("--window", type=float, default=30.0, help="seconds of each measured window")
    ap.add_argument("--cycles", type=int, default=2, help="pairs of windows (flood alone, flood + B)")
    ap.add_argument("--warmup", type=float, default=40.0, help="seconds of flood before measuring")
    ap.add_argument("--probe-client", choices=("own", "same", "both"), default="own",
                    help="B's requests from a process of its own (own), from the flood's event loop (same), "
                         "or both in turns (the figures are own's; same's are printed below them)")
    ap.add_argument("--as-probe", nargs=3, metavar=("URL", "KEY", "TOKENS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.as_probe:
        url, key, tokens = args.as_probe
        asyncio.run(as_probe(url, key, int(tokens)))
        return 0
    modes = [m for m in args.modes.split(",") if m]
    if not modes or not all(re.fullmatch(r"(on|off)(@\d+)?", m) for m in modes):
        ap.error("--modes: a comma-separated list of on, off, on@N and off@N")
    if min(args.flood, args.flood_tokens, args.probes, args.probe_tokens, args.cycles) < 1:
        ap.error("counts must be positive")

    root, env, _ = prepare_workdir("pagoda-fair-share-")
    manage(env, "shell", "-c", "from django.contrib.auth import get_user_model; "
           "[get_user_model().objects.create_user(n) for n in ('flood', 'probe')]")
    keys = {"a": manage(env, "create_api_key", "--name", "flood", "--user", "flood").strip().splitlines()[-1],
            "b": manage(env, "create_api_key", "--name", "probe", "--user", "probe").strip().splitlines()[-1]}
    print(f"workdir {root}; user A: {args.flood} streams x {args.flood_tokens} tokens; user B: one request "
          f"at a time, {args.probe_tokens} tokens; {args.cycles} x ({args.window:.0f} s alone + "
          f"{args.window:.0f} s with B) after {args.warmup:.0f} s; load average {os.getloadavg()[0]:.1f}",
          flush=True)
    results = []  # per mode in order: a mode named twice (on,on@16,on,on@16) is run and shown twice
    for mode in modes:
        results.append(r := run_mode(args, mode, root, env, keys))
        print(f"fair_share {mode}: {len(r['loaded'])} B requests under the flood, {r['flood_requests']} flood "
              f"requests; refused or failed: B {len(r['b_failures'])}, flood {len(r['a_failures'])}"
              f"{' (' + failure_kinds(r['a_failures']) + ')' if r['a_failures'] else ''}"
              f"{'; B: ' + failure_kinds(r['b_failures']) if r['b_failures'] else ''}; load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)

    print(f"\nCPU: {cpu_line()}")
    print("\n                                   " + "".join(f"{' fair_share ' + m:>16}" for m in modes))
    rows = [
        ("B TTFT idle p50 / p95 (ms)", lambda r: f"{ms(r['idle'], 50)} /{ms(r['idle'], 95)}"),
        ("B requests under flood: served / refused", lambda r: f"{len(r['loaded']):8d} /{len(r['b_failures']):8d}"),
        ("B TTFT under flood p50 / p95 (ms)", lambda r: f"{ms(r['loaded'], 50)} /{ms(r['loaded'], 95)}"),
        ("  ratio p50 (target <= 2)", lambda r: f"{percentile(r['loaded'], 50) / percentile(r['idle'], 50):17.2f}"),
        ("B engine TTFT idle p50 (ms)", lambda r: f"{ms(r['engine_idle'], 50):>17}"),
        ("B engine TTFT under flood p50/p95", lambda r: f"{ms(r['engine_loaded'], 50)} /{ms(r['engine_loaded'], 95)}"),
        ("flood inter-token p50 (ms)", lambda r: f"{ms(r['flood_itl'], 50):>17}"),
        ("flood tok/s alone", lambda r: f"{r['alone_tok_s']:17.1f}"),
        ("flood tok/s while B is served", lambda r: f"{r['shared_tok_s']:17.1f}"),
        ("  ratio (target >= 0.9)", lambda r: f"{r['shared_tok_s'] / r['alone_tok_s']:17.2f}"),
        ("flood client's loop lag p50 / p95", lambda r: f"{ms(r['client_lag'], 50)} /{ms(r['client_lag'], 95)}"),
    ]
    for phase in PHASES:  # the server's own account of B's requests (Server-Timing), before its first token
        rows.append((f"B {phase} p50 idle / flooded (ms)",
                     lambda r, p=phase: f"{phase_ms(r['phases_idle'], p)} /{phase_ms(r['phases_loaded'], p)}"))
    if args.probe_client == "both":
        rows += [
            ("B in the flood's loop: idle p50", lambda r: f"{ms(r['idle_same'], 50):>17}"),
            ("  under flood p50 / p95", lambda r: f"{ms(r['loaded_same'], 50)} /{ms(r['loaded_same'], 95)}"),
            ("  ratio p50", lambda r: f"{percentile(r['loaded_same'], 50) / percentile(r['idle_same'], 50):17.2f}"),
        ]
    for name, cell in rows:
        print(f"{name:<35}" + "".join(f"{cell(r):>16}" for r in results))
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
