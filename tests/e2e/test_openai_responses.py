"""OpenAI's Responses API through the official openai client against a real server (embedded
workers, the bundled SmolLM2), every body and event validated with the package's own types:
answers are the chat completion's own (the same engine request), streamed in the reference's
event order with sequence numbers; a tool round trip through previous_response_id with the
arguments streamed in several deltas; stored responses per key owner; background runs polled and
cancelled; refusals as OpenAI error objects."""

import json
import time

import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

pytestmark = pytest.mark.e2e

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}}}
TOOLS = [{"type": "function", "name": "get_weather", "description": "The current weather in a city",
          "parameters": WEATHER, "strict": True}]
STORY = "Tell me a short story about a lighthouse keeper."
EVENTS = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def client(embedded_site):
    return openai.OpenAI(base_url=f"{embedded_site.url}/v1", api_key=embedded_site.keys["all"], max_retries=0,
                         timeout=600)


@pytest.fixture(scope="module")
def stranger(embedded_site):
    embedded_site.manage("shell", "-c", "from django.contrib.auth import get_user_model; "
                                        "get_user_model().objects.get_or_create(username='stranger')")
    key = embedded_site.manage("create_api_key", "--name", "other tenant", "--user", "stranger").strip().splitlines()[-1]
    return openai.OpenAI(base_url=f"{embedded_site.url}/v1", api_key=key, max_retries=0, timeout=600)


def _create(client, **kwargs) -> Response:
    """The response, validated strictly with the package's own type (not the client's lenient parse)."""
    raw = client.responses.with_raw_response.create(**kwargs)
    return Response.model_validate(raw.http_response.json())


def test_a_response_is_the_chat_completions_answer_in_the_responses_shape(client, embedded_site):
    reference = client.chat.completions.create(model="smollm2", max_tokens=24, temperature=0, messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": STORY}])
    response = _create(client, model="smollm2", instructions="You are terse.", input=STORY, max_output_tokens=24,
                       temperature=0)

    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text == reference.choices[0].message.content
    assert response.status == ("incomplete" if reference.choices[0].finish_reason == "length" else "completed")
    assert response.usage.input_tokens == reference.usage.prompt_tokens
    assert response.usage.output_tokens == reference.usage.completion_tokens
    assert response.usage.input_tokens_details.cached_tokens > 0  # the chat request's prefix, cached
    assert embedded_site.usage(response.id)["endpoint"] == "responses"


def test_a_streamed_response_follows_the_reference_event_sequence(client):
    plain = _create(client, model="smollm2", input=STORY, max_output_tokens=16, temperature=0)
    events = list(client.responses.create(model="smollm2", input=STORY, max_output_tokens=16, temperature=0,
                                          stream=True))
    for event in events:  # strictly, with the package's own union of event types
        EVENTS.validate_python(event.model_dump())
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response

    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[4:-4] == ["response.output_text.delta"] * len(deltas) and len(deltas) > 1
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] == ("response.completed" if plain.status == "completed" else "response.incomplete")
    assert "".join(deltas) == plain.output_text == final.output_text


def test_a_tool_call_streams_its_arguments_and_previous_response_id_carries_the_round_trip(client):
    events = list(client.responses.create(model="smollm2", input="What is the weather like in Paris today?",
                                          tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"},
                                          max_output_tokens=60, temperature=0, stream=True))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    call = events[-1].response

    assert events[-1].type == "response.completed" and len(deltas) > 1
    (item,) = [o for o in call.output if o.type == "function_call"]
    assert item.name == "get_weather" and "".join(deltas) == item.arguments
    jsonschema.validate(json.loads(item.arguments), WEATHER)

    answer = _create(client, model="smollm2", previous_response_id=call.id, tools=TOOLS, max_output_tokens=30,
                     temperature=0, input=[{"type": "function_call_output", "call_id": item.call_id,
                                            "output": '{"celsius": 21, "sky": "sunny"}'}])
    assert answer.previous_response_id == call.id and answer.output
    assert answer.usage.input_tokens > call.usage.input_tokens  # the whole conversation was sent again


def test_stored_responses_belong_to_their_keys_owner(client, stranger):
    response = _create(client, model="smollm2", input="Say hi.", max_output_tokens=4, temperature=0)
    assert client.responses.retrieve(response.id).output_text == response.output_text

    unknown_id = "resp_" + "0" * 32
    asks = [lambda rid: stranger.responses.retrieve(rid), lambda rid: stranger.responses.delete(rid),
            lambda rid: stranger.responses.create(model="smollm2", input="Go on.", max_output_tokens=4,
                                                  previous_response_id=rid)]
    for ask in asks:  # another tenant's response answers exactly as one that never existed
        with pytest.raises(openai.NotFoundError) as theirs:
            ask(response.id)
        with pytest.raises(openai.NotFoundError) as unknown:
            ask(unknown_id)
        assert theirs.value.body["message"].replace(response.id, "ID") == \
            unknown.value.body["message"].replace(unknown_id, "ID")
        assert theirs.value.body["param"] == unknown.value.body["param"]

    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_background_responses_are_polled_and_cancelled(client, embedded_site):
    queued = client.responses.create(model="smollm2", input="Say hi.", max_output_tokens=8, background=True)
    assert queued.status == "queued"
    deadline = time.monotonic() + 120
    while (polled := client.responses.retrieve(queued.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert polled.status in ("completed", "incomplete") and polled.output_text
    Response.model_validate(polled.model_dump())

    long = client.responses.create(model="tiny", input="Count.", max_output_tokens=400, background=True)
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert embedded_site.usage(long.id)["status"] in ("aborted", "error")  # admitted or not: recorded, not billed


def test_refusals_name_what_is_wrong(client):
    with pytest.raises(openai.BadRequestError) as call_id:
        client.responses.create(model="smollm2", input=[
            {"type": "function_call_output", "call_id": "call_nope", "output": "4"}])
    assert "call_nope" in call_id.value.body["message"]

    with pytest.raises(openai.BadRequestError) as unknown:
        client.responses.create(model="smollm2", input="hi", extra_body={"colour": "blue"})
    assert unknown.value.body["param"] == "colour"

    with pytest.raises(openai.NotFoundError) as previous:
        client.responses.create(model="smollm2", input="hi", previous_response_id="resp_missing")
    assert previous.value.body["param"] == "previous_response_id"
