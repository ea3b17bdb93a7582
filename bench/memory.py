"""Where the serving process's resident memory goes, idle and under load (bench/peers.py's setup).

Starts Pagoda's embedded server as bench/peers.py does (Daphne with the engine worker in the
web process; 32 sequences, a 16,384-token KV pool), in a temporary folder, then reads
/proc/PID/smaps and sums each mapping's resident memory into kinds: anonymous memory (malloc's
heap and arenas, torch's tensors, Python's objects), torch's and the other shared libraries'
file pages, the model file's pages, the rest. Measured idle, at the peak of bench/serve.py's
--concurrency streams (sampled every 0.2 s), and after them. Prints the engine's own start-up
memory line (weights, KV pool, workspace) beside it. ``--pid`` reads a running process instead.

    .venv/bin/python bench/memory.py [--concurrency 32] [--requests 32] [--max-tokens 128]
        [--repeats 1] [--pid PID]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_compare import PY, ROOT, Services, free_port, prepare_workdir  # noqa: E402

HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$")


def kind_of(path: str) -> str:
    if not path or path.startswith("[anon") or path == "[heap]":
        return "anonymous (heap, tensors)"
    if path.startswith("["):
        return "stack/vdso"
    if path.endswith(".gguf") or path.endswith(".safetensors"):
        return "model file"
    if "/torch/lib/" in path:
        return "torch libraries"
    if ".so" in path or "/python3" in path:
        return "other libraries"
    return "other files"


def breakdown(pid: int, kv_bytes: int = 0) -> Counter:
    """Resident KiB of ``pid`` by kind, plus 'anonymous' and 'total' over all mappings; with
    ``kv_bytes``, the anonymous mapping of that size (the CPU KV pool's own) counts apart."""
    sums: Counter = Counter()
    kind = "other files"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        header = HEADER.match(line)
        if header and not line.split(maxsplit=1)[0].endswith(":"):
            kind = kind_of(header.group(1).strip())
            start, end = (int(x, 16) for x in line.split(maxsplit=1)[0].split("-"))
            if kv_bytes and kind.startswith("anonymous") and 0 <= end - start - kv_bytes < 4096:
                kind = "KV pool (anonymous)"
        elif line.startswith("Rss:"):
            kib = int(line.split()[1])
            sums[kind] += kib
            sums["total"] += kib
        elif line.startswith("Anonymous:"):
            sums["anonymous"] += int(line.split()[1])
    return sums


def show(label: str, sums: Counter) -> None:
    print(f"{label}: total {sums['total'] / 1024:.0f} MiB (anonymous {sums['anonymous'] / 1024:.0f})", flush=True)
    for kind, kib in sorted(sums.items(), key=lambda kv: -kv[1]):
        if kind not in ("total", "anonymous"):
            print(f"  {kind:<28}{kib / 1024:8.1f} MiB")


def run_load(url: str, key: str, args, pid: int, kv_bytes: int) -> tuple[Counter, str]:
    peak: list[Counter] = [Counter()]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            sums = breakdown(pid, kv_bytes)
            if sums["total"] > peak[0]["total"]:
                peak[0] = sums
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result = subprocess.run([PY, "bench/serve.py", "--url", url, "--key", key, "--concurrency",
                             str(args.concurrency), "--requests", str(args.requests),
                             "--max-tokens", str(args.max_tokens)], cwd=ROOT, capture_output=True,
                            text=True)
    done.set()
    sampler.join()
    rate = re.search(r"output tokens/s\s+([0-9.]+)", result.stdout)
    return peak[0], rate.group(1) if rate else f"failed: {result.stderr.strip()[-200:]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--pid", type=int, help="only read this running process, once")
    args = ap.parse_args()
    if args.pid:
        show(f"pid {args.pid}", breakdown(args.pid))
        return 0

    root, env, key = prepare_workdir("pagoda-memory-")
    with Services(root, env) as services:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        services.spawn("pagoda", [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                  "webapp.config.asgi:application"],
                       {"PAGODA_EMBEDDED_WORKERS": "1", "PAGODA_ENGINE_NUM_KV_BLOCKS": "1024", "LOG_LEVEL": "INFO",
                        "PAGODA_ENGINE_MAX_NUM_SEQS": "32"})
        services.wait_ready(url)
        pid = services.procs[0].pid
        time.sleep(1.0)
        log = (root / "pagoda.log").read_text(errors="replace")
        kv_bytes = 0
        for line in log.splitlines():
            if "weights" in line and "KV" in line:
                print(line.strip()[-400:])
            pool = re.search(r"KV cache: (\d+) blocks x (\d+) tokens = \d+ tokens, ([0-9.]+) MiB", line)
            if pool:  # the pool's mapping: its MiB rounded in the log, so matched within a page
                kv_bytes = round(float(pool.group(3)) * 2**20 / 4096) * 4096
        show("idle", breakdown(pid, kv_bytes))
        for repeat in range(1, args.repeats + 1):
            peak, rate = run_load(url, key, args, pid, kv_bytes)
            show(f"[{repeat}/{args.repeats}] peak at {args.concurrency} streams ({rate} tok/s)", peak)
            time.sleep(1.0)
            show(f"[{repeat}/{args.repeats}] after the load", breakdown(pid, kv_bytes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
