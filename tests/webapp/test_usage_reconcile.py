"""A request's usage record is written ``running`` as it goes to a worker and ended by whoever ends
it first: its own process, or the reconciler once that process is dead (webapp/usage/reconcile.py),
with the counts the worker reported. Either way the key's budget is charged once.

The dead process is a process id no lease holds: in embedded mode (the limit store in memory,
as here) every id but this process's is a run that ended. The worker's report goes through the
embedded broker the reconciler reads, written by a real MemoryWorkerTransport. The race of two
reconcilers runs on PostgreSQL behind a row lock (tests/postgres.py).
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from tests.postgres import run_behind_row_lock
from webapp.keys.enforcement import limits_admit, limits_reserve
from webapp.keys.leases import process_id
from webapp.keys.models import ApiKey, TokenReservation
from webapp.keys.services import apikey_create
from webapp.registry.models import Model, ModelVersion
from webapp.usage.checkpoints import Checkpoints
from webapp.usage.models import UsageRecord
from webapp.usage.outcome import Outcome
from webapp.usage.reconcile import WEB_PROCESS_LOST, usage_reconcile, usage_record_close_lost
from webapp.usage.services import usage_record_finish, usage_record_start
from workers.memory_transport import MemoryWorkerTransport, default_broker
from workers.protocol import Chunk, Reply, WorkerInfo

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]

MODEL = "tiny-reconcile"
DEAD = "gone-host-4242-deadbeef"  # a web process that no longer runs
PROMPT, WORST, BUDGET = 5, 60, 1000


@pytest.fixture
def version(tmp_path):
    model = Model.objects.create(slug=MODEL)
    return ModelVersion.objects.create(model=model, number=1, path=str(tmp_path), format="hf", status="active")


@pytest.fixture
def api_key():
    return apikey_create(owner=get_user_model().objects.create_user(f"u-{uuid.uuid4().hex[:8]}"), name="k",
                         token_budget=BUDGET)[0]


@pytest.fixture
def worker():
    """A worker of MODEL in the embedded broker (the one the reconciler asks), gone after the test."""
    transport = MemoryWorkerTransport(default_broker(), MODEL, f"worker-{uuid.uuid4().hex[:6]}")
    transport.heartbeat(WorkerInfo(transport.worker_id, MODEL, "1", "host", 1, time.time(), time.time(), 4, 512))
    yield transport
    transport.unregister()


def admitted(api_key: ApiKey, version: ModelVersion, *, process: str = DEAD, age_s: float = 120) -> str:
    """A request admitted as the API admits one (slot, worst case reserved, running record) by
    ``process``, ``age_s`` seconds ago."""
    request_id = f"cmpl-{uuid.uuid4().hex}"
    limits_admit(subject=api_key, request_id=request_id)
    limits_reserve(subject=api_key, request_id=request_id, tokens=WORST)
    usage_record_start(request_id=request_id, endpoint="completions", started=time.monotonic(), model=version.model,
                       version=version, num_prompt_tokens=PROMPT, api_key=api_key, user=api_key.owner)
    UsageRecord.objects.filter(request_id=request_id).update(
        process_id=process, created_at=timezone.now() - timedelta(seconds=age_s))
    TokenReservation.objects.filter(request_id=request_id).update(process_id=process)
    return request_id


def chunk(request_id: str, num_output_tokens: int, finish_reason: str | None = None) -> Chunk:
    return Chunk(request_id, "t" * num_output_tokens, [1] * num_output_tokens, None, finish_reason is not None,
                 finish_reason, PROMPT, num_output_tokens, 2, 0.05)


def send(worker, *chunks: Chunk) -> None:
    worker.exchange([(f"memory:{c.request_id}", Reply("chunk", worker.worker_id, c)) for c in chunks], 0, 0.0)


def record(request_id: str) -> UsageRecord:
    return UsageRecord.objects.get(request_id=request_id)


def charged(api_key: ApiKey) -> tuple[int, int, int]:
    """(tokens_used, tokens_reserved, reservation rows) of the key, as the database has them."""
    api_key.refresh_from_db()
    return api_key.tokens_used, api_key.tokens_reserved, TokenReservation.objects.filter(api_key=api_key).count()


def test_a_running_record_of_a_dead_process_ends_with_its_workers_counts_charged_once(api_key, version, worker):
    request_id = admitted(api_key, version)
    send(worker, chunk(request_id, 3), chunk(request_id, 40, "length"))  # more than the client ever saw
    before = charged(api_key)

    closed = usage_reconcile()
    again = usage_reconcile()

    ended = record(request_id)
    assert (closed, again) == (1, 0)
    assert before == (0, WORST, 1)
    assert (ended.status, ended.error_code, ended.finish_reason) == ("error", WEB_PROCESS_LOST, "length")
    assert (ended.prompt_tokens, ended.completion_tokens, ended.cached_prompt_tokens) == (PROMPT, 40, 2)
    assert ended.process_id == "" and ended.time_to_first_token == 0.05
    assert charged(api_key) == (PROMPT + 40, 0, 0)


def test_a_request_its_worker_still_runs_for_nobody_is_aborted_then_ended_from_its_last_chunk(api_key, version,
                                                                                            worker):
    request_id = admitted(api_key, version)
    send(worker, chunk(request_id, 7))

    first_pass = usage_reconcile()
    still = record(request_id).status
    aborts = worker.poll_aborts()
    send(worker, chunk(request_id, 9, "abort"))  # the worker's answer to the abort
    second_pass = usage_reconcile()

    assert (first_pass, still, aborts) == (0, "running", [request_id])
    assert second_pass == 1
    assert (record(request_id).completion_tokens, record(request_id).finish_reason) == (9, "abort")
    assert charged(api_key) == (PROMPT + 9, 0, 0)


def test_a_list_of_prompts_is_ended_from_its_prompts_reports_summed_and_its_running_prompt_aborted(
        api_key, version, worker):
    request_id = admitted(api_key, version)  # a completion of three prompts: engine requests <id>-0 .. -2
    send(worker, chunk(f"{request_id}-0", 4, "length"), chunk(f"{request_id}-1", 6, "stop"), chunk(f"{request_id}-2", 2))

    first_pass = usage_reconcile()
    aborts = worker.poll_aborts()
    send(worker, chunk(f"{request_id}-2", 3, "abort"))
    second_pass = usage_reconcile()

    assert (first_pass, aborts) == (0, [request_id, f"{request_id}-2"])
    assert second_pass == 1
    ended = record(request_id)
    assert (ended.prompt_tokens, ended.completion_tokens, ended.cached_prompt_tokens) == (3 * PROMPT, 13, 6)
    assert charged(api_key) == (3 * PROMPT + 13, 0, 0)


def test_without_a_report_the_record_keeps_its_admitted_prompt_and_checkpointed_tokens(api_key, version, worker):
    """Embedded mode after a crash: the worker died with the process and reported nothing; the
    record holds what the process's last checkpoint wrote."""
    request_id = admitted(api_key, version, process=process_id())  # running here, for now
    outcome, checkpoints = Outcome(), Checkpoints()
    checkpoints.watch(request_id, outcome, time.monotonic() - 2.0)
    outcome.add(chunk(request_id, 11))
    written = checkpoints.flush()
    unchanged = checkpoints.flush()
    UsageRecord.objects.filter(request_id=request_id).update(process_id=DEAD)  # then the process died

    closed = usage_reconcile()

    ended = record(request_id)
    assert (written, unchanged, closed) == (1, 0, 1)
    assert (ended.status, ended.error_code, ended.prompt_tokens, ended.completion_tokens) == \
        ("error", WEB_PROCESS_LOST, PROMPT, 11)
    assert ended.latency >= 2.0
    assert charged(api_key) == (PROMPT + 11, 0, 0)
    assert worker.poll_aborts() == [request_id]  # in case a worker has not taken it yet


def test_live_young_and_ended_records_are_left_alone(api_key, version, worker):
    live = admitted(api_key, version, process=process_id())
    young = admitted(api_key, version, age_s=1)  # its process renewed its lease as it wrote it
    ended = admitted(api_key, version)
    UsageRecord.objects.filter(request_id=ended).update(status="ok", completion_tokens=3)
    for request_id in (live, young, ended):
        send(worker, chunk(request_id, 30, "length"))

    assert usage_reconcile() == 0
    assert [record(r).status for r in (live, young, ended)] == ["running", "running", "ok"]
    assert record(ended).completion_tokens == 3
    assert charged(api_key) == (0, 3 * WORST, 3)


def test_a_record_ended_meanwhile_is_not_ended_or_charged_again(api_key, version, worker):
    """A reconciler that read the record as running before another ended it changes nothing."""
    request_id = admitted(api_key, version)
    stale = record(request_id)
    send(worker, chunk(request_id, 20, "length"))
    assert usage_reconcile() == 1

    assert usage_record_close_lost(record=stale, report=None) is False
    assert record(request_id).completion_tokens == 20
    assert charged(api_key) == (PROMPT + 20, 0, 0)


def test_a_process_that_ends_its_request_after_the_reconciler_did_charges_nothing_more(api_key, version, worker):
    request_id = admitted(api_key, version)
    send(worker, chunk(request_id, 20, "length"))
    usage_reconcile()
    outcome = Outcome()
    outcome.add(chunk(request_id, 20, "length"))

    result = usage_record_finish(request_id=request_id, endpoint="completions", started=time.monotonic(),
                                 outcome=outcome, model=version.model, version=version, num_prompt_tokens=PROMPT,
                                 api_key=api_key, user=api_key.owner)

    assert (result.status, result.error_code) == ("error", WEB_PROCESS_LOST)
    assert UsageRecord.objects.filter(request_id=request_id).count() == 1
    assert charged(api_key) == (PROMPT + 20, 0, 0)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_reconcilers_end_a_record_once_and_charge_it_once(api_key, version, worker):
    request_id = admitted(api_key, version)
    send(worker, chunk(request_id, 25, "length"))

    results = run_behind_row_lock(UsageRecord._meta.db_table, record(request_id).pk, 4, lambda i: usage_reconcile())

    assert sorted(results) == [0, 0, 0, 1], results
    assert record(request_id).completion_tokens == 25
    assert charged(api_key) == (PROMPT + 25, 0, 0)


def test_beat_runs_the_reconciler_every_interval_by_task_name(api_key, version, worker, settings):
    """The entry celery beat (and embedded mode's in-process beat, which reads the same schedule) runs."""
    from webapp.config.embedded_jobs import _celery_app, _entries

    request_id = admitted(api_key, version)
    send(worker, chunk(request_id, 4, "length"))
    entry = next(e for e in _entries(_celery_app(), settings.CELERY_BEAT_SCHEDULE) if e.task.name == "usage.reconcile")

    closed = entry.task.apply(args=entry.args, kwargs=entry.kwargs, throw=True).get()

    assert entry.schedule.run_every.total_seconds() == settings.PAGODA_USAGE_RECONCILE_INTERVAL_S
    assert closed == 1 and record(request_id).status == "error"
