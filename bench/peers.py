"""Pagoda against llama.cpp's own server on the same GGUF, side by side in one run.

Builds llama.cpp's ``llama-server`` from the ``llama-cpp-python`` sdist on PyPI into a cache
folder once ($PAGODA_CACHE, default ~/.cache/pagoda; cmake, target llama-server; natively, or without
ggml's AMX kernels on a CPU with AMX, where they faulted: NO_AMX_FLAGS), starts it with
the bundled SmolLM2 GGUF, or ``--model PATH.gguf`` (``-np 32 -c 16384 -t 2``), starts Pagoda's
embedded server with the same file as
``make run`` does (Daphne with the engine worker in the web process, in a temporary folder with
its own SQLite database and API key), both on 127.0.0.1 only. Then alternates bench/serve.py
against each at 1 and at 32 concurrent streams (greedy, --max-tokens tokens, ignore_eos; chat
completions for the bundled model, text completions for ``--model``, which may be a base model
without a chat template),
``--repeats`` times, and prints each figure's median (output tok/s, TTFT p50, inter-token p50,
the server's resident memory) and the Pagoda/llama.cpp ratios, with the load average and the
CPU's model and flags. The machine is shared and noisy: only ratios from one run mean anything.

    .venv/bin/python bench/peers.py [--model PATH.gguf] [--repeats 2] [--max-tokens 128]
        [--requests-1 4] [--requests-32 32] [--streams 1,32]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.machine import cpu_line  # noqa: E402
from serve_compare import PY, ROOT, Services, free_port, prepare_workdir  # noqa: E402

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF"]
FIGURES = (("tok/s", r"output tokens/s\s+([0-9.]+)"),
           ("TTFT p50 ms", r"TTFT p50 \(ms\)\s+([0-9.]+)"),
           ("inter-token p50 ms", r"inter-token latency p50 \(ms\)\s+([0-9.]+)"))


def cache_dir() -> Path:
    return Path(os.environ.get("PAGODA_CACHE") or Path.home() / ".cache" / "pagoda")


# llama.cpp's native build on a CPU with AMX compiles ggml's AMX kernels, which died at their first
# ldtilecfg (general protection fault, then illegal instruction) on this project's Xeon VM with
# amx_tile/amx_int8/amx_bf16 (0.3.36; AMX itself works there once a process asks the kernel for it).
# There the peer is built for the same ISA minus AMX: every AVX-512 extension ggml has an option for.
NO_AMX_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_BMI2=ON", "-DGGML_FMA=ON",
                "-DGGML_F16C=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON",
                "-DGGML_AVX512_BF16=ON", "-DGGML_AVX_VNNI=ON"]


def llama_server_binary() -> Path:
    """The cached llama-server, built from the sdist the first time (10-25 minutes on 2 cores):
    native, or without AMX where the CPU has it (see NO_AMX_FLAGS)."""
    name, version = LLAMA_CPP_PYTHON.split("==")
    source = cache_dir() / f"{name.replace('-', '_')}-{version}" / "vendor" / "llama.cpp"
    from engine.kernels.cpu.cpu_info import cpu_flags
    build, flags = ("build-noamx", NO_AMX_FLAGS) if "amx_tile" in cpu_flags() else ("build", [])
    binary = source / build / "bin" / "llama-server"
    if binary.is_file():
        return binary
    cache_dir().mkdir(parents=True, exist_ok=True)
    if not source.is_dir():
        subprocess.run([PY, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        LLAMA_CPP_PYTHON, "-d", str(cache_dir())], check=True)
        sdist = next(cache_dir().glob(f"{name.replace('-', '_')}-{version}.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(cache_dir(), filter="data")
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "-B", build, *CMAKE_FLAGS, *flags], cwd=source, check=True)
    subprocess.run(["cmake", "--build", build, "-j", jobs, "--target", "llama-server"],
                   cwd=source, check=True)
    return binary


def wait_http(url: str, services: Services, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(proc.poll() is not None for proc in services.procs):
            break
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer 200; logs in {services.root}")


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and its children (the server's whole process tree)."""
    total = 0
    pids = [pid]
    while pids:
        p = pids.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
            pids += [int(c) for t in Path(f"/proc/{p}/task").iterdir()
                     for c in (t / "children").read_text().split()]
        except (OSError, AttributeError):
            pass
    return total / 1024


def run_client(url: str, key: str, concurrency: int, requests: int, max_tokens: int,
               model: str = "smollm2", endpoint: str = "chat") -> dict:
    result = subprocess.run([PY, "bench/serve.py", "--url", url, "--key", key, "--concurrency",
                             str(concurrency), "--requests", str(requests), "--max-tokens",
                             str(max_tokens), "--model", model, "--endpoint", endpoint],
                            cwd=ROOT, capture_output=True, text=True)
    figures = {}
    if result.returncode != 0:  # reported, and the run's figures left out of the medians
        last = result.stderr.strip().splitlines()[-1:] or ["?"]
        print(f"  bench/serve.py against {url} failed: {last[0][:300]}", flush=True)
        return {name: float("nan") for name, _ in FIGURES}
    for name, pattern in FIGURES:
        match = re.search(pattern, result.stdout)
        figures[name] = float(match.group(1)) if match else float("nan")
    return figures


def _median(values: list[float]) -> float:
    """Median of the runs that succeeded (NaN when none did)."""
    ok = [v for v in values if v == v]
    return statistics.median(ok) if ok else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None,
                    help="a GGUF file both servers load (default: the bundled SmolLM2), served "
                         "through /v1/completions")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--requests-1", type=int, default=4, help="requests of the single stream")
    ap.add_argument("--requests-32", type=int, default=32, help="requests of the 32 streams")
    ap.add_argument("--streams", default="1,32",
                    help="which of the two workloads to run, comma-separated: 1, 32 or both")
    args = ap.parse_args()
    try:
        streams = sorted({int(n) for n in args.streams.split(",")})
    except ValueError:
        streams = []
    if not streams or not set(streams) <= {1, 32}:
        ap.error(f"--streams must list 1 and/or 32, not {args.streams!r}")
    if min(args.repeats, args.max_tokens, args.requests_1, args.requests_32) < 1:
        ap.error("every count must be positive")

    if args.model is not None and not args.model.is_file():
        ap.error(f"--model {args.model}: no such file")
    from engine.bundled import bundled_model_path
    gguf = args.model.resolve() if args.model else bundled_model_path("smollm2")
    slug, endpoint = ("peer-model", "completions") if args.model else ("smollm2", "chat")
    binary = llama_server_binary()
    root, env, key = prepare_workdir("pagoda-peers-", (slug, gguf) if args.model else None)
    print(f"{cpu_line()}\n{gguf.name} ({endpoint}); {args.max_tokens} tokens per request; "
          f"llama.cpp {binary.parent.parent.name}; workdir {root}", flush=True)

    with Services(root, env) as services:
        llama_port, pagoda_port = free_port(), free_port()
        services.spawn("llama-server", [str(binary), "-m", str(gguf), "-np", "32", "-c", "16384",
                                        "-t", "2", "--host", "127.0.0.1", "--port", str(llama_port)])
        # The same capacity as llama.cpp's: 32 sequences, a 16,384-token KV pool (1,024 blocks of
        # 16), through pagoda.yaml's environment overrides (Pagoda's own default pool is sized for
        # 128 sequences of the full context, capped by a share of the machine's memory).
        services.spawn("pagoda", [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(pagoda_port),
                                  "webapp.config.asgi:application"],
                       {"PAGODA_EMBEDDED_WORKERS": "1", "PAGODA_ENGINE_NUM_KV_BLOCKS": "1024",
                        "PAGODA_ENGINE_MAX_NUM_SEQS": "32"})
        servers = {"pagoda": (f"http://127.0.0.1:{pagoda_port}", key, services.procs[1].pid),
                   "llama.cpp": (f"http://127.0.0.1:{llama_port}", "none", services.procs[0].pid)}
        wait_http(f"http://127.0.0.1:{llama_port}/health", services)
        wait_http(f"http://127.0.0.1:{pagoda_port}/readyz", services)
        idle = {name: rss_mib(pid) for name, (_, _, pid) in servers.items()}
        results: dict[tuple[str, int], list[dict]] = {}
        for repeat in range(1, args.repeats + 1):
            for concurrency in streams:
                requests = args.requests_1 if concurrency == 1 else args.requests_32
                for name, (url, server_key, pid) in servers.items():
                    load = os.getloadavg()[0]
                    figures = run_client(url, server_key, concurrency, requests, args.max_tokens,
                                         slug, endpoint)
                    figures["RSS MiB"] = rss_mib(pid)
                    results.setdefault((name, concurrency), []).append(figures)
                    print(f"[{repeat}/{args.repeats}] {name:<9} x{concurrency:<2} "
                          + "  ".join(f"{k} {v:.1f}" for k, v in figures.items())
                          + f"  (load {load:.1f})", flush=True)

    print(f"\nmedians of {args.repeats} alternated runs; idle RSS: "
          + ", ".join(f"{n} {v:.0f} MiB" for n, v in idle.items()))
    names = [name for name, _ in FIGURES] + ["RSS MiB"]
    print(f"{'':<14}" + "".join(f"{n:>20}" for n in names))
    for concurrency in streams:
        med = {server: {n: _median([r[n] for r in results[(server, concurrency)]]) for n in names}
               for server in servers}
        for server in servers:
            print(f"{server + ' x' + str(concurrency):<14}" + "".join(f"{med[server][n]:>20.1f}" for n in names))
        print(f"{'ratio P/L x' + str(concurrency):<14}"
              + "".join(f"{med['pagoda'][n] / med['llama.cpp'][n]:>20.2f}" for n in names))
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
