"""Per-key limits: each answers 429 with an OpenAI error body (and Retry-After when waiting helps).

The API tests run against a real embedded worker serving the tiny Llama, so the tokens charged
to a key are the ones the engine counted. The store arithmetic is checked on both stores: the
in-process one (embedded mode) and Redis (distributed mode).
"""

import json
import time

import pytest
from django.contrib.auth import get_user_model

from webapp.keys.enforcement import LimitExceeded, apikey_admit, apikey_release, apikey_running_requests
from webapp.keys.limits import MemoryLimitStore, RedisLimitStore, get_limit_store
from webapp.keys.models import ApiKey
from webapp.keys.services import apikey_create
from webapp.registry.models import Model, ModelVersion
from webapp.usage.models import UsageRecord
from workers import embedded

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


def test_tokens_per_minute_limit_counts_the_engine_tokens_and_answers_429(client, served, make_key):
    api_key, raw = make_key(max_tokens_per_minute=50)

    first = complete(client, raw, max_tokens=4)
    usage = first.json()["usage"]
    charged = get_limit_store().window_total(f"{api_key.key_hash[:24]}:tokens", time.time())
    # The first request fits (nothing used yet); its tokens fill the window only partly.
    assert first.status_code == 200 and charged == usage["total_tokens"] < 50
    while charged < 50:
        response = complete(client, raw, max_tokens=16)
        assert response.status_code == 200
        charged += response.json()["usage"]["total_tokens"]
    refused = complete(client, raw)

    assert_429(refused, "rate_limit_exceeded", "rate_limit_exceeded")
    assert 1 <= int(refused["Retry-After"]) <= 60


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


def test_token_budget_answers_429_budget_exhausted_once_spent(client, served, make_key):
    api_key, raw = make_key(token_budget=10)

    first = complete(client, raw, max_tokens=8)  # prompt + 8 tokens: over the budget of 10
    refused = complete(client, raw)

    assert first.status_code == 200
    api_key.refresh_from_db()
    assert api_key.tokens_used == first.json()["usage"]["total_tokens"] >= 10
    assert_429(refused, "budget_exhausted", "insufficient_quota")
    assert "Retry-After" not in refused  # waiting does not refill a budget


def test_refused_requests_take_no_slot_and_do_not_count(db, make_key):
    api_key, _ = make_key(max_concurrent_requests=1, max_requests_per_minute=1)
    apikey_admit(api_key=api_key, request_id="a", now=MINUTE)
    with pytest.raises(LimitExceeded):
        apikey_admit(api_key=api_key, request_id="b", now=MINUTE + 1)  # no free slot
    apikey_release(api_key=api_key, request_id="a")
    with pytest.raises(LimitExceeded):
        apikey_admit(api_key=api_key, request_id="c", now=MINUTE + 2)  # the minute's one request is used

    assert apikey_running_requests(api_key=api_key) == 0
    apikey_admit(api_key=api_key, request_id="d", now=MINUTE + 60)  # next minute
    assert apikey_running_requests(api_key=api_key) == 1
    assert ApiKey.objects.get(pk=api_key.pk).tokens_used == 0


@pytest.fixture(params=["memory", "redis"])
def store(request):
    if request.param == "memory":
        return MemoryLimitStore()
    url = request.getfixturevalue("redis_server")
    return RedisLimitStore(url, prefix=f"test:{request.node.name}:")


def test_window_admits_up_to_the_limit_then_says_when_it_ends(store):
    taken = [store.window_take("k", 3, MINUTE + 15.2) for _ in range(4)]

    assert taken == [None, None, None, 45]
    assert store.window_take("k", 3, MINUTE + 59.9) == 1
    assert store.window_take("k", 3, MINUTE + 60) is None  # a new minute
    assert store.window_total("k", MINUTE + 60) == 1


def test_window_token_totals_add_up_within_a_minute(store):
    store.window_add("t", 7, MINUTE)
    store.window_add("t", 5, MINUTE + 30)
    store.window_add("t", 100, MINUTE + 61)

    assert store.window_total("t", MINUTE + 59) == 12
    assert store.window_total("t", MINUTE + 61) == 100


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
