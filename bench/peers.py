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

Long prompts (``--long``, default 512, 2,048 and 6,000 tokens; ``--long ''`` skips them): the
time to the first (and only) token of one text completion whose prompt is that many tokens of a
document (bench/prefill.py's keeper's log, tokenized by llama.cpp's own /tokenize so both servers
read the same ids), alternated between the servers ``--repeats`` times. Each repeat starts the
document at another token, so neither server's prefix cache holds any of it (Pagoda's answer
says how many tokens it found cached: 0). llama.cpp splits ``-c`` between its 32 slots (512
tokens each), so the long prompts go to a second llama-server with one slot of 8,192 tokens,
the model's context, started beside the first. This is the guard on the prefill path.

Grounded tasks (``--grounded``, default every task of bench/grounded_tasks.py; ``''`` skips them):
one stream, one chat request per task at a time, greedy, ``--grounded-tokens`` at most, against
Pagoda as ``make run`` starts it (speculative decoding by prompt lookup on), a second Pagoda with
``speculative_tokens: 0``, and llama.cpp's one-slot server; alternated ``--repeats`` times. Reports
each server's decode time per output token (first to last streamed token) and the speed-up of
speculation on its own server; the two Pagodas' answers must be the same text. With grounded tasks
the 1- and 32-stream runs time that second Pagoda too ("spec/no": speculation's ratio on
bench/serve.py's chat prompts, whose answers copy little of them).

    .venv/bin/python bench/peers.py [--model PATH.gguf] [--repeats 2] [--max-tokens 128]
        [--requests-1 4] [--requests-32 32] [--streams 1,32] [--long 512,2048,6000]
        [--grounded spelling,extract,edit,free-form] [--grounded-tokens 400]
"""

from __future__ import annotations

import argparse
import json
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
import httpx  # noqa: E402

from bench.machine import cpu_line, load_line  # noqa: E402
from bench.grounded_tasks import TASKS  # noqa: E402
from bench.prefill import document_text  # noqa: E402
from serve_compare import PY, ROOT, Services, free_port, prepare_workdir  # noqa: E402

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF"]
LONG_CONTEXT = 8192  # the long-prompt llama-server's one slot (SmolLM2's and Gemma 3 270M's context)
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


def tokenize(llama_url: str, text: str) -> list[int]:
    """``text``'s ids in the GGUF's vocabulary, as llama.cpp's server reads them (no BOS)."""
    response = httpx.post(f"{llama_url}/tokenize", json={"content": text, "add_special": False}, timeout=120)
    response.raise_for_status()
    return response.json()["tokens"]


def first_token_seconds(url: str, key: str, model: str, ids: list[int]) -> tuple[float, int, int]:
    """(seconds for a one-token completion of ``ids``, prompt tokens, cached prompt tokens)."""
    start = time.perf_counter()
    response = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {key}"},
                          json={"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0},
                          timeout=600)
    seconds = time.perf_counter() - start
    response.raise_for_status()
    usage = response.json()["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return seconds, usage["prompt_tokens"], cached


def long_prompts(servers: dict, lengths: list[int], repeats: int, model: str, document: list[int]) -> None:
    """Time to first token at each prompt length, alternated between the servers; medians and ratios."""
    seconds: dict[tuple[str, int], list[float]] = {}
    for repeat in range(repeats):
        for i, n in enumerate(lengths):
            offset = 101 * (repeat * len(lengths) + i)  # another first token each time: nothing cached
            ids = document[offset:offset + n]
            for name, (url, server_key) in servers.items():
                load = os.getloadavg()[0]
                took, prompt_tokens, cached = first_token_seconds(url, server_key, model, ids)
                seconds.setdefault((name, n), []).append(took)
                print(f"[{repeat + 1}/{repeats}] {name:<9} {n:>5} prompt tokens: {took:6.2f} s to the first "
                      f"token ({prompt_tokens} read, {cached} cached; load {load:.1f})", flush=True)
    print(f"\ntime to first token, median of {repeats} alternated runs")
    print(f"{'prompt tokens':>13}{'pagoda s':>10}{'llama.cpp s':>13}{'ratio P/L':>11}")
    for n in lengths:
        ours, theirs = (statistics.median(seconds[(name, n)]) for name in servers)
        print(f"{n:>13}{ours:>10.2f}{theirs:>13.2f}{ours / theirs:>11.2f}")


def stream_chat(url: str, key: str, model: str, prompt: str, max_tokens: int) -> tuple[float, int, str]:
    """(seconds from the first streamed token to the last, output tokens, the answer's text) of
    one greedy streamed chat completion."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    first = last = None
    events, text, usage = 0, [], None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600,
                      headers={"Authorization": f"Bearer {key}"}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if delta.get("content"):
                last = time.perf_counter()
                first = first or last
                events += 1
                text.append(delta["content"])
    tokens = (usage or {}).get("completion_tokens") or events
    return (last - first) if first else float("nan"), tokens, "".join(text)


def grounded(servers: dict, tasks: list[str], repeats: int, max_tokens: int, model: str) -> None:
    """One stream per task, alternated between the servers; medians of decode ms per output token."""
    ms: dict[tuple[str, str], list[float]] = {}
    answers: dict[tuple[str, str], str] = {}
    for repeat in range(repeats):
        order = list(servers.items()) if repeat % 2 == 0 else list(servers.items())[::-1]
        for task in tasks:
            for name, (url, server_key) in order:
                load = os.getloadavg()[0]
                seconds, tokens, text = stream_chat(url, server_key, model, TASKS[task], max_tokens)
                ms.setdefault((name, task), []).append(1000 * seconds / max(tokens - 1, 1))
                answers[(name, task)] = text
                print(f"[{repeat + 1}/{repeats}] {name:<14} {task:<10} {tokens:>4} tokens, "
                      f"{ms[(name, task)][-1]:6.2f} ms/token (load {load:.1f})", flush=True)
    print(f"\ngrounded tasks, one stream: decode ms per output token, median of {repeats} alternated runs")
    print(f"{'task':<10}{'pagoda':>9}{'no spec':>9}{'llama.cpp':>11}{'spec speed-up':>15}{'P/L':>7}  same answer")
    for task in tasks:
        on, off, peer = (statistics.median(ms[(name, task)]) for name in servers)
        same = answers[("pagoda", task)] == answers[("pagoda-no-spec", task)]
        print(f"{task:<10}{on:>9.2f}{off:>9.2f}{peer:>11.2f}{off / on:>14.2f}x{on / peer:>7.2f}  {same}")


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
                    help="which of the two workloads to run, comma-separated: 1, 32 or both ('' for none)")
    ap.add_argument("--long", default="512,2048,6000",
                    help=f"long-prompt lengths, comma-separated, each below {LONG_CONTEXT} ('' for none)")
    ap.add_argument("--grounded", default=",".join(TASKS),
                    help=f"grounded tasks, comma-separated, of {', '.join(TASKS)} ('' for none)")
    ap.add_argument("--grounded-tokens", type=int, default=400, help="most output tokens of a grounded task")
    args = ap.parse_args()
    tasks = [t for t in args.grounded.split(",") if t.strip()]
    if not set(tasks) <= TASKS.keys():
        ap.error(f"--grounded must list tasks of {', '.join(TASKS)}, not {args.grounded!r}")
    try:
        lengths = [int(n) for n in args.long.split(",") if n.strip()]
    except ValueError:
        lengths = [0]
    if not all(0 < n < LONG_CONTEXT for n in lengths):
        ap.error(f"--long must list prompt lengths between 1 and {LONG_CONTEXT - 1}, not {args.long!r}")
    try:
        streams = sorted({int(n) for n in args.streams.split(",") if n.strip()})
    except ValueError:
        streams = [0]
    if not set(streams) <= {1, 32} or not (streams or lengths or tasks):
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
        if tasks:  # the same server without speculation, for its speed-up
            nospec_port = free_port()
            services.spawn("pagoda-no-spec", [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(nospec_port),
                                              "webapp.config.asgi:application"],
                           {"PAGODA_EMBEDDED_WORKERS": "1", "PAGODA_ENGINE_NUM_KV_BLOCKS": "1024",
                            "PAGODA_ENGINE_MAX_NUM_SEQS": "32", "PAGODA_ENGINE_SPECULATIVE_TOKENS": "0"})
            wait_http(f"http://127.0.0.1:{nospec_port}/readyz", services)
        if lengths or tasks:  # one slot of the model's context for the long prompts (see the docstring)
            long_port = free_port()
            services.spawn("llama-server-long", [str(binary), "-m", str(gguf), "-np", "1", "-c", str(LONG_CONTEXT),
                                                 "-t", "2", "--host", "127.0.0.1", "--port", str(long_port)])
            wait_http(f"http://127.0.0.1:{long_port}/health", services)
        wait_http(f"http://127.0.0.1:{llama_port}/health", services)
        wait_http(f"http://127.0.0.1:{pagoda_port}/readyz", services)
        if tasks:  # the 1- and 32-stream runs time it too: speculation's cost where it cannot pay
            servers["pagoda-no-spec"] = (f"http://127.0.0.1:{nospec_port}", key, services.procs[2].pid)
        idle = {name: rss_mib(pid) for name, (_, _, pid) in servers.items()}
        results: dict[tuple[str, int], list[dict]] = {}
        for repeat in range(1, args.repeats + 1):
            for concurrency in streams:
                requests = args.requests_1 if concurrency == 1 else args.requests_32
                order = list(servers.items()) if repeat % 2 else list(servers.items())[::-1]
                for name, (url, server_key, pid) in order:  # alternated: neither always runs first
                    load = os.getloadavg()[0]
                    figures = run_client(url, server_key, concurrency, requests, args.max_tokens,
                                         slug, endpoint)
                    figures["RSS MiB"] = rss_mib(pid)
                    results.setdefault((name, concurrency), []).append(figures)
                    print(f"[{repeat}/{args.repeats}] {name:<9} x{concurrency:<2} "
                          + "  ".join(f"{k} {v:.1f}" for k, v in figures.items())
                          + f"  (load {load:.1f})", flush=True)
        if lengths:
            long_url = f"http://127.0.0.1:{long_port}"
            document = tokenize(long_url, document_text())
            long_prompts({"pagoda": servers["pagoda"][:2], "llama.cpp": (long_url, "none")}, lengths,
                         args.repeats, slug, document)

        if tasks:
            if endpoint != "chat":
                print("grounded tasks skipped: they are chat requests, and --model is served as text completions")
            else:
                grounded({"pagoda": servers["pagoda"][:2],
                          "pagoda-no-spec": (f"http://127.0.0.1:{nospec_port}", key),
                          "llama.cpp": (f"http://127.0.0.1:{long_port}", "none")},
                         tasks, args.repeats, args.grounded_tokens, slug)

    if not streams:
        shutil.rmtree(root, ignore_errors=True)
        return 0
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
        if "pagoda-no-spec" in med:
            print(f"{'spec/no x' + str(concurrency):<14}"
                  + "".join(f"{med['pagoda'][n] / med['pagoda-no-spec'][n]:>20.2f}" for n in names))
    print(f"at the end: {load_line()}")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
