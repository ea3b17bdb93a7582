"""An embeddings request still running when the server shuts down is cut like a generation: its
one engine request aborted in the workers and its usage record ended ``aborted`` with its tokens
(generation.py's _cut and _finish read an Embedding as they read a Generation)."""

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from webapp.config.shutdown import track, tracked
from webapp.keys.services import apikey_create
from webapp.openai_api import prompts
from webapp.openai_api.embeddings import Embedding
from webapp.openai_api.generation import _cut
from webapp.registry.models import Model, ModelVersion
from webapp.usage.models import UsageRecord
from webapp.usage.outcome import Outcome
from webapp.usage.services import usage_record_start


class RecordingEngine:
    def __init__(self):
        self.aborted: list[tuple[str, str]] = []

    async def abort(self, model, request_id):
        self.aborted.append((model, request_id))


def accepted_embedding() -> Embedding:
    model = Model.objects.create(slug="minilm")
    version = ModelVersion.objects.create(model=model, number=1, path="/nowhere", format="hf", status="active")
    api_key = apikey_create(owner=get_user_model().objects.create_user("e"), name="e")[0]
    emb = Embedding(request_id="embd-cut", api_key=api_key, model=model, version=version,
                    inputs=[[101, 7, 102], [101, 8, 9, 102]], encoding_format="float", started=time.monotonic())
    usage_record_start(request_id=emb.request_id, endpoint=emb.endpoint, started=emb.started, model=model,
                       version=version, num_prompt_tokens=emb.num_prompt_tokens, api_key=api_key,
                       user=api_key.owner)
    return emb


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_an_embeddings_request_cut_at_shutdown_is_aborted_in_its_workers_and_recorded(monkeypatch):
    engine = RecordingEngine()
    monkeypatch.setattr(prompts, "get_engine_client", lambda redis_url: engine)
    emb = await sync_to_async(accepted_embedding)()
    track(emb.request_id, asyncio.current_task())

    await _cut(emb, Outcome())

    assert engine.aborted == [("minilm", "embd-cut")]
    record = await UsageRecord.objects.aget(request_id="embd-cut")
    assert (record.status, record.endpoint, record.prompt_tokens) == ("aborted", "embeddings", 7)
    assert tracked("embd-cut") is None
