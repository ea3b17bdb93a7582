"""Ending the usage records of requests whose web process died (SIGKILL, out of memory, a lost host).

A request's record is written ``running`` before it goes to a worker, naming its process
(usage_record_start); the process completes it when the request ends, or its shutdown drain does.
A process killed outright does neither. ``usage_reconcile`` (the Celery beat task usage.reconcile,
every PAGODA_USAGE_RECONCILE_INTERVAL_S; embedded mode's in-process beat runs it too) finds the
running records whose process is dead (webapp.keys.leases: its lease lapsed, confirmed twice) and
ends them: status ``error``, error code ``web_process_lost``, the tokens charged to the key or chat
user once, and its reservation and slot given back.

The counts are the worker's (workers.protocol.UsageReport, kept by the transport, not by the dead
process; a completion's list of prompts sums its prompts' engine requests' reports): what it generated, which may be more than the client received. A request a worker
still runs for nobody is aborted first, and ended at a later pass from the report of its last
chunk. Without a report (embedded mode, where the worker died with the process; or the request
never reached a worker), the record's own counts stand: the prompt as tokenized at admission,
and the tokens the process streamed up to its last checkpoint (webapp/usage/checkpoints.py).

Two reconcilers at once (two beats, a slow run overlapping the next) end each record once: the
end is a conditional UPDATE (``status = 'running'``) in the transaction that charges it.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from webapp.keys.limits import LimitStoreUnavailable, get_limit_store
from webapp.keys.models import ChatLimits
from webapp.openai_api.serializers import MAX_PROMPTS
from webapp.usage.models import CHAT_REQUEST_PREFIX, UsageRecord
from webapp.usage.services import usage_record_close
from workers.connect import get_engine_client
from workers.protocol import UsageReport

logger = logging.getLogger(__name__)
WEB_PROCESS_LOST = "web_process_lost"


def _subject(record: UsageRecord):
    """Whose limits the request ran under: its API key, or its user's chat limits for a chat turn."""
    if record.api_key_id is not None:
        return record.api_key
    if record.user_id is not None and record.request_id.startswith(CHAT_REQUEST_PREFIX):
        return ChatLimits.objects.filter(user_id=record.user_id).first()
    return None


def _fields(record: UsageRecord, report: UsageReport | None) -> dict:
    """The ended record: the worker's counts when it reported any (never below the record's own)."""
    fields = dict(status=UsageRecord.Status.ERROR, error_code=WEB_PROCESS_LOST, latency=record.latency,
                  prompt_tokens=record.prompt_tokens, completion_tokens=record.completion_tokens,
                  cached_prompt_tokens=record.cached_prompt_tokens,
                  time_to_first_token=record.time_to_first_token, finish_reason="")
    if report is None:
        return fields
    return {**fields, "prompt_tokens": max(record.prompt_tokens, report.num_prompt_tokens),
            "completion_tokens": max(record.completion_tokens, report.num_output_tokens),
            "cached_prompt_tokens": max(record.cached_prompt_tokens, report.num_cached_tokens),
            "time_to_first_token": report.time_to_first_token or record.time_to_first_token,
            "latency": max(record.latency, report.reported_at - record.created_at.timestamp()),
            "finish_reason": (report.finish_reason or "") if report.finished else ""}


def usage_record_close_lost(*, record: UsageRecord, report: UsageReport | None) -> bool:
    """End one running record whose process died; False if it had ended meanwhile."""
    fields = _fields(record, report)
    closed = usage_record_close(request_id=record.request_id, fields=fields, subject=_subject(record))
    if closed:
        logger.warning("request %s: its web process %s died; usage closed as %s with %d + %d tokens (%s)",
                       record.request_id, record.process_id or "?", WEB_PROCESS_LOST, fields["prompt_tokens"],
                       fields["completion_tokens"], "as its worker reported" if report else "as last recorded here",
                       extra={"request_id": record.request_id})
    return closed


def _engine_ids(record: UsageRecord) -> list[str]:
    """The engine requests a record may stand for: its own, and a completion's list of prompts'
    (webapp/openai_api/prompts.py: ``<id>-<prompt index>``)."""
    if record.endpoint != UsageRecord.Endpoint.COMPLETIONS:
        return [record.request_id]
    return [record.request_id, *(f"{record.request_id}-{index}" for index in range(MAX_PROMPTS))]


def _summed(request_id: str, parts: list[UsageReport]) -> UsageReport | None:
    """One report of a request's engine requests' reports: counts summed, finished when all are."""
    if len(parts) <= 1:
        return parts[0] if parts else None
    running = [p for p in parts if not p.finished]
    times = [p.time_to_first_token for p in parts if p.time_to_first_token is not None]
    return UsageReport(request_id=request_id, worker_id=(running or parts)[0].worker_id, model=parts[0].model,
                       num_prompt_tokens=sum(p.num_prompt_tokens for p in parts),
                       num_output_tokens=sum(p.num_output_tokens for p in parts),
                       num_cached_tokens=sum(p.num_cached_tokens for p in parts),
                       time_to_first_token=min(times) if times else None, finished=not running,
                       finish_reason=parts[-1].finish_reason, reported_at=max(p.reported_at for p in parts),
                       error_code=next((p.error_code for p in parts if p.error_code), None))


def _lost_records() -> list[UsageRecord]:
    """Running records whose process is dead. Those younger than a lease cannot be: their process
    renewed its lease as it wrote them."""
    younger = timezone.now() - timedelta(seconds=settings.PAGODA_LEASE_TTL_S)
    running = list(UsageRecord.objects.filter(status=UsageRecord.Status.RUNNING, created_at__lt=younger)
                   .select_related("api_key", "model"))
    if not running:
        return []
    gone = get_limit_store().processes_gone({r.process_id for r in running})
    return [r for r in running if r.process_id in gone]


def usage_reconcile() -> int:
    """End the running records of dead processes; returns how many. The limit store unreachable,
    nobody can be called dead: nothing is done until the next pass."""
    try:
        lost = _lost_records()
    except LimitStoreUnavailable as exc:
        logger.warning("usage reconciler: cannot tell which web processes are alive: %s", exc)
        return 0
    if not lost:
        return 0
    client = get_engine_client(settings.REDIS_URL)
    reports = client.usage_reports([i for r in lost for i in _engine_ids(r)])
    live = {w.worker_id for w in client.live_workers()}
    closed = 0
    for record in lost:
        parts = [reports[i] for i in _engine_ids(record) if i in reports]
        report = _summed(record.request_id, parts)
        model = record.model.slug if record.model is not None else record.model_name
        if report is None or not report.finished:
            # Nobody reads its answer any more: stop it, or keep a worker that has not taken it yet from starting it.
            client.abort_now(model, [record.request_id] + [p.request_id for p in parts
                                                           if not p.finished and p.request_id != record.request_id])
        if report is not None and not report.finished and report.worker_id in live:
            continue  # its last chunk, with the final counts, comes with the abort
        closed += usage_record_close_lost(record=record, report=report)
    return closed
