"""A burst of concurrent streams: how many are served, how many shed, and how fast each side hears.

Sends ``--streams`` streamed completions (``--max-tokens`` tokens each, EOS ignored) at once, one
connection each, then prints how many completed (200 and the whole stream), how many were shed
(503 / 429) and anything else, with p50/p99/max of the refusals' answer time and of the completed
streams' time to their last byte; ``--alone N`` first times N streams sent together without the
burst (the yardstick for the admitted: what their tokens take).

    .venv/bin/python bench/shedding.py [--streams 1000] [--max-tokens 128] [--alone 128]
    .venv/bin/python bench/shedding.py --url http://127.0.0.1:8000 --key pgd-... [--model smollm2]

Without ``--url`` it starts Pagoda as ``make run`` does (Daphne with a listen backlog of 1,024, the
engine worker inside the web process, the bundled SmolLM2 as ``smollm2``) in a temporary folder,
and stops it afterwards. Load goes to 127.0.0.1 only.

The client writes each request on a bare non-blocking socket (``Connection: close``) and reads the
answer to its end in one selector loop: an HTTP library costs about a millisecond of CPU per
request, which on a 2-core machine would be counted as the server's. Times run from the request
written to its connected socket (the listen backlog holds it until the server accepts it), so the
client's own pace through 1,000 connects is not counted. tests/e2e/test_load_shedding.py uses the
same client.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import selectors
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.machine import cpu_line  # noqa: E402

SHED_STATUSES = (429, 503)


@dataclass
class Answer:
    status: int | str  # the HTTP status, or the name of the connection error
    answered_s: float  # from the request written to its socket to the end of the response's head
    done_s: float  # ... to its last byte
    headers: dict  # lower-case names
    body: str

    @property
    def completed(self) -> bool:
        return self.status == 200 and self.body.rstrip().endswith("data: [DONE]")


class _Exchange:
    """One request on its non-blocking socket: written, then read until the server closes."""

    def __init__(self, sock: socket.socket, request: bytes):
        self.sock, self.request, self.written = sock, request, 0
        self.sent_at: float | None = None
        self.answered_at: float | None = None
        self.received = bytearray()
        self.error: str | None = None

    def answer(self, now: float) -> Answer:
        started = self.sent_at if self.sent_at is not None else now
        if self.error is not None or self.answered_at is None:
            return Answer(self.error or "no answer", now - started, now - started, {}, "")
        head, _, rest = bytes(self.received).partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding") == "chunked":
            rest = _unchunk(rest)
        return Answer(int(status_line.split()[1]), self.answered_at - started, now - started, headers,
                      rest.decode(errors="replace"))


def exchange_all(host: str, port: int, requests: list[bytes], timeout_s: float) -> list[Answer]:
    """Send every request at once, each on its own connection, and read every answer to its end.

    A selector loop over bare non-blocking sockets: about 0.1 ms of CPU per connection (reading
    the answer included), a fraction of what an asyncio stream or an HTTP library costs, all of it
    on the same 2 cores as the server being measured."""
    selector = selectors.DefaultSelector()
    exchanges, done = [], {}
    for request in requests:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        exchange = _Exchange(sock, request)
        exchanges.append(exchange)
        if sock.connect_ex((host, port)) not in (0, errno.EINPROGRESS):
            exchange.error = "ConnectionRefusedError"
            done[id(exchange)] = exchange.answer(time.monotonic())
            sock.close()
            continue
        selector.register(sock, selectors.EVENT_WRITE, exchange)
    deadline = time.monotonic() + timeout_s
    while selector.get_map() and time.monotonic() < deadline:
        for key, events in selector.select(timeout=1.0):
            exchange: _Exchange = key.data
            try:
                if events & selectors.EVENT_WRITE:
                    exchange.written += exchange.sock.send(exchange.request[exchange.written:])
                    if exchange.written == len(exchange.request):
                        exchange.sent_at = time.monotonic()  # the kernel has it; the backlog holds it
                        selector.modify(exchange.sock, selectors.EVENT_READ, exchange)
                    continue
                data = exchange.sock.recv(1 << 16)
            except OSError as exc:
                exchange.error, data = type(exc).__name__, b""
            now = time.monotonic()
            if data:
                exchange.received += data
                if exchange.answered_at is None and b"\r\n\r\n" in exchange.received:
                    exchange.answered_at = now
                continue
            selector.unregister(exchange.sock)  # Connection: close: the answer ends with the connection
            exchange.sock.close()
            done[id(exchange)] = exchange.answer(now)
    now = time.monotonic()
    for key in list(selector.get_map().values()):
        key.data.error = "TimeoutError"
        selector.unregister(key.fileobj)
        key.fileobj.close()
        done[id(key.data)] = key.data.answer(now)
    selector.close()
    return [done[id(exchange)] for exchange in exchanges]


def _unchunk(data: bytes) -> bytes:
    out, at = bytearray(), 0
    while True:
        end = data.find(b"\r\n", at)
        if end < 0:
            return bytes(out)
        size = int(data[at:end].split(b";")[0] or b"0", 16)
        if size == 0:
            return bytes(out)
        out += data[end + 2:end + 2 + size]
        at = end + 2 + size + 2


def burst(url: str, key: str, *, model: str, streams: int, max_tokens: int,
          timeout_s: float = 600.0) -> list[Answer]:
    """``streams`` streamed completions sent at once to ``url`` (http://127.0.0.1:port)."""
    host, _, port = url.removeprefix("http://").rstrip("/").partition(":")
    requests = []
    for i in range(streams):
        payload = json.dumps({"model": model, "prompt": f"Burst {i}: once upon a time", "max_tokens": max_tokens,
                              "temperature": 0, "ignore_eos": True, "stream": True}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
        requests.append(head.encode() + payload)
    return exchange_all(host, int(port), requests, timeout_s)


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` of them at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else float("nan")


def figures(answers: list[Answer]) -> dict:
    completed = [a for a in answers if a.completed]
    shed = [a for a in answers if a.status in SHED_STATUSES]
    refusal = [a.done_s for a in shed]
    admitted = [a.done_s for a in completed]
    return {"streams": len(answers), "completed": len(completed), "shed": len(shed),
            "other": len(answers) - len(completed) - len(shed),
            "refusal_p50": percentile(refusal, 0.5), "refusal_p99": percentile(refusal, 0.99),
            "refusal_max": max(refusal, default=float("nan")),
            "admitted_p50": percentile(admitted, 0.5), "admitted_p99": percentile(admitted, 0.99),
            "admitted_max": max(admitted, default=float("nan"))}


def table(f: dict) -> str:
    return "\n".join([
        f"  streams      {f['streams']:>6}",
        f"  completed    {f['completed']:>6}",
        f"  shed         {f['shed']:>6}  (429/503)",
        f"  other        {f['other']:>6}",
        f"  refusals     p50 {f['refusal_p50']:7.3f} s   p99 {f['refusal_p99']:7.3f} s   max {f['refusal_max']:7.3f} s",
        f"  admitted     p50 {f['admitted_p50']:7.3f} s   p99 {f['admitted_p99']:7.3f} s   max {f['admitted_max']:7.3f} s"
        "  (to the stream's last byte)",
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running Pagoda (http://127.0.0.1:PORT); unset: start one as make run does")
    ap.add_argument("--key", help="an API key of that Pagoda (manage.py create_api_key)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=600.0, help="for the whole burst, seconds")
    ap.add_argument("--alone", type=int, default=0, metavar="N",
                    help="first time N streams sent together without the burst (say, the capacity)")
    args = ap.parse_args()
    if args.url and not args.key:
        ap.error("--url needs --key")
    print(f"CPU: {cpu_line()}", flush=True)
    if args.url:
        return report(args, args.url.rstrip("/"), args.key)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from serve_compare import PY, Services, free_port, prepare_workdir

    root, env, key = prepare_workdir("pagoda-shedding-")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        with Services(root, env) as services:
            services.spawn("daphne", [PY, "-m", "daphne", "-e", f"tcp:port={port}:interface=127.0.0.1:backlog=1024",
                                      "webapp.config.asgi:application"], {"PAGODA_EMBEDDED_WORKERS": "1"})
            services.wait_ready(url)
            return report(args, url, key)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(args, url: str, key: str) -> int:
    if args.alone:  # the yardstick: what the same tokens take without the burst
        burst(url, key, model=args.model, streams=1, max_tokens=8, timeout_s=args.timeout)  # warm-up
        alone = [a.done_s for a in burst(url, key, model=args.model, streams=args.alone, max_tokens=args.max_tokens,
                                         timeout_s=args.timeout) if a.completed]
        print(f"{args.alone} streams alone: {len(alone)} completed, p50 {percentile(alone, 0.5):.3f} s, "
              f"p99 {percentile(alone, 0.99):.3f} s (load average {os.getloadavg()[0]:.2f})")
        time.sleep(2)  # their places at the gate given back
    load = os.getloadavg()[0]
    started = time.monotonic()
    answers = burst(url, key, model=args.model, streams=args.streams, max_tokens=args.max_tokens,
                    timeout_s=args.timeout)
    took = time.monotonic() - started
    print(f"{args.streams} streams of {args.max_tokens} tokens at {url} ({args.model}): {took:.1f} s, "
          f"load average before {load:.2f}")
    print(table(figures(answers)))
    others = sorted({str(a.status) for a in answers if not a.completed and a.status not in SHED_STATUSES})
    if others:
        print(f"  other outcomes: {', '.join(others)}")
    codes: dict[str, list[float]] = {}
    for a in answers:
        if a.status in SHED_STATUSES:
            codes.setdefault(error_code(a), []).append(a.done_s)
    for code, seconds in sorted(codes.items()):
        print(f"  shed {code}: {len(seconds)}, p50 {percentile(seconds, 0.5):.3f} s, "
              f"p99 {percentile(seconds, 0.99):.3f} s")
    return 0


def error_code(answer: Answer) -> str:
    try:
        return json.loads(answer.body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
