"""The gate in front of Django (webapp/config/gate.py), an ASGI application called directly: it
counts the generation requests in flight, gives a place back however a request ends, lets every
other request through uncounted, and past capacity answers 503 server_overloaded in the OpenAI
error format with Retry-After and a request id, without calling the application behind it."""

import asyncio
import json
import time

import pytest
from django.conf import settings

from webapp.config.gate import InFlightGate, gate_generations, serving_capacity
from webapp.monitoring.metrics import REGISTRY
from workers.connect import worker_transport
from workers.protocol import WorkerInfo

PATHS = {"/v1/chat/completions": "chat.completions", "/v1/completions": "completions"}


def scope(path="/v1/completions", method="POST", **extra):
    return {"type": "http", "http_version": "1.1", "method": method, "path": path, "raw_path": path.encode(),
            "root_path": "", "query_string": b"", "headers": [], **extra}


class Held:
    """An application that answers 200 once ``release`` is set; records the scopes it was given."""

    def __init__(self):
        self.release, self.entered, self.scopes = asyncio.Event(), asyncio.Event(), []

    async def __call__(self, scope, receive, send):
        self.scopes.append(scope)
        self.entered.set()
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def gate_of(app, capacity=2, **kwargs):
    refused = []
    gate = InFlightGate(app, paths=PATHS, max_in_flight=capacity, new_request_id=lambda e: f"id-{e}",
                        on_refused=refused.append, **kwargs)
    return gate, refused


async def call(gate, scope_=None, receive=None):
    """One request through ``gate``: the messages it sent."""
    sent = []

    async def send(message):
        sent.append(message)

    async def no_more():
        await asyncio.Event().wait()

    await gate(scope_ or scope(), receive or no_more, send)
    return sent


async def started(gate, app, n, path="/v1/completions", key: str | None = None):
    """``n`` requests let through to ``app`` and held there (with ``key``: its Authorization header)."""
    tasks = []
    for _ in range(n):
        app.entered.clear()
        tasks.append(asyncio.ensure_future(call(gate, scope(path) if key is None else keyed(key, path))))
        await asyncio.wait_for(app.entered.wait(), 5)
    return tasks


@pytest.mark.asyncio
async def test_past_capacity_a_generation_request_gets_503_server_overloaded_without_reaching_the_app():
    app = Held()
    gate, refused = gate_of(app, capacity=2)
    running = await started(gate, app, 1, "/v1/completions") + await started(gate, app, 1, "/v1/chat/completions")
    assert gate.in_flight == 2

    sent = await call(gate, scope("/v1/chat/completions"))

    assert len(app.scopes) == 2  # the third never reached the application
    start, body = sent
    assert start["type"] == "http.response.start" and start["status"] == 503
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"retry-after"] == b"2"
    assert headers[b"x-request-id"] == b"id-chat.completions"
    assert int(headers[b"content-length"]) == len(body["body"])
    assert json.loads(body["body"]) == {"error": {
        "message": "The server is overloaded: it has as many requests in progress as it can serve; try again "
                   "shortly.", "type": "server_error", "param": None, "code": "server_overloaded"}}
    assert refused == ["chat.completions"]
    assert gate.in_flight == 2
    app.release.set()
    assert [(await t)[0]["status"] for t in running] == [200, 200]
    assert gate.in_flight == 0
    assert (await call(gate))[0]["status"] == 200  # room again


def keyed(key: str, path="/v1/completions"):
    return scope(path, headers=[(b"content-type", b"application/json"), (b"authorization", f"Bearer {key}".encode())])



@pytest.mark.asyncio
async def test_one_key_filling_the_gate_does_not_lock_other_keys_out():
    """At capacity a caller under its equal part still gets a place (up to 2x capacity in all); one
    at or over it is refused: a flood of one key cannot keep every other key's requests out."""
    app = Held()
    gate, refused = gate_of(app, capacity=4)
    flood = await started(gate, app, 4, key="sk-flood")
    assert (await call(gate, keyed("sk-flood")))[0]["status"] == 503  # the flood is at its part and more

    other = await started(gate, app, 1, key="sk-other")  # nothing held: below 4 / 2 callers
    assert gate.in_flight == 5 and gate.held and len(gate.held) == 2
    assert (await call(gate, keyed("sk-flood")))[0]["status"] == 503
    other += await started(gate, app, 1, key="sk-other")  # 1 place x 2 callers < 4
    assert (await call(gate, keyed("sk-other")))[0]["status"] == 503  # 2 x 2 callers: its part
    third = await started(gate, app, 1, key="sk-third")  # 0 of 4 / 3
    assert gate.in_flight == 7
    fourth = await started(gate, app, 1, key="sk-fourth")  # the 8th place: 2x capacity
    assert (await call(gate, keyed("sk-fifth")))[0]["status"] == 503  # past 2x capacity, whoever asks
    assert len(refused) == 4 and gate.in_flight == 8

    app.release.set()
    await asyncio.gather(*flood, *other, *third, *fourth)
    assert gate.in_flight == 0 and gate.held == {}


@pytest.mark.asyncio
async def test_requests_without_a_key_count_as_one_caller():
    app = Held()
    gate, refused = gate_of(app, capacity=2)
    running = await started(gate, app, 2)
    assert (await call(gate))[0]["status"] == 503
    running += await started(gate, app, 1, key="sk-key")
    app.release.set()
    await asyncio.gather(*running)
    assert gate.held == {} and len(refused) == 1


@pytest.mark.asyncio
async def test_a_place_is_given_back_when_the_app_raises():
    async def failing(scope, receive, send):
        raise RuntimeError("a failure of ours")

    gate, _ = gate_of(failing, capacity=1)
    for _ in range(3):
        with pytest.raises(RuntimeError):
            await call(gate)
    assert gate.in_flight == 0


@pytest.mark.asyncio
async def test_a_place_is_given_back_when_the_request_is_cancelled():
    app = Held()
    gate, refused = gate_of(app, capacity=1)
    (task,) = await started(gate, app, 1)
    task.cancel()  # as Daphne cancels an application instance whose client is gone, or at shutdown
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.in_flight == 0
    app.release.set()
    assert (await call(gate))[0]["status"] == 200 and not refused


@pytest.mark.asyncio
async def test_a_place_is_given_back_when_the_client_disconnects():
    """The application ends on http.disconnect (Django's handler cancels the view and returns)."""
    async def listening(scope, receive, send):
        while (await receive())["type"] != "http.disconnect":
            pass

    inbox = asyncio.Queue()
    gate, _ = gate_of(listening, capacity=1)
    task = asyncio.ensure_future(call(gate, receive=inbox.get))
    await asyncio.sleep(0.01)
    assert gate.in_flight == 1
    await inbox.put({"type": "http.request", "body": b"{}", "more_body": False})
    await inbox.put({"type": "http.disconnect"})
    assert await asyncio.wait_for(task, 5) == []
    assert gate.in_flight == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("request_scope", [
    scope("/healthz", method="GET"), scope("/metrics", method="GET"), scope("/console/workers/", method="GET"),
    scope("/v1/models", method="GET"), scope("/v1/completions", method="GET"), scope("/v1/batches"),
    scope("/tokenize"), scope("/v1/completions/"), {"type": "websocket", "path": "/ws/chat/"},
], ids=["healthz", "metrics", "console", "models", "GET completions", "batches", "tokenize", "trailing slash",
        "websocket"])
async def test_other_requests_pass_uncounted_when_the_gate_is_full(request_scope):
    app = Held()
    gate, refused = gate_of(app, capacity=1)
    running = await started(gate, app, 1)

    passed = asyncio.ensure_future(gate(request_scope, None, lambda message: asyncio.sleep(0)))
    await asyncio.sleep(0.01)
    assert app.scopes[-1] is request_scope and gate.in_flight == 1 and not refused
    app.release.set()
    await asyncio.gather(passed, *running)
    assert gate.in_flight == 0


@pytest.mark.asyncio
async def test_a_root_path_prefix_is_counted_as_the_path_beneath_it():
    app = Held()
    gate, refused = gate_of(app, capacity=1)
    running = await started(gate, app, 1)
    sent = await call(gate, scope("/pagoda/v1/completions", root_path="/pagoda"))
    assert sent[0]["status"] == 503 and refused == ["completions"]
    app.release.set()
    await asyncio.gather(*running)


@pytest.mark.asyncio
async def test_a_refusal_costs_well_under_a_millisecond_of_cpu():
    app = Held()
    gate, refused = gate_of(app, capacity=1)
    running = await started(gate, app, 1)

    async def send(message):
        pass

    request = scope()
    cpu = time.process_time()
    for _ in range(2000):
        await gate(request, None, send)
    per_refusal = (time.process_time() - cpu) / 2000
    assert len(refused) == 2000
    # About 5 us here (a Xeon, 2 shared cores; Daphne's own handling of a request is ~350 us); the
    # bound is the promise, with 50x room for a slow, loaded machine: no database, no Django, no JSON
    # encoding per refusal.
    assert per_refusal < 250e-6, per_refusal
    app.release.set()
    await asyncio.gather(*running)


@pytest.mark.asyncio
async def test_the_capacity_is_read_once_for_a_burst_then_again_after_its_ttl_in_the_background():
    reads = []

    def read():
        reads.append(time.monotonic())
        time.sleep(0.05)  # a Redis round trip, in a thread
        return 3 if len(reads) == 1 else 1

    app = Held()
    gate = InFlightGate(app, paths=PATHS, read_capacity=read, new_request_id=str, on_refused=lambda e: None,
                        ttl_s=60)
    tasks = [asyncio.ensure_future(call(gate)) for _ in range(5)]  # all wait for the first read
    assert [(await t)[0]["status"] for t in tasks[3:]] == [503, 503]
    assert len(reads) == 1 and gate.in_flight == 3
    assert (await call(gate))[0]["status"] == 503 and len(reads) == 1  # within the TTL: no read

    gate.ttl_s = 0  # past the TTL: the next request reads again, without waiting for the read
    assert (await call(gate))[0]["status"] == 503  # still judged against 3
    for _ in range(100):
        if gate.last_capacity == 1:
            break
        await asyncio.sleep(0.01)
    assert len(reads) == 2 and gate.last_capacity == 1
    app.release.set()
    await asyncio.gather(*tasks[:3])
    assert gate.in_flight == 0


@pytest.mark.asyncio
async def test_a_failed_capacity_read_keeps_no_bound_until_a_read_succeeds():
    def read():
        raise ConnectionError("Redis is down")

    app = Held()
    app.release.set()
    gate = InFlightGate(app, paths=PATHS, read_capacity=read, new_request_id=str, on_refused=lambda e: None)
    assert [(await call(gate))[0]["status"] for _ in range(3)] == [200] * 3
    assert gate.last_capacity is None


@pytest.mark.asyncio
async def test_a_read_that_finds_no_worker_keeps_the_last_bound_and_any_request_starts_the_first_read():
    """Heartbeats missed under load (no serving worker seen for a moment) must not open the gate."""
    results, reads = [2, None], []

    def read():
        reads.append(results[len(reads)])
        return reads[-1]

    app = Held()
    gate = InFlightGate(app, paths=PATHS, read_capacity=read, new_request_id=str, on_refused=lambda e: None,
                        ttl_s=0)
    app.release.set()
    await call(gate, scope("/readyz", method="GET"))  # a probe: the first read starts
    for _ in range(100):
        if gate.last_capacity is not None:
            break
        await asyncio.sleep(0.01)
    assert gate.last_capacity == 2
    await call(gate)  # stale at once (ttl 0): this one reads again and finds no worker
    for _ in range(100):
        if len(reads) == 2 and gate._reading is None:
            break
        await asyncio.sleep(0.01)
    assert reads == [2, None] and gate.last_capacity == 2


@pytest.fixture
def serving_workers():
    """Two models announced on the in-process broker (embedded mode), one by two workers."""
    assert not settings.REDIS_URL
    transports = []
    now = time.time()
    for model, seqs in (("gated", 3), ("gated", 5), ("other", 2)):
        transport = worker_transport(None, model)
        transport.heartbeat(WorkerInfo(worker_id=transport.worker_id, model=model, version="1", host="h", pid=1,
                                       started_at=now, last_heartbeat=now, max_num_seqs=seqs, max_model_len=64))
        transports.append(transport)
    yield
    for transport in transports:
        transport.unregister()


def test_the_default_capacity_is_the_sequences_every_models_workers_run(serving_workers):
    assert serving_capacity() == 3 + 5 + 2


def test_no_serving_worker_means_no_bound():
    assert serving_capacity() is None


@pytest.mark.asyncio
async def test_the_served_gate_counts_the_real_endpoints_and_reports_to_metrics(settings):
    settings.PAGODA_MAX_REQUESTS_IN_FLIGHT = 1
    app = Held()
    gate = gate_generations(app)
    running = await started(gate, app, 1, "/v1/chat/completions")
    sent = await call(gate, scope("/v1/completions"))
    assert sent[0]["status"] == 503
    assert dict(sent[0]["headers"])[b"x-request-id"].startswith(b"cmpl-")
    assert REGISTRY.get_sample_value("pagoda:api_requests_in_flight") == 1
    assert REGISTRY.get_sample_value("pagoda:api_requests_capacity") == 1
    assert REGISTRY.get_sample_value("pagoda:api_requests_shed_total", {"endpoint": "completions"}) >= 1
    app.release.set()
    await asyncio.gather(*running)


@pytest.mark.asyncio
async def test_the_served_gate_counts_messages_and_responses_and_refuses_each_in_its_apis_shape(settings):
    settings.PAGODA_MAX_REQUESTS_IN_FLIGHT = 1
    app = Held()
    gate = gate_generations(app)
    running = await started(gate, app, 1, "/v1/responses")
    anthropic, openai = await call(gate, scope("/v1/messages")), await call(gate, scope("/v1/responses"))

    assert anthropic[0]["status"] == openai[0]["status"] == 503 and len(app.scopes) == 1
    assert dict(anthropic[0]["headers"])[b"x-request-id"].startswith(b"msg_")
    assert json.loads(anthropic[1]["body"]) == {"type": "error", "error": {
        "type": "overloaded_error", "message": json.loads(openai[1]["body"])["error"]["message"]}}
    assert json.loads(openai[1]["body"])["error"]["code"] == "server_overloaded"
    app.release.set()
    await asyncio.gather(*running)
