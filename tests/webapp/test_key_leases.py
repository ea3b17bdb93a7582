"""A web process killed mid-request gives back its concurrency slots and budget reservations once
its lease lapses (webapp/keys/leases.py), instead of locking the key out for SLOT_TTL_S (an hour).

The dead process is real: a child interpreter takes a slot through RedisLimitStore (renewing its
lease from a thread, as a web process does) and is SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from django.contrib.auth import get_user_model

from webapp.keys import enforcement
from webapp.keys.enforcement import LimitExceeded, apikey_admit, apikey_reserve
from webapp.keys.leases import LEASE_PREFIX, process_id
from webapp.keys.limits import MemoryLimitStore, RedisLimitStore
from webapp.keys.models import ApiKey, TokenReservation
from webapp.keys.services import apikey_create

pytestmark = pytest.mark.db_engine

LEASE_TTL_S = 2  # the child's; renewed every ttl / 6
HOLDER = """
import sys, time
import django
django.setup()
from webapp.keys.limits import RedisLimitStore
store = RedisLimitStore(sys.argv[1], prefix=sys.argv[2])
assert store.slot_take(sys.argv[3], "child-request", 1, time.time())
print(store.lease(), flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(redis_server, request):
    """Start a child holding slot ``name``'s only place; returns (prefix, its process id, the child)."""
    prefix = f"test:{request.node.name}:"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "webapp.config.settings.test",
           "PAGODA_LEASE_TTL_S": str(LEASE_TTL_S), "PYTHONPATH": os.getcwd()}
    child = subprocess.Popen([sys.executable, "-c", HOLDER, redis_server, prefix, "running"],
                             env=env, stdout=subprocess.PIPE, text=True)
    try:
        yield prefix, child.stdout.readline().strip(), child
    finally:
        child.kill()
        child.wait()


@pytest.mark.e2e
def test_a_live_process_keeps_its_slot_and_a_killed_one_loses_it_when_its_lease_lapses(redis_server, holder):
    prefix, child_id, child = holder
    store = RedisLimitStore(redis_server, prefix=prefix)

    time.sleep(LEASE_TTL_S + 1)  # past one ttl: the child's thread has renewed its lease meanwhile
    held_while_alive = store.slot_take("running", "mine", 1, time.time())
    assert store.processes_alive({child_id}) == {child_id}
    child.send_signal(signal.SIGKILL)
    child.wait()
    killed_at = time.monotonic()
    while not store.slot_take("running", "mine", 1, time.time()):
        assert time.monotonic() - killed_at < LEASE_TTL_S + 5, "the dead process's slot was never taken back"
        time.sleep(0.2)

    assert not held_while_alive
    assert store.processes_alive({child_id, process_id()}) == {process_id()}  # this process leased on its take
    assert store.slot_count("running") == 1


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_reservation_of_a_killed_process_is_given_back_when_the_budget_looks_full(redis_server, holder,
                                                                                     monkeypatch):
    prefix, child_id, child = holder
    store = RedisLimitStore(redis_server, prefix=prefix)
    monkeypatch.setattr(enforcement, "get_limit_store", lambda: store)
    owner = get_user_model().objects.create_user("leased")
    api_key, _ = apikey_create(owner=owner, name="leased", token_budget=100)
    # What the child's _budget_reserve wrote for its request (named by its process), held in the row.
    ApiKey.objects.filter(pk=api_key.pk).update(tokens_reserved=90)
    TokenReservation.objects.create(request_id="child-request", tokens=90, api_key=api_key,
                                    created_at=enforcement._utc(time.time()), process_id=child_id)

    with pytest.raises(LimitExceeded):
        apikey_reserve(api_key=api_key, request_id="mine", tokens=50)  # the child lives: its 90 hold
    child.send_signal(signal.SIGKILL)
    child.wait()
    time.sleep(LEASE_TTL_S + 0.5)
    apikey_admit(api_key=api_key, request_id="mine")
    apikey_reserve(api_key=api_key, request_id="mine", tokens=50)

    api_key.refresh_from_db()
    assert (api_key.tokens_used, api_key.tokens_reserved) == (0, 50)
    assert list(TokenReservation.objects.values_list("request_id", "process_id")) == [("mine", process_id())]


@pytest.mark.django_db(transaction=True)
def test_embedded_mode_gives_back_reservations_left_by_a_previous_run_of_the_server(monkeypatch):
    store = MemoryLimitStore()
    monkeypatch.setattr(enforcement, "get_limit_store", lambda: store)
    owner = get_user_model().objects.create_user("restarted")
    api_key, _ = apikey_create(owner=owner, name="restarted", token_budget=100)
    apikey_reserve(api_key=api_key, request_id="before", tokens=90)
    TokenReservation.objects.filter(request_id="before").update(process_id="host-1-dead")  # the old run's

    apikey_reserve(api_key=api_key, request_id="after", tokens=50)

    api_key.refresh_from_db()
    assert (api_key.tokens_used, api_key.tokens_reserved) == (0, 50)


@pytest.mark.e2e
def test_a_process_is_called_gone_only_when_its_lease_is_missing_at_two_looks_a_confirmation_apart(
        redis_server, holder, settings):
    """A Redis that restarts forgets every lease, which each live process renews within a sixth of
    the TTL: a single look without a lease must not call it dead (the usage reconciler would
    end and abort its requests)."""
    settings.PAGODA_LEASE_TTL_S = LEASE_TTL_S
    prefix, child_id, child = holder
    store = RedisLimitStore(redis_server, prefix=prefix)
    confirm_s = LEASE_TTL_S / 3  # GONE_CONFIRM_PERIODS renewal periods
    store.lease()
    store._redis.delete(LEASE_PREFIX + child_id, LEASE_PREFIX + process_id())  # as after a Redis restart

    at_once = store.processes_gone({child_id, process_id()})
    time.sleep(confirm_s + 0.3)  # both renew meanwhile (every ttl / 6)
    renewed = store.processes_gone({child_id, process_id()})
    child.send_signal(signal.SIGKILL)
    child.wait()
    time.sleep(LEASE_TTL_S + 0.2)  # its lease lapses: missing from now on
    first_look = store.processes_gone({child_id, process_id()})
    time.sleep(confirm_s + 0.1)
    second_look = store.processes_gone({child_id, process_id()})

    assert (at_once, renewed, first_look) == (set(), set(), set())
    assert second_look == {child_id}
