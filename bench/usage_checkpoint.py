"""What the usage record's lifecycle costs the database: the running record at admission, and the
checkpoints of running requests' token counts (webapp/usage/checkpoints.py).

Against a fresh SQLite file with the deployment's options (the embedded database), or against
DATABASE_URL when it is set (run it under ``python -m deploy.stack.postgres run --`` for a
throwaway PostgreSQL). Prints, in milliseconds:

- per request: one finished record written at the end (before) against a running record written
  at admission and ended in place (now);
- per checkpoint, with N requests running: one transaction updating the N records (what the
  checkpoint thread does every PAGODA_USAGE_CHECKPOINT_S), against N transactions of one update
  each (what a per-request checkpoint would cost), and the share of one interval the batched
  checkpoint holds the database.

    .venv/bin/python bench/usage_checkpoint.py [--requests 200] [--running 1,8,64,256] [--interval 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup() -> str:
    if not os.environ.get("DATABASE_URL"):
        os.environ["DATABASE_URL"] = f"sqlite:///{tempfile.mkdtemp(prefix='pagoda-bench-')}/db.sqlite3"
    os.environ["DJANGO_SETTINGS_MODULE"] = "webapp.config.settings.test"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from django.db import connection

    return connection.vendor


def per_request(n: int) -> tuple[float, float]:
    from webapp.registry.models import Model, ModelVersion
    from webapp.usage.models import UsageRecord
    from webapp.usage.services import usage_record_close, usage_record_create, usage_record_start

    model = Model.objects.create(slug=f"bench-{time.monotonic_ns()}")
    version = ModelVersion.objects.create(model=model, number=1, path="/nowhere", format="hf")
    end = dict(status="ok", latency=0.5, prompt_tokens=20, completion_tokens=100, cached_prompt_tokens=0,
               time_to_first_token=0.1, finish_reason="length", error_code="")
    started = time.perf_counter()
    for i in range(n):
        usage_record_create(request_id=f"once-{model.pk}-{i}", endpoint="completions", model=model,
                            model_name=model.slug, **end)
    once = (time.perf_counter() - started) / n
    started = time.perf_counter()
    for i in range(n):
        request_id = f"twice-{model.pk}-{i}"
        usage_record_start(request_id=request_id, endpoint="completions", started=time.monotonic(), model=model,
                           version=version, num_prompt_tokens=20)
        usage_record_close(request_id=request_id, fields=end)
    twice = (time.perf_counter() - started) / n
    UsageRecord.objects.filter(model=model).delete()
    return once * 1000, twice * 1000


def per_checkpoint(num_running: int, rounds: int) -> tuple[float, float]:
    from django.db import transaction

    from webapp.registry.models import Model, ModelVersion
    from webapp.usage.checkpoints import Checkpoints
    from webapp.usage.models import UsageRecord
    from webapp.usage.outcome import Outcome
    from webapp.usage.services import usage_record_start

    model = Model.objects.create(slug=f"bench-{time.monotonic_ns()}")
    version = ModelVersion.objects.create(model=model, number=1, path="/nowhere", format="hf")
    checkpoints, outcomes = Checkpoints(), {}
    for i in range(num_running):
        request_id = f"run-{model.pk}-{i}"
        usage_record_start(request_id=request_id, endpoint="completions", started=time.monotonic(), model=model,
                           version=version, num_prompt_tokens=20)
        outcomes[request_id] = Outcome()
        checkpoints.watch(request_id, outcomes[request_id], time.monotonic())
    batched, one_by_one = [], []
    for step in range(1, rounds + 1):
        for outcome in outcomes.values():
            outcome.choices[0].num_output_tokens = step * 10
        started = time.perf_counter()
        assert checkpoints.flush() == num_running
        batched.append(time.perf_counter() - started)
        started = time.perf_counter()
        for request_id in outcomes:
            with transaction.atomic():
                UsageRecord.objects.filter(request_id=request_id, status="running").update(completion_tokens=step)
        one_by_one.append(time.perf_counter() - started)
    UsageRecord.objects.filter(model=model).delete()
    return statistics.median(batched) * 1000, statistics.median(one_by_one) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--running", default="1,8,64,256")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--interval", type=float, default=5.0, help="PAGODA_USAGE_CHECKPOINT_S")
    args = parser.parse_args()
    vendor = setup()
    once, twice = per_request(args.requests)
    print(f"database: {vendor}\n")
    print("| usage writes per request | ms |\n|---|---|")
    print(f"| one record at the end (before) | {once:.2f} |\n| running at admission + ended in place (now) | {twice:.2f} |\n")
    print(f"| running requests | one checkpoint, one transaction (ms) | one transaction each (ms) "
          f"| share of a {args.interval:g} s interval |\n|---|---|---|---|")
    for num_running in (int(n) for n in args.running.split(",")):
        batched, one_by_one = per_checkpoint(num_running, args.rounds)
        print(f"| {num_running} | {batched:.2f} | {one_by_one:.2f} | {batched / (args.interval * 1000):.3%} |")


if __name__ == "__main__":
    main()
