"""Token budgets on PostgreSQL under real concurrency: threads, each its own connection.

Every web process reserves a request's worst case with one conditional UPDATE of the key's (or
chat user's) row (webapp.keys.enforcement). Here sixteen requests queue behind a lock on that
row (tests/postgres.py: run_behind_row_lock) and are let go together, so PostgreSQL re-checks the
condition on the row each one finds. The same harness catches a read-then-write reservation
overspending, so it does produce the race it claims to. Skipped on SQLite (``make test`` runs it
on its PostgreSQL server).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from threading import Barrier

import pytest
from django.contrib.auth import get_user_model
from django.db import connections, transaction
from django.db.models import F
from django.utils import timezone

from tests.postgres import run_behind_row_lock
from webapp.keys.enforcement import BUDGET_EXHAUSTED, RATE_LIMIT_EXCEEDED, LimitExceeded, limits_admit, \
    limits_release, limits_reserve
from webapp.keys.limits import SLOT_TTL_S, WINDOW_S, get_limit_store
from webapp.keys.models import ApiKey, ChatLimits, TokenReservation
from webapp.keys.services import apikey_create

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.db_engine]

BUDGET, WORST, NUM_REQUESTS = 600, 100, 16


def make_subject(kind: str, **limits):
    owner = get_user_model().objects.create_user(f"budget-{kind}")
    if kind == "api_key":
        return apikey_create(owner=owner, name="budget", **limits)[0]
    return ChatLimits.objects.create(user=owner, max_requests_per_minute=None, max_concurrent_requests=None,
                                     **limits)


def table(subject) -> str:
    return type(subject)._meta.db_table


def fresh(subject):
    """The subject as one request (one thread) loads it."""
    return type(subject).objects.get(pk=subject.pk)


def reserve(subject, request_id: str, tokens: int = WORST) -> str:
    limits_admit(subject=fresh(subject), request_id=request_id)
    limits_reserve(subject=fresh(subject), request_id=request_id, tokens=tokens)
    return request_id


def counts(subject) -> tuple[int, int, int]:
    """(tokens_used, tokens_reserved, tokens held by TokenReservation rows) as the database has them."""
    row = fresh(subject)
    held = sum(TokenReservation.objects.filter(**{"api_key" if isinstance(subject, ApiKey) else "chat_limits":
                                                  subject}).values_list("tokens", flat=True))
    return row.tokens_used, row.tokens_reserved, held


def outcomes(results) -> tuple[list[str], list[LimitExceeded]]:
    unexpected = [r for r in results if not isinstance(r, (str, LimitExceeded))]
    assert not unexpected, unexpected
    return [r for r in results if isinstance(r, str)], [r for r in results if isinstance(r, LimitExceeded)]


@pytest.mark.parametrize("kind", ["api_key", "chat_limits"])
def test_sixteen_concurrent_requests_never_charge_more_than_the_budget(kind):
    subject = make_subject(kind, token_budget=BUDGET)

    results = run_behind_row_lock(table(subject), subject.pk, NUM_REQUESTS,
                                  lambda i: reserve(subject, f"{kind}-first-{i}"))
    taken, refused = outcomes(results)
    assert len(taken) == BUDGET // WORST
    assert {(r.code, r.retry_after) for r in refused} == {(BUDGET_EXHAUSTED, None)}
    assert counts(subject) == (0, BUDGET, BUDGET)

    # They end together too, each having used 70 of its 100: 180 tokens are free again.
    run_behind_row_lock(table(subject), subject.pk, len(taken),
                        lambda i: limits_release(subject=fresh(subject), request_id=taken[i], tokens=70))
    assert counts(subject) == (420, 0, 0)

    results = run_behind_row_lock(table(subject), subject.pk, NUM_REQUESTS,
                                  lambda i: reserve(subject, f"{kind}-second-{i}"))
    taken, refused = outcomes(results)
    assert len(taken) == 1 and len(refused) == NUM_REQUESTS - 1
    assert counts(subject) == (420, WORST, WORST)
    limits_release(subject=fresh(subject), request_id=taken[0], tokens=WORST)
    assert counts(subject) == (520, 0, 0)


def test_the_harness_catches_a_read_then_write_reservation_overspending():
    """The control: checking the budget in Python, then writing, lets all sixteen through."""
    subject = make_subject("api_key", token_budget=BUDGET)

    def read_then_write(i: int) -> bool:
        with transaction.atomic():
            row = fresh(subject)
            if row.tokens_used + row.tokens_reserved + WORST > row.token_budget:
                return False
            ApiKey.objects.filter(pk=subject.pk).update(tokens_reserved=F("tokens_reserved") + WORST)
            return True

    results = run_behind_row_lock(table(subject), subject.pk, NUM_REQUESTS, read_then_write)
    assert results.count(True) > BUDGET // WORST
    assert fresh(subject).tokens_reserved > BUDGET


def test_stale_reservations_swept_by_concurrent_requests_are_given_back_once():
    """Six rows left by a dead process hold the whole budget; sixteen requests find it full at once,
    each sweeps them, and each stale row is given back exactly once (twice would drive
    tokens_reserved below zero, which its CHECK constraint refuses)."""
    subject = make_subject("api_key", token_budget=BUDGET)
    long_ago = timezone.now() - timedelta(seconds=SLOT_TTL_S + 60)
    for i in range(BUDGET // WORST):
        TokenReservation.objects.create(request_id=f"dead-{i}", tokens=WORST, created_at=long_ago, api_key=subject)
    ApiKey.objects.filter(pk=subject.pk).update(tokens_reserved=BUDGET)

    results = run_behind_row_lock(table(subject), subject.pk, NUM_REQUESTS,
                                  lambda i: reserve(subject, f"live-{i}"))
    taken, refused = outcomes(results)
    print(f"{len(taken)} of {NUM_REQUESTS} requests admitted after the concurrent sweep")
    assert 1 <= len(taken) <= BUDGET // WORST
    assert {r.code for r in refused} == {BUDGET_EXHAUSTED}
    assert counts(subject) == (0, WORST * len(taken), WORST * len(taken))
    assert not TokenReservation.objects.filter(request_id__startswith="dead-").exists()


def test_redis_windows_and_the_postgres_budget_hold_together_under_sixteen_threads(settings, redis_server):
    """Distributed mode's three limits at once: 5 requests a minute (Redis), 300 tokens a minute
    (Redis), a budget of 600 (PostgreSQL). Five are admitted, three fit the token window, and
    the two refused there give their request-window places back."""
    settings.REDIS_URL = redis_server
    subject = make_subject("api_key", token_budget=BUDGET, max_requests_per_minute=5, max_tokens_per_minute=300)
    start = Barrier(NUM_REQUESTS)

    def request(i: int) -> str:
        start.wait()
        return reserve(subject, f"windowed-{i}")

    results = run_in_threads(NUM_REQUESTS, request)
    taken, refused = outcomes(results)
    assert len(taken) == 3
    assert {r.code for r in refused} == {RATE_LIMIT_EXCEEDED}
    # Each request reads its own clock: one that read it just before another was admitted waits a
    # second more than the window (ceil of 60 + a few ms).
    assert all(0 < r.retry_after <= WINDOW_S + 1 for r in refused), [r.retry_after for r in refused]
    store, name = get_limit_store(), subject.counter_name
    assert store.window_total(f"{name}:requests", now=time.time()) == 3
    assert counts(subject) == (0, 3 * WORST, 3 * WORST)

    run_in_threads(len(taken), lambda i: limits_release(subject=fresh(subject), request_id=taken[i], tokens=50))
    assert store.window_total(f"{name}:tokens", now=time.time()) == 150
    assert counts(subject) == (150, 0, 0)


def run_in_threads(num_threads: int, work) -> list:
    """``work(i)`` in threads, each on its own connection; what each returned or raised."""
    def run(i: int):
        try:
            return work(i)
        except Exception as exc:
            return exc
        finally:
            connections.close_all()

    with ThreadPoolExecutor(num_threads) as pool:
        return list(pool.map(run, range(num_threads)))
