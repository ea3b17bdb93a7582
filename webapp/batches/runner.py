"""Running one batch: claim it, validate its lines, run them a few at a time, write its files.

A runner claims its batch (``runner_id`` + a heartbeat): a second runner for the same batch (a
redelivered Celery task, a resume) leaves it alone while the beat is fresh, and takes over when it
is older than PAGODA_BATCH_STALE_S. Each line's state is saved as it changes, so a runner that
dies leaves lines pending (run later), running (sent again: its first try never finished, so it
never wrote its result) or done (kept). A line is tried at most PAGODA_BATCH_MAX_ATTEMPTS times.

At most PAGODA_BATCH_MAX_IN_FLIGHT lines are in the engine at once, and only
PAGODA_BATCH_MAX_IN_FLIGHT_BUSY (default 0) while the model's workers hold other requests than the
batch's: lines over it are preempted (aborted, queued again, the attempt not counted), so that
interactive requests get the engine's steps to themselves and a batch fills idle capacity; a batch
held off with no line running for PAGODA_BATCH_MAX_STARVATION_S gets one line in anyway (share.py).
The engine's scheduler knows no better than that: under its default FCFS policy a running sequence is
never set aside for a newer one, whatever its priority (BATCH_PRIORITY orders the queue only under
the "priority" policy).
A line that ends wakes the runner at once (its future's callback puts it on a queue), which
records it and sends the next line; the heartbeat tick only bounds how long the runner waits for
news of the batch (a cancel) and of the workers while no line ends.
Cancelling (status cancelling) aborts the running lines and ends the batch cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import uuid
from concurrent import futures

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from webapp.batches import execution
from webapp.batches.conf import batch_setting
from webapp.batches.finalize import batch_finalize
from webapp.batches.lines import LineError, read_lines
from webapp.batches.models import Batch, BatchLine
from webapp.batches.share import Allowance, Share
from webapp.config.shutdown import shutting_down
from webapp.keys.selectors import apikey_allows_model
from webapp.registry.selectors import modelversion_get_active
from workers.connect import get_engine_client
from workers.transport import is_serving

logger = logging.getLogger(__name__)


def batch_claim(*, batch_id: int, runner_id: str, force: bool = False) -> bool:
    """Take the batch for ``runner_id`` unless another runner's beat is fresh (``force``: take it anyway)."""
    now = timezone.now()
    claimable = Batch.objects.filter(pk=batch_id, status__in=Batch.UNFINISHED)
    if not force:
        stale = now - timezone.timedelta(seconds=batch_setting("PAGODA_BATCH_STALE_S"))
        claimable = claimable.filter(Q(runner_id="") | Q(heartbeat_at__lt=stale) | Q(heartbeat_at__isnull=True))
    return bool(Batch.objects.filter(pk__in=claimable.values("pk")).update(runner_id=runner_id, heartbeat_at=now))


def batch_validate(*, batch: Batch) -> bool:
    """Turn the input file into line rows (status in_progress); False when the batch failed instead."""
    error = None
    try:
        if batch.input_file is None:
            raise LineError(1, None, f"the input file {batch.input_file_public_id} was deleted")
        with batch.input_file.content.open("rb") as handle:
            lines = read_lines(handle.read(), max_lines=batch_setting("PAGODA_BATCH_MAX_LINES"))
        bad_url = next((line for line in lines if line.url != batch.endpoint), None)
        if bad_url is not None:
            raise LineError(bad_url.line_number, "url", f"must be the batch's endpoint {batch.endpoint}")
        slug = lines[0].body.get("model")
        version = modelversion_get_active(slug=slug)
        if version is None or batch.api_key is None or not apikey_allows_model(api_key=batch.api_key,
                                                                               model=version.model):
            error = {"code": "model_not_found", "message": f"The model {slug!r} does not exist or you do not "
                     "have access to it.", "param": "body.model", "line": lines[0].line_number}
    except LineError as exc:
        error = exc.to_batch_error()
    now = timezone.now()
    if error is not None:
        Batch.objects.filter(pk=batch.pk).update(status=Batch.Status.FAILED, failed_at=now, errors=[error])
        return False
    with transaction.atomic():
        if not batch.lines.exists():
            BatchLine.objects.bulk_create([BatchLine(batch=batch, line_number=line.line_number, custom_id=line.custom_id,
                                                     url=line.url, body=line.body) for line in lines], batch_size=500)
        Batch.objects.filter(pk=batch.pk).update(num_total=len(lines), model_name=slug)
        Batch.objects.filter(pk=batch.pk, status=Batch.Status.VALIDATING).update(status=Batch.Status.IN_PROGRESS,
                                                                                 in_progress_at=now)
    return True


class Runner:
    def __init__(self, batch: Batch, runner_id: str):
        self.batch, self.runner_id = batch, runner_id
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(target=self.loop.run_forever, name=f"pagoda-batch-{batch.public_id}",
                                            daemon=True)
        self.in_flight: dict[futures.Future, execution.Running] = {}
        self.ended: queue.SimpleQueue[futures.Future] = queue.SimpleQueue()  # in flight, done: to finish
        self.not_before: dict[int, float] = {}  # line pk -> monotonic time of its next try
        self.last_beat = 0.0
        self.share = Share(max_in_flight=batch_setting("PAGODA_BATCH_MAX_IN_FLIGHT"),
                           max_in_flight_busy=batch_setting("PAGODA_BATCH_MAX_IN_FLIGHT_BUSY"),
                           max_starvation_s=batch_setting("PAGODA_BATCH_MAX_STARVATION_S"))

    # ------------------------------------------------------------ the loop
    def run(self) -> None:
        self.loop_thread.start()
        try:
            while True:
                status = self.beat()
                if status is None:  # another runner took over
                    return
                if status == Batch.Status.CANCELLING or timezone.now() >= self.batch.expires_at:
                    self.abort_all()
                    break
                if shutting_down():  # leave the rest to the next start (resume.py)
                    self.wait_all()
                    Batch.objects.filter(pk=self.batch.pk, runner_id=self.runner_id).update(runner_id="")
                    return
                allowance = self.allowance()
                self.preempt(allowance.max_lines)
                self.fill(allowance)
                if not self.in_flight and not self.has_pending():
                    break
                self.wait(batch_setting("PAGODA_BATCH_HEARTBEAT_S") / 2)
            batch_finalize(batch=Batch.objects.get(pk=self.batch.pk))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.loop_thread.join(10)
            self.loop.close()

    def beat(self) -> str | None:
        """Refresh the claim (every PAGODA_BATCH_HEARTBEAT_S) and return the batch's status."""
        now = time.monotonic()
        if now - self.last_beat >= batch_setting("PAGODA_BATCH_HEARTBEAT_S"):
            if not Batch.objects.filter(pk=self.batch.pk, runner_id=self.runner_id).update(heartbeat_at=timezone.now()):
                logger.warning("batch %s: claim lost, stopping", self.batch.public_id)
                self.abort_all()
                return None
            self.last_beat = now
        return Batch.objects.filter(pk=self.batch.pk).values_list("status", flat=True).first()

    def allowance(self) -> Allowance:
        workers = [w for w in get_engine_client(settings.REDIS_URL).live_workers(self.batch.model_name)
                   if is_serving(w)]
        return self.share.allowance(workers)  # no worker yet (a restart) or any more: 0, wait for one

    def preempt(self, limit: int) -> None:
        """Over the limit (interactive requests arrived): the newest lines are aborted and queued
        again; their attempt does not count, the tokens they used are recorded (usage, aborted). A
        line let in for the batch's minimum share runs on."""
        kept = sum(r.is_minimum_share for r in self.in_flight.values())
        preemptible = [r for r in self.in_flight.values() if not r.is_minimum_share]
        for running in preemptible[max(limit - kept, 0):]:
            if not running.cancelled.is_set():
                running.preempted = True
                running.cancelled.set()
                if running.task is not None:
                    self.loop.call_soon_threadsafe(running.task.cancel)

    def has_pending(self) -> bool:
        return self.batch.lines.filter(status__in=[BatchLine.Status.PENDING, BatchLine.Status.RUNNING]
                                       ).exclude(pk__in=[r.line.pk for r in self.in_flight.values()]).exists()

    def fill(self, allowance: Allowance) -> None:
        room = allowance.max_lines - len(self.in_flight)
        if room <= 0:
            return
        now = time.monotonic()
        busy = [r.line.pk for r in self.in_flight.values()]
        candidates = (self.batch.lines.filter(status__in=[BatchLine.Status.PENDING, BatchLine.Status.RUNNING])
                      .exclude(pk__in=busy).order_by("line_number"))
        for line in candidates[:room + len(self.not_before)]:
            if room <= 0:
                break
            if self.not_before.get(line.pk, 0) > now:
                continue
            can_retry = line.num_attempts + 1 < batch_setting("PAGODA_BATCH_MAX_ATTEMPTS")
            started = execution.line_start(line=line, api_key=self.batch.api_key, can_retry=can_retry)
            if isinstance(started, execution.Ended):
                if started.retry_after is not None and started.uncounted:
                    line.num_attempts -= 1
                    line.save(update_fields=["num_attempts"])
                self.record(line, started)
                continue
            started.is_minimum_share = allowance.is_minimum_share
            self.share.record(len(self.in_flight) + 1)  # before the worker can count it
            future = asyncio.run_coroutine_threadsafe(execution.collect(started), self.loop)
            self.in_flight[future] = started
            future.add_done_callback(self.ended.put)
            room -= 1

    def wait(self, timeout: float) -> None:
        """Until a line ends (then finish it and any others that ended with it) or ``timeout`` passes."""
        try:
            future = self.ended.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            self.finish(future)
            try:
                future = self.ended.get_nowait()
            except queue.Empty:
                return

    def finish(self, future: futures.Future) -> None:
        running = self.in_flight.pop(future)
        self.share.record(len(self.in_flight))
        failure = future.exception()
        aborted = failure is None and future.result()
        can_retry = running.line.num_attempts < batch_setting("PAGODA_BATCH_MAX_ATTEMPTS") and not aborted
        ended = execution.line_finish(running=running, aborted=aborted, failure=failure, can_retry=can_retry)
        if (running.preempted and aborted) or ended.retry_after is not None and ended.uncounted:
            running.line.num_attempts -= 1
            running.line.save(update_fields=["num_attempts"])
            ended = execution.Ended(retry_after=0.0)
        self.record(running.line, ended)

    def record(self, line: BatchLine, ended: execution.Ended) -> None:
        if ended.retry_after is not None:
            line.status = BatchLine.Status.PENDING
            line.save(update_fields=["status"])
            self.not_before[line.pk] = time.monotonic() + ended.retry_after
            return
        self.not_before.pop(line.pk, None)
        line.status = BatchLine.Status.COMPLETED if ended.ok else BatchLine.Status.FAILED
        line.result = ended.result
        with transaction.atomic():
            line.save(update_fields=["status", "result"])
            Batch.objects.filter(pk=self.batch.pk).update(
                num_completed=F("num_completed") + int(ended.ok), num_failed=F("num_failed") + int(not ended.ok),
                input_tokens=F("input_tokens") + ended.prompt_tokens,
                output_tokens=F("output_tokens") + ended.completion_tokens,
                cached_tokens=F("cached_tokens") + ended.cached_tokens)

    def abort_all(self) -> None:
        """Cancel every running line (each aborted in the engine, its usage recorded as aborted)."""
        for running in self.in_flight.values():
            running.cancelled.set()
            if running.task is not None:
                self.loop.call_soon_threadsafe(running.task.cancel)
        self.wait_all()

    def wait_all(self) -> None:
        while self.in_flight:
            self.wait(1.0)


def batch_run(*, batch_id: int, force: bool = False) -> str:
    """Run the batch to its end (or until cancelled, taken over or the server stops); returns its status."""
    runner_id = uuid.uuid4().hex
    if not batch_claim(batch_id=batch_id, runner_id=runner_id, force=force):
        return "held"
    batch = Batch.objects.select_related("api_key", "input_file").get(pk=batch_id)
    needs_lines = batch.status == Batch.Status.VALIDATING or (batch.status == Batch.Status.CANCELLING
                                                              and not batch.lines.exists())
    if needs_lines and not batch_validate(batch=batch):  # cancelled while validating: its lines are listed too
        return Batch.Status.FAILED
    batch.refresh_from_db()
    if batch.status == Batch.Status.FINALIZING:
        batch_finalize(batch=batch)
    elif batch.status in Batch.UNFINISHED:
        Runner(batch, runner_id).run()
    return Batch.objects.filter(pk=batch_id).values_list("status", flat=True).first()
