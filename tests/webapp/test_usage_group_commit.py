"""Usage records saved together (webapp.usage.group_commit): concurrent requests' records go into
shared transactions, each save returns once its own record is in the database, a record that
cannot be written fails alone, and a cancelled waiter's record is still written."""

import asyncio

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.db import IntegrityError

from webapp.usage.group_commit import usage_record_save
from webapp.usage.models import UsageRecord
from webapp.usage.services import usage_record_build

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.db_engine]


def record(request_id: str, **fields) -> UsageRecord:
    return usage_record_build(request_id=request_id, endpoint="completions", status="error", latency=0.1,
                              error_code="server_overloaded", **fields)


def test_records_saved_at_once_are_all_in_the_database_when_each_save_returns():
    async def burst():
        async def one(n):
            saved = await usage_record_save(record(f"r{n}"))
            assert saved.pk is not None  # its own record is committed when its save returns
            return await UsageRecord.objects.filter(request_id=f"r{n}").aexists()
        return await asyncio.gather(*[one(n) for n in range(40)])

    assert all(async_to_sync(burst)())
    assert UsageRecord.objects.count() == 40


def test_a_record_that_cannot_be_written_fails_alone():
    gone = get_user_model().objects.create_user("gone", password="x" * 12)
    gone_record = record("bad")
    gone_record.user_id = gone.pk  # a user deleted before the write: the foreign key fails
    gone.delete()

    async def burst():
        return await asyncio.gather(*[usage_record_save(record(f"ok{n}")) for n in range(10)],
                                    usage_record_save(gone_record), return_exceptions=True)

    results = async_to_sync(burst)()
    assert isinstance(results[-1], IntegrityError)
    assert not any(isinstance(r, BaseException) for r in results[:-1])
    assert sorted(UsageRecord.objects.values_list("request_id", flat=True)) == sorted(f"ok{n}" for n in range(10))


def test_a_cancelled_save_still_writes_its_record_then_raises_the_cancellation():
    async def cancel_one():
        writing = asyncio.ensure_future(usage_record_save(record("first")))
        await asyncio.sleep(0)  # "first" is being written
        waiter = asyncio.ensure_future(usage_record_save(record("cancelled")))
        await asyncio.sleep(0)  # "cancelled" waits for the next commit, and nobody else will ask for one
        waiter.cancel()
        await writing
        with pytest.raises(asyncio.CancelledError):
            await waiter

    async_to_sync(cancel_one)()
    assert sorted(UsageRecord.objects.values_list("request_id", flat=True)) == ["cancelled", "first"]
