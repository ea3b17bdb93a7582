"""Branches over the chat socket: editing a message or answering it again adds a version beside it,
the page moves between versions ("switch"), and the next turn's prompt is the path shown.

The embedded transport and an embedded worker serving the tiny random Llama, in this process."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from engine.text.tokenizer import apply_chat_template
from webapp.chat.models import Message

from tests.webapp.test_chat_consumer import (alice, chat_worker, communicator, models, receive_until,  # noqa: F401
                                             session_cookie, turn)

pytestmark = pytest.mark.django_db(transaction=True)


async def ask(ws, **fields) -> dict:
    await ws.send_json_to(turn(max_tokens=6, **fields))
    frames = await receive_until(ws, "done", "error")
    assert frames[-1]["type"] == "done", frames[-1]
    return {"start": frames[0], "done": frames[-1]}


def shown(path: list[dict]) -> list[tuple]:
    return [(m["role"], m["content"], m["index"], len(m["siblings"])) for m in path]


@pytest.mark.asyncio
async def test_editing_twice_keeps_three_versions_each_with_its_own_continuation(
        models, session_cookie, chat_worker, smollm2_hf_tokenizer):
    ws = communicator(session_cookie)
    assert (await ws.connect())[0]
    first = await ask(ws, content="one")
    conversation = first["start"]["conversation"]["id"]
    question = first["start"]["user_message"]["id"]
    await ask(ws, conversation=conversation, content="after one")
    second = await ask(ws, type="edit", conversation=conversation, message=question, content="two")
    third = await ask(ws, type="edit", conversation=conversation, message=question, content="three")
    await ws.send_json_to({"type": "switch", "conversation": conversation, "message": question})
    back_to_first = await ws.receive_json_from(timeout=10)
    # The next turn continues the branch shown: its prompt is "one", its answer, "after one"... and "more".
    more = await ask(ws, conversation=conversation, content="more", parent=back_to_first["messages"][-1]["id"])
    await ws.send_json_to({"type": "switch", "conversation": conversation, "message": question + 999})
    missing = await ws.receive_json_from(timeout=10)
    await ws.disconnect()

    assert shown(third["start"]["path"]) == [("user", "three", 3, 3)]
    assert shown(second["start"]["path"]) == [("user", "two", 2, 2)]  # the third version came later
    path = back_to_first["messages"]
    answers = [m["content"] for m in path if m["role"] == "assistant"]
    assert [(m["role"], m["content"]) for m in path] == [
        ("user", "one"), ("assistant", answers[0]), ("user", "after one"), ("assistant", answers[1])]
    assert path[0]["index"] == 1 and len(path[0]["siblings"]) == 3
    history = [{"role": m["role"], "content": m["content"]} for m in path] + [{"role": "user", "content": "more"}]
    assert more["done"]["usage"]["prompt_tokens"] == len(apply_chat_template(smollm2_hf_tokenizer, history))
    assert missing["type"] == "error" and missing["param"] == "message"
    # Nothing was deleted: 5 questions (one, after one, two, three, more) and their 5 answers.
    assert await sync_to_async(Message.objects.filter(role="user").count)() == 5
    assert await sync_to_async(Message.objects.filter(role="assistant").count)() == 5


@pytest.mark.asyncio
async def test_regenerating_an_answer_shows_it_as_version_two_of_two(models, session_cookie, chat_worker):
    ws = communicator(session_cookie)
    assert (await ws.connect())[0]
    first = await ask(ws, content="Hello", temperature=1.0, seed=1)
    conversation = first["start"]["conversation"]["id"]
    again = await ask(ws, type="regenerate", conversation=conversation, message=first["done"]["message"]["id"])
    await ws.send_json_to({"type": "switch", "conversation": conversation, "message": first["done"]["message"]["id"]})
    back = await ws.receive_json_from(timeout=10)
    await ws.disconnect()

    answer = again["done"]["message"]
    assert (answer["index"], answer["siblings"]) == (2, [first["done"]["message"]["id"], answer["id"]])
    assert again["start"]["path"][-1]["content"] == "Hello" and len(again["start"]["path"]) == 1
    assert back["messages"][-1]["id"] == first["done"]["message"]["id"] and back["messages"][-1]["index"] == 1
