"""A request that reaches a worker has its usage record from the moment it is sent there: written
``running`` by generation_prepare (API and batch lines) or turn_prepare (chat), naming this process,
and completed in place when it ends. Running records wait for their end before the daily roll-up
and the purge count them; one that began before midnight rolls its day up again when it ends."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone as dt_timezone

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from webapp.chat.services import turn_finish, turn_prepare
from webapp.keys.leases import process_id
from webapp.keys.models import TokenReservation
from webapp.keys.services import apikey_create
from webapp.openai_api.services import COMPLETIONS, generation_finish, generation_prepare, request_refused_record
from webapp.registry.models import Model, ModelVersion
from webapp.usage.models import UsageDaily, UsageRecord
from webapp.usage.outcome import Outcome
from webapp.usage.services import usage_purge, usage_record_create, usage_rollup_day
from workers.protocol import Chunk

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]


@pytest.fixture
def version(smollm2_tokenizer_dir, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    return ModelVersion.objects.create(model=Model.objects.create(slug="smol"), number=1, path=str(gguf),
                                       format="gguf", status="active", tokenizer_dir=str(smollm2_tokenizer_dir))


@pytest.fixture
def api_key(version):
    return apikey_create(owner=get_user_model().objects.create_user("alice"), name="k", token_budget=10_000)[0]


def prepared(api_key, request_id: str = "cmpl-1"):
    return generation_prepare(request_id=request_id, endpoint=COMPLETIONS, api_key=api_key, started=time.monotonic(),
                              values={"model": "smol", "prompt": "Once upon a time", "max_tokens": 8, "user": "eve"})


def ended(request_id: str, num_prompt_tokens: int, num_output_tokens: int) -> Outcome:
    outcome = Outcome()
    outcome.add(Chunk(request_id, "t" * num_output_tokens, [1] * num_output_tokens, None, True, "length",
                      num_prompt_tokens, num_output_tokens, 0, 0.01))
    return outcome


def test_an_api_request_is_recorded_running_when_sent_and_completed_in_the_same_row(api_key):
    gen = prepared(api_key)
    running = UsageRecord.objects.get(request_id="cmpl-1")
    reserved = (api_key.__class__.objects.get(pk=api_key.pk).tokens_reserved,
                TokenReservation.objects.filter(request_id="cmpl-1").count())

    generation_finish(generation=gen, outcome=ended("cmpl-1", len(gen.prompt_token_ids), 8))

    done = UsageRecord.objects.get(request_id="cmpl-1")
    api_key.refresh_from_db()
    assert (running.status, running.process_id, running.end_user) == ("running", process_id(), "eve")
    assert (running.prompt_tokens, running.completion_tokens) == (len(gen.prompt_token_ids), 0)
    assert reserved == (len(gen.prompt_token_ids) + 8, 1)
    assert done.pk == running.pk and UsageRecord.objects.count() == 1
    assert (done.status, done.completion_tokens, done.finish_reason, done.process_id) == ("ok", 8, "length", "")
    assert (api_key.tokens_used, api_key.tokens_reserved) == (len(gen.prompt_token_ids) + 8, 0)


def test_a_request_cancelled_between_its_running_record_and_the_engine_ends_that_record(api_key):
    """The client left while generation_prepare's thread finished: the view's refusal path ends the
    running record (nothing reached a worker) instead of writing a second one."""
    prepared(api_key, "cmpl-2")

    record = request_refused_record(request_id="cmpl-2", endpoint=COMPLETIONS, api_key=api_key,
                                    data={"model": "smol"}, error=None, started=time.monotonic())

    api_key.refresh_from_db()
    assert record is None
    assert list(UsageRecord.objects.values_list("status", "prompt_tokens", "completion_tokens")) == [("aborted", 0, 0)]
    assert (api_key.tokens_used, api_key.tokens_reserved, TokenReservation.objects.count()) == (0, 0, 0)


def test_a_chat_turn_is_recorded_running_and_charged_to_the_user_once_it_ends(version):
    user = get_user_model().objects.create_user("bob")
    turn = turn_prepare(user=user, data={"type": "send", "model": "smol", "content": "Hello"}, started=time.monotonic())
    running = UsageRecord.objects.get(request_id=turn.request_id)

    turn_finish(turn=turn, outcome=ended(turn.request_id, len(turn.prompt_token_ids), 4))

    done = UsageRecord.objects.get(request_id=turn.request_id)
    user.chat_limits.refresh_from_db()
    assert (running.status, running.user, running.api_key) == ("running", user, None)
    assert (done.pk, done.status, done.completion_tokens) == (running.pk, "ok", 4)
    assert user.chat_limits.tokens_used == len(turn.prompt_token_ids) + 4


def test_rollup_and_purge_wait_for_a_running_record_and_its_end_rolls_its_day_up_again(api_key, version):
    yesterday = timezone.now().date() - timedelta(days=1)
    late_evening = datetime.combine(yesterday, datetime.min.time(), tzinfo=dt_timezone.utc) + timedelta(hours=23)
    gen = prepared(api_key, "cmpl-3")
    usage_record_create(request_id="cmpl-4", endpoint=COMPLETIONS, status="ok", latency=0.1, api_key=api_key,
                        user=api_key.owner, model_name="smol", prompt_tokens=2, completion_tokens=3)
    UsageRecord.objects.update(created_at=late_evening)

    usage_rollup_day(day=yesterday)
    rolled_before = list(UsageDaily.objects.values_list("requests", "completion_tokens"))
    purged_before = usage_purge(older_than_days=1, today=yesterday + timedelta(days=3))
    generation_finish(generation=gen, outcome=ended("cmpl-3", len(gen.prompt_token_ids), 8))
    rolled_after = list(UsageDaily.objects.values_list("requests", "completion_tokens"))

    assert rolled_before == [(1, 3)]
    assert purged_before == 0  # a day with a request still running is not complete
    assert rolled_after == [(2, 11)]
    assert usage_purge(older_than_days=1, today=yesterday + timedelta(days=3)) == 2
