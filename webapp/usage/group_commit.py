"""Usage records of many concurrent requests written in one transaction (a group commit).

Why: a usage record is its own write transaction, and on SQLite (the embedded database) each one
holds the database's only write lock through its commit's fsyncs: about 15 ms on this machine's
disk. A burst of 1,000 refusals queued 1,000 of them behind that lock, one by one, so the last
refusal waited for everyone's commit. Here the records that arrive while a commit runs go into the
next one: ``save`` returns once its own record is committed, as ``record.save()`` would, so a
client that has its response can find the record its X-Request-Id names.

No thread or task of its own: the request that finds nobody writing writes everything queued, in
its own thread (``sync_to_async``, thread-sensitive: the request's connection, and in tests the
test's transaction). Every waiter stays until its record is written, cancelled or not (the
cancellation is raised afterwards), so a queued record always has a waiter to write it.
"""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import sync_to_async
from django.db import transaction

from webapp.usage.models import UsageRecord

logger = logging.getLogger(__name__)


def _write(records: list[UsageRecord]) -> list[Exception | None]:
    """Insert the records in one transaction; one that fails alone costs the others nothing."""
    try:
        with transaction.atomic():
            UsageRecord.objects.bulk_create(records)
        return [None] * len(records)
    except Exception:
        logger.warning("a group of %d usage records failed; writing them one by one", len(records), exc_info=True)
    outcome: list[Exception | None] = []
    for record in records:
        record.pk, record._state.adding = None, True
        try:
            record.save()
            outcome.append(None)
        except Exception as exc:
            outcome.append(exc)
    return outcome


class GroupCommit:
    def __init__(self) -> None:
        self._queued: list[tuple[UsageRecord, asyncio.Future]] = []
        self._writing: asyncio.Future | None = None  # done when the commit in progress ends

    async def save(self, record: UsageRecord) -> UsageRecord:
        """Insert ``record`` (validated, unsaved); returns it once committed, raises what its insert raised."""
        done = asyncio.get_running_loop().create_future()
        self._queued.append((record, done))
        cancelled = False
        while not done.done():
            try:
                if self._writing is None:
                    cancelled |= await self._write_queued()
                else:
                    await asyncio.shield(self._writing)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        if done.exception() is not None:
            raise done.exception()
        return record

    async def _write_queued(self) -> bool:
        """Commit everything queued; True if this task was cancelled meanwhile."""
        self._writing = asyncio.get_running_loop().create_future()
        group, self._queued = self._queued, []
        cancelled = False
        try:
            writing = asyncio.ensure_future(sync_to_async(_write)([record for record, _ in group]))
            while not writing.done():
                try:
                    await asyncio.shield(writing)
                except asyncio.CancelledError:
                    cancelled = True
            try:
                outcome = writing.result()
            except Exception as exc:
                outcome = [exc] * len(group)
            for (_, done), error in zip(group, outcome):
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)
        finally:
            for _, done in group:  # never left waiting, whatever happened above
                if not done.done():
                    done.set_exception(RuntimeError("the usage record was not written"))
            writing_done, self._writing = self._writing, None
            writing_done.set_result(None)
        return cancelled


_group_commit = GroupCommit()


async def usage_record_save(record: UsageRecord) -> UsageRecord:
    """Insert a validated, unsaved usage record from async code, in this process's next group commit."""
    return await _group_commit.save(record)
