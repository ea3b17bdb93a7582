"""Read-only share links: what a link shows, to whom, and that revoking and later edits hold."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from webapp.chat.models import Conversation, Message
from webapp.sharing.models import SharedConversation

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]


@pytest.fixture
def alice():
    return get_user_model().objects.create_user("alice", password="alice-pw-123")


@pytest.fixture
def bob():
    return get_user_model().objects.create_user("bob", password="bob-pw-123")


@pytest.fixture
def staff():
    return get_user_model().objects.create_user("root", password="root-pw-123", is_staff=True)


@pytest.fixture
def conversation(alice):
    conversation = Conversation.objects.create(user=alice, title="Seabirds")
    for role, text in [("user", "Which bird glides longest?"), ("assistant", "The **albatross**."),
                       ("user", "And the fastest?"), ("assistant", "The peregrine falcon, diving.")]:
        Message.objects.create(conversation=conversation, role=role, content=text)
    return conversation


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def share(client: Client, conversation: Conversation, messages: str = "") -> SharedConversation:
    response = client.post("/shared/new", {"conversation": conversation.pk, "messages": messages})
    assert response.status_code == 302, response.content[:400]
    created = int(re.search(r"created=(\d+)", response["Location"]).group(1))
    return SharedConversation.objects.get(pk=created)


def shared_state(response) -> dict:
    import json

    html = response.content.decode()
    return json.loads(re.search(r'<script id="shared-state" type="application/json">(.*?)</script>', html, re.S)[1])


def test_a_shared_link_shows_the_conversation_read_only_to_a_logged_in_user(alice, bob, conversation):
    link = share(client_of(alice), conversation)
    assert len(link.token) >= 40  # 256 random bits, URL-safe
    response = client_of(bob).get(f"/s/{link.token}/")
    assert response.status_code == 200
    state = shared_state(response)
    assert state["title"] == "Seabirds"
    assert [(m["role"], m["content"]) for m in state["messages"]] == [
        (m.role, m.content) for m in conversation.messages.all()]
    html = response.content.decode()
    for control in ("<textarea", "<input", "<form", "chat/chat.js"):
        assert control not in html  # nothing to type into, no socket script
    assert response["X-Robots-Tag"] == "noindex, nofollow"
    assert "no-store" in response["Cache-Control"]


def test_anonymous_visitors_need_a_login_until_staff_allow_them(alice, staff, conversation):
    link = share(client_of(alice), conversation)
    anonymous = Client()
    refused = anonymous.get(f"/s/{link.token}/")
    assert refused.status_code == 302 and refused["Location"].startswith("/accounts/login/?next=")

    assert client_of(alice).post("/shared/settings", {"allow_anonymous": "on"}).status_code == 403  # staff only
    assert anonymous.get("/shared/settings").status_code == 302
    admin = client_of(staff)
    assert admin.get("/shared/settings").status_code == 200
    assert admin.post("/shared/settings", {"allow_anonymous": "on"}).status_code == 302
    assert anonymous.get(f"/s/{link.token}/").status_code == 200
    assert "Anyone with the link can read it" in client_of(alice).get("/shared/").content.decode()

    admin.post("/shared/settings", {})  # unchecked
    assert anonymous.get(f"/s/{link.token}/").status_code == 302


def test_a_revoked_link_is_not_found_for_everyone(alice, staff, conversation):
    client_of(staff).post("/shared/settings", {"allow_anonymous": "on"})
    owner = client_of(alice)
    link = share(owner, conversation)
    assert owner.post(f"/shared/{link.pk}/revoke").status_code == 302
    assert owner.get(f"/s/{link.token}/").status_code == 404
    assert Client().get(f"/s/{link.token}/").status_code == 404
    listing = owner.get("/shared/").content.decode()
    assert "revoked" in listing and link.token not in listing  # the dead link is no longer offered
    assert Client().get("/s/not-a-real-token/").status_code == 404


def test_only_the_owner_can_revoke_a_link(alice, bob, conversation):
    link = share(client_of(alice), conversation)
    assert client_of(bob).post(f"/shared/{link.pk}/revoke").status_code == 404
    assert client_of(bob).get(f"/s/{link.token}/").status_code == 200
    assert f'data-id="{link.pk}"' not in client_of(bob).get("/shared/").content.decode()


def test_the_snapshot_does_not_change_when_the_conversation_does(alice, conversation):
    owner = client_of(alice)
    link = share(owner, conversation)
    before = shared_state(owner.get(f"/s/{link.token}/"))
    first = conversation.messages.first()
    first.content = "edited afterwards"
    first.save()
    Message.objects.create(conversation=conversation, role="user", content="a later question")
    conversation.title = "Renamed"
    conversation.save()
    assert shared_state(owner.get(f"/s/{link.token}/")) == before


def test_sharing_takes_the_messages_on_screen_in_their_order(alice, conversation):
    ids = list(conversation.messages.values_list("pk", flat=True))
    link = share(client_of(alice), conversation, messages=f"{ids[0]},{ids[1]}")
    assert [m["content"] for m in link.messages] == ["Which bird glides longest?", "The **albatross**."]


def test_sharing_without_a_message_list_takes_the_branch_shown_not_every_version(alice, conversation):
    question, answer, follow_up, _ = conversation.messages.order_by("pk")
    # The follow-up question edited: a sibling, which the conversation now shows, and its answer.
    edited = Message.objects.create(conversation=conversation, role="user", content="And the slowest?",
                                    parent=answer)
    reply = Message.objects.create(conversation=conversation, role="assistant", content="The woodcock.",
                                   parent=edited)
    conversation.current_leaf = reply
    conversation.save()

    link = share(client_of(alice), conversation)

    assert [m["content"] for m in link.messages] == [
        "Which bird glides longest?", "The **albatross**.", "And the slowest?", "The woodcock."]


@pytest.mark.parametrize("messages", ["1,x", "999999", "{0},{0}"])
def test_bad_message_lists_are_refused_naming_the_field(alice, conversation, messages):
    first = conversation.messages.first().pk
    response = client_of(alice).post("/shared/new", {"conversation": conversation.pk,
                                                     "messages": messages.format(first)})
    assert response.status_code == 400
    assert 'data-param="messages"' in response.content.decode()
    assert not SharedConversation.objects.exists()


def test_nobody_can_share_another_users_conversation(bob, conversation):
    assert client_of(bob).post("/shared/new", {"conversation": conversation.pk}).status_code == 404
    assert Client().post("/shared/new", {"conversation": conversation.pk}).status_code == 302  # to login
    assert not SharedConversation.objects.exists()


def test_an_empty_conversation_cannot_be_shared(alice):
    empty = Conversation.objects.create(user=alice, title="")
    response = client_of(alice).post("/shared/new", {"conversation": empty.pk})
    assert response.status_code == 400 and "nothing to share" in response.content.decode()


def test_deleting_the_conversation_removes_its_links(alice, conversation):
    link = share(client_of(alice), conversation)
    client_of(alice).post(f"/c/{conversation.pk}/delete")
    assert Client().get(f"/s/{link.token}/").status_code == 404
    assert not SharedConversation.objects.exists()


def test_the_chat_sidebar_offers_search_and_sharing(alice, conversation):
    html = client_of(alice).get(f"/c/{conversation.pk}/").content.decode()
    assert 'type="search"' in html and 'action="/search/"' in html
    assert 'action="/shared/new"' in html and f'name="conversation" value="{conversation.pk}"' in html
    assert "search/search.js" in html


def test_staff_can_also_set_it_in_the_admin_and_that_is_the_setting_the_site_reads(alice, conversation):
    root = get_user_model().objects.create_superuser("admin", password="admin-pw-123")
    admin = client_of(root)
    assert admin.post("/admin/sharing/sharingsettings/add/", {"allow_anonymous": "on"}).status_code == 302
    assert admin.get("/admin/sharing/sharingsettings/add/").status_code == 403  # one row only
    link = share(client_of(alice), conversation)
    assert Client().get(f"/s/{link.token}/").status_code == 200
