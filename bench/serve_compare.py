"""Served vs offline throughput, side by side in one run: what the serving path costs.

Starts everything itself on loopback ports, in a temporary folder (its own SQLite database, the
bundled model registered as ``smollm2``, an API key), then alternates, ``--repeats`` times:

- offline, uncapped: ``python -m engine bench`` with all requests admitted at once;
- offline, capped: the same with ``--max-num-seqs`` = the client concurrency (what a served
  run at that concurrency can batch at most);
- embedded: Daphne with the engine worker in the web process (what ``make run`` starts),
  driven by bench/serve.py with ``--concurrency`` streaming clients;
- redis: redis-server + Daphne + ``manage.py run_engine_worker`` in its own process.

and prints each system's median output tokens/s and the served/offline ratios. The machine is
shared and noisy: only ratios from one run mean anything.

    .venv/bin/python bench/serve_compare.py [--concurrency 32] [--requests 64] [--max-tokens 128]
        [--repeats 2] [--systems offline,offline-capped,embedded,redis]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
SYSTEMS = ("offline", "offline-capped", "embedded", "redis")
START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Services:
    """Processes started for one measurement, stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, root: Path, env: dict):
        self.root, self.env, self.procs = root, env, []

    def spawn(self, name: str, args: list[str], extra_env: dict | None = None) -> None:
        log = open(self.root / f"{name}.log", "ab")
        self.procs.append(subprocess.Popen(args, cwd=ROOT, env={**self.env, **(extra_env or {})},
                                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def wait_ready(self, url: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if any(proc.poll() is not None for proc in self.procs):
                break
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.root.glob("*.log"))
        raise RuntimeError(f"Pagoda at {url} did not become ready:\n{logs}")


def manage(env: dict, *args: str) -> str:
    result = subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def prepare_workdir(prefix: str, model: tuple[str, Path] | None = None) -> tuple[Path, dict, str]:
    """A temporary folder with its own SQLite database, the bundled model registered (or
    ``model``, (slug, checkpoint path), registered and activated instead) and an API key:
    (folder, environment for manage.py / Daphne, key)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "webapp.config.settings.serve", "PAGODA_DATA_DIR": str(root),
           "DATABASE_URL": f"sqlite:///{root / 'db.sqlite3'}", "LOG_LEVEL": "WARNING"}
    env.pop("REDIS_URL", None)
    manage(env, "migrate", "--noinput")
    if model is None:
        manage(env, "ensure_bundled_model")
    else:
        manage(env, "register_model", model[0], str(model[1]))
    key = manage(env, "create_api_key", "--name", prefix.strip("-")).strip().splitlines()[-1]
    return root, env, key


def tokens_per_s(output: str, label: str) -> float:
    match = re.search(r"output tokens/s:?\s+([0-9.]+)", output)
    if match is None:
        raise RuntimeError(f"{label}: no 'output tokens/s' in its output:\n{output[-3000:]}")
    return float(match.group(1))


def run_offline(args, env: dict, max_num_seqs: int | None) -> float:
    command = [PY, "-m", "engine", "bench", "--prompts-file", "bench/prompts.json",
               "--num-prompts", str(args.requests), "--output-len", str(args.max_tokens)]
    if max_num_seqs is not None:
        command += ["--max-num-seqs", str(max_num_seqs)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    return tokens_per_s(result.stdout + result.stderr, "engine bench")


def run_client(args, url: str, key: str) -> float:
    result = subprocess.run([PY, "bench/serve.py", "--url", url, "--key", key, "--concurrency",
                             str(args.concurrency), "--requests", str(args.requests),
                             "--max-tokens", str(args.max_tokens)],
                            cwd=ROOT, capture_output=True, text=True)
    print(result.stdout.rstrip(), flush=True)
    if result.returncode != 0:
        raise RuntimeError(f"bench/serve.py failed:\n{result.stderr[-3000:]}")
    return tokens_per_s(result.stdout, "bench/serve.py")


def run_embedded(args, root: Path, env: dict, key: str) -> float:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with Services(root, env) as services:
        services.spawn("embedded-daphne", [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                           "webapp.config.asgi:application"],
                       {"PAGODA_EMBEDDED_WORKERS": "1"})
        services.wait_ready(url)
        return run_client(args, url, key)


def run_redis(args, root: Path, env: dict, key: str) -> float:
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        raise RuntimeError("redis-server is not installed (make system-deps)")
    port, redis_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**env, "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0"}
    with Services(root, env) as services:
        services.spawn("redis", [redis_server, "--port", str(redis_port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no"])
        services.spawn("worker", [PY, "manage.py", "run_engine_worker", "--model", "smollm2"])
        services.spawn("redis-daphne", [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                        "webapp.config.asgi:application"])
        services.wait_ready(url)
        return run_client(args, url, key)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help=f"comma-separated, from {', '.join(SYSTEMS)}")
    args = ap.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        ap.error(f"unknown system {unknown[0]!r}; choose from {', '.join(SYSTEMS)}")
    if min(args.concurrency, args.requests, args.max_tokens, args.repeats) < 1:
        ap.error("--concurrency, --requests, --max-tokens and --repeats must be positive")

    root, env, key = prepare_workdir("pagoda-serve-compare-")
    print(f"workdir {root}; {args.requests} requests x {args.max_tokens} tokens, "
          f"{args.concurrency} concurrent streams, {args.repeats} repeats", flush=True)

    runs = {
        "offline": lambda: run_offline(args, env, None),
        "offline-capped": lambda: run_offline(args, env, args.concurrency),
        "embedded": lambda: run_embedded(args, root, env, key),
        "redis": lambda: run_redis(args, root, env, key),
    }
    figures: dict[str, list[float]] = {s: [] for s in systems}
    for repeat in range(1, args.repeats + 1):
        for system in systems:
            load = os.getloadavg()[0]
            value = runs[system]()
            figures[system].append(value)
            print(f"[{repeat}/{args.repeats}] {system:<15} {value:7.1f} output tok/s  (load {load:.1f})",
                  flush=True)

    medians = {s: statistics.median(v) for s, v in figures.items()}
    print("\nsystem            median tok/s   runs")
    for system, median in medians.items():
        print(f"{system:<17} {median:12.1f}   {', '.join(f'{v:.1f}' for v in figures[system])}")
    for served in ("embedded", "redis"):
        for offline in ("offline", "offline-capped"):
            if served in medians and offline in medians:
                print(f"{served} / {offline}: {medians[served] / medians[offline]:.2f}")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
