"""Per-key limits: each answers 429 with an OpenAI error body (and Retry-After when waiting helps).

The API tests (N requests sent at once among them: the check-then-increment race) run against a
real embedded worker serving the tiny Llama, so the tokens charged to a key are the ones the
engine counted. The store arithmetic is checked on both stores: the
in-process one (embedded mode) and Redis (distributed mode).
"""

import asyncio
import json
import math
import time

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import AsyncClient

from webapp.keys import enforcement
from webapp.keys.enforcement import (LimitExceeded, apikey_admit, apikey_release, apikey_reserve,
                                     apikey_running_requests, limits_admit)
from webapp.keys.limits import MemoryLimitStore, RedisLimitStore, get_limit_store
from webapp.keys.models import ApiKey, TokenReservation
from webapp.keys.services import apikey_create
from webapp.registry.models import Model, ModelVersion
from webapp.usage.models import UsageRecord
from workers import embedded

pytestmark = pytest.mark.db_engine

MODEL = "tiny-limits"
TINY_SETTINGS = {"num_kv_blocks": 64, "max_model_len": 512, "max_num_seqs": 8}
MINUTE = 1_700_000_040.0  # the start of a calendar minute (divisible by 60)


@pytest.fixture(scope="module")
def worker(tiny_llama_dir):
    embedded.start_embedded_worker(MODEL, "1", str(tiny_llama_dir), TINY_SETTINGS)
    assert embedded.wait_for_embedded_worker(MODEL, timeout=60)
    yield
    embedded.stop_embedded_workers(drain_timeout=5)


@pytest.fixture
def served(worker, tiny_llama_dir, db):
    model = Model.objects.create(slug=MODEL)
    ModelVersion.objects.create(model=model, number=1, path=str(tiny_llama_dir), format="hf", status="active",
                                tokenizer_dir=str(tiny_llama_dir))
    return model


@pytest.fixture
def make_key(db):
    owner = get_user_model().objects.create_user("limited")

    def make(**limits):
        api_key, raw = apikey_create(owner=owner, name="limited", **limits)
        return api_key, raw
    return make


def complete(client, raw_key, max_tokens=4):
    body = {"model": MODEL, "prompt": "Hello there", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    return client.post("/v1/completions", data=json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {raw_key}")


def assert_429(response, code, error_type):
    assert response.status_code == 429, response.content
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == error_type and error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_requests_per_minute_limit_answers_429_with_retry_after(client, served, make_key):
    _, raw = make_key(max_requests_per_minute=2)

    statuses = [complete(client, raw).status_code for _ in range(2)]
    refused = complete(client, raw)

    assert statuses == [200, 200]
    assert_429(refused, "rate_limit_exceeded", "rate_limit_exceeded")
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert UsageRecord.objects.filter(error_code="rate_limit_exceeded").count() == 1


def test_tokens_per_minute_reserve_the_worst_case_and_say_when_it_fits(client, served, make_key):
    api_key, raw = make_key(max_tokens_per_minute=50)

    started = time.time()
    first = complete(client, raw, max_tokens=16)
    worst = first.json()["usage"]["total_tokens"]  # ignore_eos: the worst case is what it used
    second = complete(client, raw, max_tokens=16)
    refused = complete(client, raw, max_tokens=16)  # 3 x worst > 50

    assert first.status_code == second.status_code == 200 and 2 * worst <= 50 < 3 * worst
    assert get_limit_store().window_total(f"{api_key.key_hash[:24]}:tokens", time.time()) == 2 * worst
    assert_429(refused, "rate_limit_exceeded", "rate_limit_exceeded")
    # Honest: when the first request (admitted after `started`) leaves the window.
    assert 60 - (time.time() - started) - 1 <= int(refused["Retry-After"]) <= 60


def test_a_request_larger_than_the_tokens_per_minute_limit_is_refused_without_retry_after(client, served,
                                                                                        make_key):
    _, raw = make_key(max_tokens_per_minute=50)

    refused = complete(client, raw, max_tokens=60)

    error = assert_429(refused, "rate_limit_exceeded", "rate_limit_exceeded")
    assert "Retry-After" not in refused and "max_tokens" in error["message"]  # waiting never helps


def test_concurrent_requests_limit_answers_429_while_a_request_runs(client, served, make_key):
    api_key, raw = make_key(max_concurrent_requests=1)
    apikey_admit(api_key=api_key, request_id="running-elsewhere")

    refused = complete(client, raw)
    apikey_release(api_key=api_key, request_id="running-elsewhere")
    allowed = complete(client, raw)

    assert_429(refused, "rate_limit_exceeded", "rate_limit_exceeded")
    assert refused["Retry-After"] == "1"
    assert allowed.status_code == 200
    assert apikey_running_requests(api_key=api_key) == 0  # the API released its own slot


def test_token_budget_refuses_what_might_overspend_it_and_charges_what_was_used(client, served, make_key):
    api_key, raw = make_key(token_budget=30)

    first = complete(client, raw, max_tokens=8)
    used = first.json()["usage"]["total_tokens"]
    too_big = complete(client, raw, max_tokens=30 - used)  # prompt + max_tokens > what is left
    fits = complete(client, raw, max_tokens=8)
    api_key.refresh_from_db()

    assert first.status_code == fits.status_code == 200
    assert api_key.tokens_used == 2 * used <= 30 and api_key.tokens_reserved == 0
    assert_429(too_big, "budget_exhausted", "insufficient_quota")
    assert "Retry-After" not in too_big  # waiting does not refill a budget


def test_a_spent_budget_is_refused_at_admission(client, served, make_key):
    api_key, raw = make_key(token_budget=10)
    ApiKey.objects.filter(pk=api_key.pk).update(tokens_used=10)

    assert_429(complete(client, raw), "budget_exhausted", "insufficient_quota")


def test_keys_of_deactivated_users_answer_401_like_revoked_ones(client, served, make_key):
    api_key, raw = make_key()
    assert complete(client, raw).status_code == 200
    get_user_model().objects.filter(pk=api_key.owner_id).update(is_active=False)

    refused = complete(client, raw)

    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def test_priority_is_refused_naming_it_unless_the_key_may_set_it(client, served, make_key):
    _, plain = make_key()
    _, trusted = make_key(can_set_priority=True)
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "priority": 5}

    def post(raw):
        return client.post("/v1/completions", data=json.dumps(body), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {raw}")

    refused, allowed = post(plain), post(trusted)
    body["priority"] = 0
    default = post(plain)

    assert refused.status_code == 400 and refused.json()["error"]["param"] == "priority"
    assert allowed.status_code == 200 and default.status_code == 200


def test_refused_requests_take_no_slot_and_do_not_count(db, make_key):
    api_key, _ = make_key(max_concurrent_requests=1, max_requests_per_minute=1)
    apikey_admit(api_key=api_key, request_id="a", now=MINUTE)
    with pytest.raises(LimitExceeded):
        apikey_admit(api_key=api_key, request_id="b", now=MINUTE + 1)  # no free slot
    apikey_release(api_key=api_key, request_id="a")
    with pytest.raises(LimitExceeded):
        apikey_admit(api_key=api_key, request_id="c", now=MINUTE + 2)  # the minute's one request is used

    assert apikey_running_requests(api_key=api_key) == 0
    apikey_admit(api_key=api_key, request_id="d", now=MINUTE + 60)  # "a" has left the window
    assert apikey_running_requests(api_key=api_key) == 1
    assert ApiKey.objects.get(pk=api_key.pk).tokens_used == 0


@pytest.fixture(params=["memory", "redis"])
def store(request):
    if request.param == "memory":
        return MemoryLimitStore()
    url = request.getfixturevalue("redis_server")
    return RedisLimitStore(url, prefix=f"test:{request.node.name}:")


def test_window_admits_up_to_the_limit_then_says_when_the_oldest_entry_leaves(store):
    taken = [store.window_reserve("k", f"r{i}", 1, 3, MINUTE + 10 * i) for i in (1, 2, 3)]

    assert taken == [None, None, None]
    assert store.window_reserve("k", "r4", 1, 3, MINUTE + 40) == pytest.approx(30)  # r1 leaves at +70
    assert store.window_reserve("k", "r4", 1, 3, MINUTE + 69.9) == pytest.approx(0.1)
    assert store.window_reserve("k", "r4", 1, 3, MINUTE + 70) is None
    assert store.window_total("k", MINUTE + 70) == 3


def test_a_burst_across_a_minute_boundary_is_refused(store):
    # Calendar minutes let 5 in at :59 and 5 more at :01; a sliding window does not.
    assert all(store.window_reserve("b", f"a{i}", 1, 5, MINUTE + 59) is None for i in range(5))

    wait = store.window_reserve("b", "late", 1, 5, MINUTE + 61)

    assert wait == pytest.approx(58)  # honest: the burst leaves the window at MINUTE + 119
    assert store.window_reserve("b", "late", 1, 5, MINUTE + 61 + wait) is None


def test_tokens_are_reserved_then_settled_to_the_real_count(store):
    assert store.window_reserve("t", "a", 300, 400, MINUTE) is None
    assert store.window_reserve("t", "b", 200, 400, MINUTE + 1) == pytest.approx(59)
    store.window_settle("t", "a", 120)  # "a" used less than its worst case: the rest is free again
    assert store.window_reserve("t", "b", 200, 400, MINUTE + 2) is None
    store.window_settle("t", "b", 999)  # never more than reserved
    store.window_cancel("t", "nobody")

    assert store.window_total("t", MINUTE + 3) == 320
    assert store.window_reserve("t", "huge", 401, 400, MINUTE + 3) == math.inf
    store.window_cancel("t", "a")
    assert store.window_total("t", MINUTE + 3) == 200
    assert store.window_total("t", MINUTE + 62) == 0


def test_slots_are_held_per_request_and_released_idempotently(store):
    assert store.slot_take("s", "r1", 2, MINUTE)
    assert store.slot_take("s", "r1", 2, MINUTE)  # the same request again holds one slot
    assert store.slot_take("s", "r2", 2, MINUTE)
    assert not store.slot_take("s", "r3", 2, MINUTE)
    store.slot_release("s", "r1")
    store.slot_release("s", "r1")

    assert store.slot_count("s") == 1
    assert store.slot_take("s", "r3", 2, MINUTE)


def test_slots_left_by_a_crashed_process_expire(store):
    from webapp.keys.limits import SLOT_TTL_S

    assert store.slot_take("x", "lost", 1, MINUTE)

    assert not store.slot_take("x", "new", 1, MINUTE + 10)
    assert store.slot_take("x", "new", 1, MINUTE + SLOT_TTL_S + 1)


# The check-then-increment race: requests sent at once through the real ASGI app never serve or
# charge more than the key's token budget or tokens per minute, with the windows in either store.

RACE_MAX_TOKENS = 40


@pytest.fixture
def enforced_store(store, monkeypatch):
    """``store`` is the one the enforcement uses for this test."""
    monkeypatch.setattr(enforcement, "get_limit_store", lambda: store)
    return store


async def burst(raw_key: str, count: int) -> list:
    client = AsyncClient()
    body = json.dumps({"model": MODEL, "prompt": "Hello there", "max_tokens": RACE_MAX_TOKENS, "temperature": 0,
                       "ignore_eos": True})
    return await asyncio.gather(*(client.post("/v1/completions", data=body, content_type="application/json",
                                              headers={"Authorization": f"Bearer {raw_key}"}) for _ in range(count)))


def served_tokens(responses) -> int:
    return sum(r.json()["usage"]["total_tokens"] for r in responses if r.status_code == 200)


def racer_key(**limits) -> tuple[ApiKey, str]:
    owner = get_user_model().objects.create_user("racer")
    return apikey_create(owner=owner, name="racer", **limits)


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_concurrent_requests_never_charge_more_than_the_token_budget(served, enforced_store):
    api_key, raw = await sync_to_async(racer_key)(token_budget=600)

    responses = await burst(raw, 16)
    await sync_to_async(api_key.refresh_from_db)()

    statuses = sorted(r.status_code for r in responses)
    ok = statuses.count(200)
    assert set(statuses) == {200, 429} and ok >= 1
    assert all(r.json()["error"]["code"] == "budget_exhausted" for r in responses if r.status_code == 429)
    assert api_key.tokens_used == served_tokens(responses) <= 600
    assert api_key.tokens_reserved == 0 and not await sync_to_async(TokenReservation.objects.exists)()
    print(f"\n[{type(enforced_store).__name__}] budget 600: {ok}/16 served, {api_key.tokens_used} tokens charged")


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_concurrent_requests_never_serve_more_than_the_tokens_per_minute(served, enforced_store):
    api_key, raw = await sync_to_async(racer_key)(max_tokens_per_minute=400)

    responses = await burst(raw, 12)

    refused = [r for r in responses if r.status_code == 429]
    assert refused and served_tokens(responses) <= 400
    assert all(50 <= int(r["Retry-After"]) <= 60 for r in refused)  # when the first admitted leaves
    print(f"\n[{type(enforced_store).__name__}] 400 tokens/min: {12 - len(refused)}/12 served, "
          f"{served_tokens(responses)} tokens")


@pytest.mark.django_db(transaction=True)
def test_reservations_interleaved_never_exceed_the_budget_and_give_back_the_unused_part(enforced_store):
    api_key, _ = racer_key(token_budget=100)
    admitted = []
    for i in range(6):  # six requests in flight at once, none finished: worst case 30 each
        limits_admit(subject=api_key, request_id=f"r{i}")
        try:
            apikey_reserve(api_key=api_key, request_id=f"r{i}", tokens=30)
            admitted.append(f"r{i}")
        except enforcement.LimitExceeded as exc:
            assert exc.code == "budget_exhausted"
    assert admitted == ["r0", "r1", "r2"]
    for request_id in admitted:
        apikey_release(api_key=api_key, request_id=request_id, tokens=10)  # each used 10 of its 30
    apikey_release(api_key=api_key, request_id="r0", tokens=0)  # a second release gives nothing back
    apikey_reserve(api_key=api_key, request_id="r9", tokens=70)  # 30 used + 70 fits exactly

    api_key.refresh_from_db()
    assert (api_key.tokens_used, api_key.tokens_reserved) == (30, 70)


@pytest.mark.django_db(transaction=True)
def test_a_reservation_left_by_a_crashed_process_is_given_back_when_the_budget_looks_full(enforced_store):
    from webapp.keys.limits import SLOT_TTL_S

    api_key, _ = racer_key(token_budget=100)
    apikey_reserve(api_key=api_key, request_id="lost", tokens=90, now=1_000_000.0)  # never released

    with pytest.raises(enforcement.LimitExceeded):
        apikey_reserve(api_key=api_key, request_id="new", tokens=50, now=1_000_000.0 + 10)
    apikey_reserve(api_key=api_key, request_id="new", tokens=50, now=1_000_000.0 + SLOT_TTL_S + 1)

    api_key.refresh_from_db()
    assert (api_key.tokens_used, api_key.tokens_reserved) == (0, 50)
