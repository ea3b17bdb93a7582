"""/v1/completions with a list of prompts: validated with its bound, one engine request per prompt
merged into one answer (choice index = prompt index x n + sample index), one usage record of all
the prompts' tokens, and every prompt's engine request aborted when the client leaves or one fails.
The answers are checked against a real embedded worker serving the tiny Llama."""

import asyncio
import json
from types import SimpleNamespace

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import AsyncClient

from webapp.keys.enforcement import apikey_running_requests
from webapp.keys.services import apikey_create
from webapp.openai_api import prompts
from webapp.openai_api.prompts import ChunkMerge, _merged
from webapp.openai_api.views import CompletionCreateApi
from webapp.registry.models import Model, ModelVersion
from webapp.usage.models import UsageRecord
from workers import embedded
from workers.protocol import Chunk, ErrorInfo

MODEL = "tiny-prompts"
TINY_SETTINGS = {"num_kv_blocks": 64, "max_model_len": 512, "max_num_seqs": 8}
PROMPTS = ["The lighthouse keeper opened the door and", "Once upon a time", "The sea was calm"]


def validate(body: dict):
    serializer = CompletionCreateApi.InputSerializer(data={"model": "m", **body})
    if serializer.is_valid():
        return serializer.validated_data
    return serializer.errors


@pytest.mark.parametrize(("prompt", "want"), [
    ("hi", ["hi"]), ([1, 2], [[1, 2]]), (["a", "b"], ["a", "b"]), ([[1], [2, 3]], [[1], [2, 3]]),
    (["a"] * 16, ["a"] * 16)])
def test_a_prompt_or_a_list_of_prompts_validates_to_a_list(prompt, want):
    assert validate({"prompt": prompt})["prompt"] == want


@pytest.mark.parametrize(("body", "problem"), [
    ({"prompt": ["a"] * 17}, "at most 16 prompts"),
    ({"prompt": ["a", ""]}, "must not be empty"),
    ({"prompt": [[1], []]}, "must not be empty"),
    ({"prompt": [[1], [-1]]}, "must be a string"),
    ({"prompt": ["a"] * 5, "n": 13}, "at most 64"),
    ({"prompt": ["a"] * 9, "n": 2, "best_of": 8}, "at most 64"),
    ({"prompt": [[1, 2]], "suffix": "x"}, None)])
def test_too_many_prompts_or_sequences_or_a_bad_one_are_refused_naming_prompt(body, problem):
    errors = validate(body)
    param = "suffix" if problem is None else "prompt"
    assert list(errors) == [param]
    assert problem is None or problem in str(errors[param][0])


def chunk(text: str, finished: bool = False, **fields) -> Chunk:
    return Chunk("sub", text, [1], None, finished, "length" if finished else None, 3, fields.pop("out", 1), 0,
                 0.5, **fields)


def test_the_merge_numbers_choices_prompt_by_prompt_and_sums_the_prompts_counts():
    merge = ChunkMerge("cmpl-x", n=2, num_prompts=2)
    first = merge.add(1, chunk("", samples=[{"index": 1, "text": "b", "num_output_tokens": 1}]))
    last = merge.add(0, chunk("", finished=True, out=4, samples=[
        {"index": 0, "text": "a", "finish_reason": "length", "num_output_tokens": 2}]))

    assert [s["index"] for s in first.samples] == [3] and not first.finished
    assert [s["index"] for s in last.samples] == [0] and not last.finished  # prompt 1 still runs
    assert (last.num_prompt_tokens, last.num_output_tokens) == (6, 5)
    single = ChunkMerge("cmpl-y", n=1, num_prompts=2)
    single.add(0, chunk("x", finished=True))
    end = single.add(1, chunk("y", finished=True))
    assert end.finished and end.samples[0] == {
        "index": 1, "text": "y", "token_ids": [1], "logprobs": None, "finish_reason": "length",
        "stop_reason": None, "num_output_tokens": 1}


class Stream:
    """One prompt's engine stream: its chunks, then silence until closed (as a running request)."""

    def __init__(self, *chunks):
        self.chunks, self.closed = chunks, False

    async def run(self):
        try:
            for c in self.chunks:
                yield c
            await asyncio.Event().wait()
        finally:
            self.closed = True


@pytest.mark.asyncio
async def test_a_failing_prompt_ends_the_request_and_closes_every_other_prompts_stream():
    running, failing = Stream(chunk("a")), Stream(Chunk.failure("sub", ErrorInfo("prompt_too_long", "too long")))
    streams = [running, failing, Stream()]
    merged = _merged(SimpleNamespace(request_id="cmpl-z", n=1), [s.run() for s in streams])

    got = [c async for c in merged]

    assert got[-1].finished and got[-1].error.code == "prompt_too_long" and got[-1].request_id == "cmpl-z"
    assert all(s.closed for s in streams)  # closing an engine stream aborts its request


# ------------------------------------------------------------------ through the API and a real worker
@pytest.fixture(scope="module")
def worker(tiny_llama_dir):
    embedded.start_embedded_worker(MODEL, "1", str(tiny_llama_dir), TINY_SETTINGS)
    assert embedded.wait_for_embedded_worker(MODEL, timeout=60)
    yield
    embedded.stop_embedded_workers(drain_timeout=5)


@pytest.fixture
def key(worker, tiny_llama_dir, smollm2_tokenizer_dir, db):
    model = Model.objects.create(slug=MODEL)
    ModelVersion.objects.create(model=model, number=1, path=str(tiny_llama_dir), format="hf", status="active",
                                tokenizer_dir=str(smollm2_tokenizer_dir))
    return apikey_create(owner=get_user_model().objects.create_user("p"), name="p", max_concurrent_requests=1)


@pytest.fixture
def workerless_key(workerless_model):
    return apikey_create(owner=get_user_model().objects.create_user("q"), name="q", max_concurrent_requests=1)


async def post(key, **body):
    raw = key[1]
    return await AsyncClient().post("/v1/completions", data=json.dumps({"model": MODEL, **body}),
                                    content_type="application/json", headers={"Authorization": f"Bearer {raw}"})


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_list_of_prompts_answers_each_as_alone_prompt_by_prompt_with_one_usage_record(key):
    alone = [(await post(key, prompt=p, max_tokens=5, temperature=0, ignore_eos=True)).json() for p in PROMPTS]

    response = await post(key, prompt=PROMPTS, n=2, max_tokens=5, temperature=0, ignore_eos=True)

    assert response.status_code == 200, response.content
    body = response.json()
    assert [c["index"] for c in body["choices"]] == list(range(6))
    assert [c["text"] for c in body["choices"]] == [a["choices"][0]["text"] for a in alone for _ in range(2)]
    assert body["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert body["usage"]["completion_tokens"] == 6 * 5
    record = await UsageRecord.objects.aget(request_id=body["id"])
    assert (record.status, record.prompt_tokens, record.completion_tokens) == (
        "ok", body["usage"]["prompt_tokens"], 30)
    assert await sync_to_async(apikey_running_requests)(api_key=key[0]) == 0


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_streamed_list_of_prompts_names_each_choice_and_echoes_its_own_prompt(key):
    alone = [(await post(key, prompt=p, max_tokens=4, temperature=0, ignore_eos=True)).json() for p in PROMPTS[:2]]

    response = await post(key, prompt=PROMPTS[:2], max_tokens=4, temperature=0, ignore_eos=True, echo=True,
                          stream=True, stream_options={"include_usage": True})
    raw = b"".join([part async for part in response.streaming_content]).decode()
    events = [json.loads(p.removeprefix("data: ")) for p in raw.split("\n\n") if p and p != "data: [DONE]"]

    texts = {0: "", 1: ""}
    for event in events[:-1]:
        [choice] = event["choices"]
        texts[choice["index"]] += choice["text"]
    assert [texts[0], texts[1]] == [p + a["choices"][0]["text"] for p, a in zip(PROMPTS, alone)]
    assert events[-1]["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert events[-1]["usage"]["completion_tokens"] == 8


class HangingEngine:
    """Every prompt's engine request sends one chunk, then nothing until it is closed."""

    def __init__(self):
        self.closed: list[str] = []
        self.started = asyncio.Event()

    async def generate(self, req):
        try:
            yield Chunk(req.request_id, "x", [1], None, False, None, 2, 1, 0, 0.01)
            self.started.set()
            await asyncio.Event().wait()
        finally:
            self.closed.append(req.request_id)

    async def abort(self, model, request_id):
        pass


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_client_leaving_aborts_every_prompts_engine_request_and_records_once(workerless_key, monkeypatch):
    key, engine = workerless_key, HangingEngine()
    monkeypatch.setattr(prompts, "get_engine_client", lambda redis_url: engine)
    task = asyncio.create_task(post(key, model="tiny", prompt=PROMPTS, max_tokens=5))
    await asyncio.wait_for(engine.started.wait(), 10)
    await asyncio.sleep(0.1)

    task.cancel()  # as Django cancels the view when the client hangs up
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0.2)

    [record] = await sync_to_async(list)(UsageRecord.objects.all())
    assert sorted(engine.closed) == [f"{record.request_id}-{i}" for i in range(3)]
    assert record.status == "aborted"
    assert await sync_to_async(apikey_running_requests)(api_key=key[0]) == 0
