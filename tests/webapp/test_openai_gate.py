"""The gate in front of a model's queue (webapp/openai_api/gate.py), against the in-process broker
(embedded mode) with a worker's own heartbeat announcement: places up to what the serving workers
run and queue, then 503 server_overloaded with Retry-After, and a released place is free again."""

import time

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings

from webapp.openai_api.errors import OpenAIError
from webapp.openai_api.gate import Gate
from workers.connect import get_engine_client, worker_transport
from workers.protocol import WorkerInfo


@pytest.fixture
def serving_worker():
    assert not settings.REDIS_URL  # embedded mode: the in-process broker
    transport = worker_transport(None, "gated")
    now = time.time()
    transport.heartbeat(WorkerInfo(worker_id=transport.worker_id, model="gated", version="1", host="h", pid=1,
                                   started_at=now, last_heartbeat=now, max_num_seqs=3, max_model_len=64))
    yield
    transport.unregister()


def test_the_gate_refuses_past_what_the_workers_run_and_queue_and_a_released_place_is_free_again(serving_worker):
    client = get_engine_client(None)
    serving = client.live_workers("gated")
    capacity = client.admission.queue_bound(serving) + 3
    gate = Gate()

    async def fill():
        places = [await gate.enter("gated") for _ in range(capacity)]
        with pytest.raises(OpenAIError) as refused:
            await gate.enter("gated")
        places[0].release()
        places[0].release()  # once only
        places.append(await gate.enter("gated"))
        return refused.value, places

    refused, places = async_to_sync(fill)()
    assert (refused.status, refused.code) == (503, "server_overloaded")
    assert int(refused.headers["Retry-After"]) >= 1
    assert gate.held["gated"] == capacity
    for place in places:
        place.release()
    assert gate.held["gated"] == 0


def test_a_model_no_worker_serves_is_not_gated():
    gate = Gate()

    async def many():
        return [await gate.enter("nobody-serves-this") for _ in range(50)]

    assert len(async_to_sync(many)()) == 50  # the engine client answers no_worker for each
