"""A generation request's Server-Timing header (webapp/openai_api/timing.py): the phases before its
response began, against a real tiny engine in this process; the gate's arrival stamp."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from django.contrib.auth import get_user_model
from django.test import AsyncClient

from tests.e2e.sites import TINY_SETTINGS
from webapp.config.gate import InFlightGate
from webapp.keys.services import apikey_create
from webapp.openai_api.timing import ARRIVED, Phases
from webapp.registry.models import Model, ModelVersion
from workers import embedded

pytestmark = pytest.mark.db_engine

MODEL = "tiny-timing"


@pytest.fixture
def served(tiny_llama_dir, db):
    embedded.start_embedded_worker(MODEL, "1", str(tiny_llama_dir), TINY_SETTINGS)
    assert embedded.wait_for_embedded_worker(MODEL, timeout=60)
    model = Model.objects.create(slug=MODEL)
    ModelVersion.objects.create(model=model, number=1, path=str(tiny_llama_dir), format="hf", status="active",
                                tokenizer_dir=str(tiny_llama_dir))
    yield model
    embedded.stop_embedded_workers(drain_timeout=5)


@pytest.fixture
def key(db):
    return apikey_create(owner=get_user_model().objects.create_user("timed"), name="timed")[1]


def phases_of(response) -> dict[str, float]:
    parts = [part.strip().split(";dur=") for part in response["Server-Timing"].split(",")]
    return {name: float(ms) for name, ms in parts}


def complete(client, key, **body):
    body = {"model": MODEL, "prompt": "Hello there", "max_tokens": 8, "temperature": 0, "ignore_eos": True, **body}
    return client.post("/v1/completions", data=json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {key}")


def test_a_completion_says_where_its_time_went(client, served, key):
    began = time.perf_counter()
    response = complete(client, key)
    wall_ms = 1000 * (time.perf_counter() - began)
    assert response.status_code == 200, response.content
    phases = phases_of(response)
    assert list(phases) == ["key", "admit", "prepare", "engine"]  # no gate in the test client: no "django"
    assert all(ms >= 0 for ms in phases.values())
    assert phases["engine"] > 0 and sum(phases.values()) <= wall_ms + 1, (phases, wall_ms)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_stream_times_the_engine_until_its_first_chunk(served, key):
    body = {"model": MODEL, "prompt": "Hello there", "max_tokens": 64, "temperature": 0, "ignore_eos": True,
            "stream": True}
    began = time.perf_counter()
    response = await AsyncClient().post("/v1/completions", data=json.dumps(body), content_type="application/json",
                                        headers={"Authorization": f"Bearer {key}"})
    phases = phases_of(response)  # the headers, before any event is read
    events = b"".join([part async for part in response.streaming_content])
    wall_ms = 1000 * (time.perf_counter() - began)
    assert response.status_code == 200 and events.endswith(b"data: [DONE]\n\n")
    assert list(phases) == ["key", "admit", "prepare", "engine"]
    assert sum(phases.values()) < wall_ms, (phases, wall_ms)  # the 64 tokens came after


def test_a_refusal_lists_the_phases_it_passed(client, served, key):
    unknown = complete(client, key, model="no-such-model")
    assert unknown.status_code == 404
    assert list(phases_of(unknown)) == ["key", "admit"]  # refused while preparing: no engine
    bad = client.post("/v1/completions", data="{not json", content_type="application/json",
                      HTTP_AUTHORIZATION=f"Bearer {key}")
    assert bad.status_code == 400
    assert list(phases_of(bad)) == ["key"]  # refused while admitted: its body


def test_the_gate_stamps_the_arrival_and_the_view_counts_from_it():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope)

    gate = InFlightGate(app, paths={"/v1/completions": "completions"}, max_in_flight=4,
                        new_request_id=lambda endpoint: "id", on_refused=lambda endpoint: None)
    before = time.monotonic()
    asyncio.run(gate({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, None, None))
    assert before <= seen[0][ARRIVED] <= time.monotonic()
    phases = Phases(started=seen[0][ARRIVED] + 0.004, arrived=seen[0][ARRIVED])
    phases.mark("key")
    assert phases.names() == ["django", "key"]
    assert phases.header().startswith("django;dur=4.0, key;dur=")
