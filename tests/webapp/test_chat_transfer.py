"""Export and import of conversations through the chat's URLs: Markdown of the path shown, JSON of
every branch, and an import of that JSON that recreates the trees equal; anything else (not an
export, changed, another user's, broken half-way) is refused and creates nothing."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone

from webapp.chat.models import Conversation, Message
from webapp.chat.selectors import Tree
from webapp.chat.transfer import sign

pytestmark = pytest.mark.django_db


def user_client(name: str):
    user = get_user_model().objects.create_user(name, password="pw")
    client = Client()
    client.force_login(user)
    return user, client


def add(conversation, role, content, parent=None, **fields) -> Message:
    message = Message(conversation=conversation, role=role, content=content, parent=parent, **fields)
    message.root = parent is None
    message.save()
    return message


def branched_conversation(user, title="Branches") -> Conversation:
    """q1 edited into q1b (two roots); q1 answered twice; q1b's answer followed by q2 and its answer."""
    c = Conversation.objects.create(user=user, title=title, model_name="smollm2", system_prompt="Be brief.",
                                    sampling={"temperature": 0.3, "max_tokens": 64, "stop": ["END"]})
    q1 = add(c, "user", "What is 2+2?", attachments=[{"name": "notes.md", "text": "# sums\n2+2=4"}])
    add(c, "assistant", "4", q1, model_name="smollm2", prompt_tokens=12, completion_tokens=1, finish_reason="stop")
    add(c, "assistant", "Four.\n\n```python\nprint(2 + 2)\n```", q1, model_name="smollm2", finish_reason="length")
    q1b = add(c, "user", "What is 3+3?")
    a1b = add(c, "assistant", "6", q1b, model_name="smollm2", cached_prompt_tokens=4, finish_reason="stop")
    q2 = add(c, "user", "And times 2?", a1b)
    a2 = add(c, "assistant", "12", q2, finish_reason="abort")
    Message.objects.filter(pk=q1.pk).update(created_at=timezone.now() - timedelta(days=3))
    Conversation.objects.filter(pk=c.pk).update(current_leaf=a2)
    c.refresh_from_db()
    return c


def tree(conversation: Conversation):
    """The conversation as nested data without database ids: each message, its fields and its
    children in the order written; and the path shown."""
    t = Tree(conversation)

    def node(m):
        return (m.role, m.content, tuple((d["name"], d["text"]) for d in m.attachments), m.model_name,
                m.prompt_tokens, m.completion_tokens, m.cached_prompt_tokens, m.finish_reason, m.created_at,
                tuple(node(child) for child in t.children.get(m.pk, [])))

    return ((conversation.title, conversation.model_name, conversation.system_prompt, conversation.sampling,
             conversation.created_at), tuple(node(m) for m in t.children.get(None, [])),
            tuple(m.content for m in t.path_to(t.leaf())))


def upload(client, document, name="export.json"):
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    return client.post("/import", {"file": SimpleUploadedFile(name, body, content_type="application/json")})


def test_all_conversations_round_trip_through_json_with_every_branch():
    alice, client = user_client("alice")
    originals = [branched_conversation(alice), branched_conversation(alice, "Second")]
    Conversation.objects.create(user=alice, title="Empty")
    exported = client.get("/export/conversations.json")
    assert exported.status_code == 200 and "attachment" in exported["Content-Disposition"]
    before = {c.pk: tree(c) for c in Conversation.objects.filter(user=alice)}

    response = upload(client, exported.content)

    assert response.status_code == 302
    imported = Conversation.objects.filter(user=alice).exclude(pk__in=before)
    assert sorted(tree(c) for c in imported) == sorted(before.values())  # equal trees, branches and shown path
    assert len(Tree(originals[0]).children[None]) == 2  # the two versions of the first question are there
    again = json.loads(client.get("/export/conversations.json").content)
    assert again["owner"] == {"id": alice.pk, "username": "alice"}


def test_one_conversation_round_trips_and_its_markdown_shows_the_path():
    alice, client = user_client("alice")
    c = branched_conversation(alice)
    markdown = client.get(f"/c/{c.pk}/export.md").content.decode()
    exported = client.get(f"/c/{c.pk}/export.json")

    response = upload(client, exported.content)

    copy = Conversation.objects.filter(user=alice).exclude(pk=c.pk).get()
    assert response["Location"] == f"/c/{copy.pk}/"
    assert tree(copy) == tree(c)
    assert markdown.startswith("# Branches\n")
    assert "**System prompt**\n\n> Be brief." in markdown
    # The path shown (3+3, 6, times 2, 12), not the other branch; the versions counted.
    assert [line for line in markdown.splitlines() if line.startswith("## ")] == [
        "## You", "## smollm2", "## You", "## Assistant"]
    assert "What is 3+3?" in markdown and "What is 2+2?" not in markdown
    assert "*(one of 2 versions of this message; the JSON export holds them all)*" in markdown


def test_another_users_conversation_cannot_be_exported():
    alice, _ = user_client("alice")
    _, bob_client = user_client("bob")
    c = branched_conversation(alice)
    assert bob_client.get(f"/c/{c.pk}/export.json").status_code == 404
    assert json.loads(bob_client.get("/export/conversations.json").content)["conversations"] == []


def refused(client, document) -> str:
    before = (Conversation.objects.count(), Message.objects.count())
    response = upload(client, document)
    assert response.status_code == 400
    assert (Conversation.objects.count(), Message.objects.count()) == before, "a refused import created something"
    return response.content.decode()


def test_anything_but_this_users_unchanged_export_is_refused_and_creates_nothing():
    alice, alice_client = user_client("alice")
    bob, bob_client = user_client("bob")
    branched_conversation(alice)
    export = json.loads(alice_client.get("/export/conversations.json").content)

    assert "another account" in refused(bob_client, export)  # alice's own file, signed, in bob's hands
    forged = dict(export, owner={"id": bob.pk, "username": "bob"})  # alice's file claiming to be bob's
    assert "not made by this site, or it was changed" in refused(bob_client, forged)
    assert "not made by this site, or it was changed" in refused(bob_client, sign(forged) | {"signature": "x"})
    edited = json.loads(json.dumps(export))
    edited["conversations"][0]["messages"][1]["content"] = "5"
    assert "changed" in refused(alice_client, edited)
    assert "not a Pagoda conversations export" in refused(alice_client, b"%PDF-1.4 not json")
    assert "not a Pagoda conversations export" in refused(alice_client, {"messages": []})
    assert "not a Pagoda conversations export" in refused(alice_client, [1, 2])
    shared = {"format": "pagoda-shared", "title": "x", "messages": []}
    assert "not a Pagoda conversations export" in refused(alice_client, shared)


def test_a_signed_export_broken_in_its_last_conversation_creates_none_of_them():
    alice, client = user_client("alice")
    branched_conversation(alice)
    branched_conversation(alice, "Second")
    export = json.loads(client.get("/export/conversations.json").content)
    broken = json.loads(json.dumps(export))
    broken["conversations"][-1]["messages"][-1]["parent"] = 99  # a parent the conversation lacks
    assert "parent" in refused(client, sign(broken))
    loop = json.loads(json.dumps(export))
    loop["conversations"][-1]["messages"][0]["parent"] = loop["conversations"][-1]["messages"][0]["id"]
    assert "parent" in refused(client, sign(loop))
    bad_role = json.loads(json.dumps(export))
    bad_role["conversations"][-1]["messages"][0]["role"] = "system"
    assert "role" in refused(client, sign(bad_role))
    bad_sampling = json.loads(json.dumps(export))
    bad_sampling["conversations"][-1]["sampling"] = {"temperature": 9}
    assert "temperature" in refused(client, sign(bad_sampling))


def test_importing_needs_a_login_and_a_post():
    assert Client().post("/import").status_code == 302
    _, client = user_client("alice")
    assert client.get("/import").status_code == 405
    assert "No file" in client.post("/import").content.decode()
