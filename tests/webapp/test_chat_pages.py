"""The chat page's HTTP side and its services: login, the sidebar's rename/delete, how a turn
(send, edit, regenerate) becomes the prompt, and the first-login admin account."""

from __future__ import annotations

import re
import time
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from engine.text.tokenizer import apply_chat_template
from webapp.chat.models import Conversation, Message
from webapp.chat.services import ChatInputError, turn_finish, turn_prepare
from webapp.usage.outcome import Outcome
from webapp.registry.models import Model, ModelVersion
from webapp.usage.models import UsageRecord
from workers.protocol import Chunk

pytestmark = pytest.mark.django_db


@pytest.fixture
def smol(smollm2_tokenizer_dir, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    ModelVersion.objects.create(model=Model.objects.create(slug="smol"), number=1, path=str(gguf), format="gguf",
                                status="active", tokenizer_dir=str(smollm2_tokenizer_dir))
    ModelVersion.objects.create(model=Model.objects.create(slug="retired"), number=1, path=str(gguf),
                                format="gguf", status="inactive")


@pytest.fixture
def alice():
    return get_user_model().objects.create_user("alice", password="alice-pw-123")


@pytest.fixture
def bob():
    return get_user_model().objects.create_user("bob", password="bob-pw-123")


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def conversation_of(user, *turns: tuple[str, str]) -> Conversation:
    conversation = Conversation.objects.create(user=user, title=turns[0][1][:60] if turns else "")
    for role, content in turns:
        Message.objects.create(conversation=conversation, role=role, content=content)
    return conversation


def prepare(user, **data):
    return turn_prepare(user=user, data={"model": "smol", "system_prompt": "", **data}, started=time.monotonic())


def test_the_chat_page_needs_a_login_and_the_login_form_works(alice, smol):
    client = Client()
    assert client.get("/").url.startswith("/accounts/login/")

    response = client.post("/accounts/login/", {"username": "alice", "password": "alice-pw-123", "next": "/"})
    assert response.status_code == 302 and response.url == "/"
    page = client.get("/")
    assert page.status_code == 200 and b'id="composer"' in page.content

    client.post("/accounts/logout/")
    assert client.get("/").status_code == 302


def test_wrong_password_shows_an_error(alice):
    response = Client().post("/accounts/login/", {"username": "alice", "password": "nope"})
    assert response.status_code == 200 and b'class="form-error" role="alert"' in response.content


def test_the_page_lists_only_the_users_conversations_and_the_active_models(alice, bob, smol):
    mine = conversation_of(alice, ("user", "my question"))
    conversation_of(bob, ("user", "bob's secret"))

    page = logged_in(alice).get(f"/c/{mine.pk}/").content.decode()

    assert "my question" in page and "bob&#x27;s secret" not in page and "bob's secret" not in page
    assert '<option value="smol">' in page and "retired" not in page


def test_a_message_with_markup_reaches_the_page_only_as_json_text(alice, smol):
    conversation = conversation_of(alice, ("user", "<img src=x onerror=alert(1)>"))

    page = logged_in(alice).get(f"/c/{conversation.pk}/").content.decode()

    assert "<img src=x" not in page
    assert r"\u003Cimg src=x onerror=alert(1)\u003E" in page  # json_script escapes < and >


def test_another_users_conversation_cannot_be_opened_renamed_or_deleted(alice, bob, smol):
    theirs = conversation_of(bob, ("user", "hello"))
    client = logged_in(alice)

    assert client.get(f"/c/{theirs.pk}/").status_code == 404
    assert client.post(f"/c/{theirs.pk}/rename", {"title": "mine now"}).status_code == 404
    assert client.post(f"/c/{theirs.pk}/delete").status_code == 404
    theirs.refresh_from_db()
    assert theirs.title == "hello"


def test_rename_and_delete(alice, smol):
    conversation = conversation_of(alice, ("user", "hello"))
    client = logged_in(alice)

    client.post(f"/c/{conversation.pk}/rename", {"title": "  Greetings  "})
    conversation.refresh_from_db()
    assert conversation.title == "Greetings"
    assert client.post(f"/c/{conversation.pk}/delete").url == "/"
    assert not Conversation.objects.exists() and not Message.objects.exists()


def test_send_prompts_with_the_whole_history_through_the_chat_template(alice, smol, smollm2_hf_tokenizer):
    conversation = conversation_of(alice, ("user", "Hi"), ("assistant", "Hello! How can I help?"))

    turn = prepare(alice, type="send", conversation=conversation.pk, content="Name a colour.",
                   system_prompt="Be brief.", temperature="0.3", top_p="0.9", max_tokens="20")

    expected = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello! How can I help?"},
                {"role": "user", "content": "Name a colour."}]
    assert turn.prompt_token_ids == apply_chat_template(smollm2_hf_tokenizer, expected)
    assert turn.params == {"max_tokens": 20, "temperature": 0.3, "top_p": 0.9}
    conversation.refresh_from_db()
    assert (conversation.model_name, conversation.system_prompt) == ("smol", "Be brief.")


def test_a_turn_belongs_to_the_user_at_the_weight_of_their_chat_limits(alice, bob, smol):
    from webapp.keys.services import chatlimits_get_or_create, chatlimits_update

    chatlimits_update(limits=chatlimits_get_or_create(user=bob), fair_share_weight=2.5)
    alices, bobs = prepare(alice, type="send", content="Hi").engine_request(), prepare(
        bob, type="send", content="Hi").engine_request()

    assert (alices.tenant, alices.tenant_weight) == (f"user:{alice.pk}", 1.0)
    assert (bobs.tenant, bobs.tenant_weight) == (f"user:{bob.pk}", 2.5)


def test_a_first_message_creates_a_conversation_titled_after_it(alice, smol):
    turn = prepare(alice, type="send", content="What is   a pagoda?\nExplain.")

    assert turn.conversation.title == "What is a pagoda? Explain."
    assert list(turn.conversation.messages.values_list("role", "content")) == [
        ("user", "What is   a pagoda?\nExplain.")]


def test_editing_an_earlier_message_adds_a_version_and_keeps_what_followed_the_original(
        alice, smol, smollm2_hf_tokenizer):
    from webapp.chat.selectors import message_path

    conversation = conversation_of(alice, ("user", "one"), ("assistant", "1"), ("user", "two"), ("assistant", "2"))
    first = conversation.messages.first()

    turn = prepare(alice, type="edit", conversation=conversation.pk, message=first.pk, content="uno")

    assert list(conversation.messages.values_list("role", "content")) == [
        ("user", "one"), ("assistant", "1"), ("user", "two"), ("assistant", "2"), ("user", "uno")]
    assert turn.user_message.parent is None and turn.user_message.pk != first.pk
    assert turn.prompt_token_ids == apply_chat_template(smollm2_hf_tokenizer, [{"role": "user", "content": "uno"}])
    conversation.refresh_from_db()
    assert [m.content for m in message_path(conversation=conversation)] == ["uno"]


def test_regenerate_answers_the_last_question_again_beside_the_first_answer(alice, smol):
    from webapp.chat.selectors import message_path_dicts

    conversation = conversation_of(alice, ("user", "one"), ("assistant", "1"), ("user", "two"), ("assistant", "2"))

    turn = prepare(alice, type="regenerate", conversation=conversation.pk)
    turn_finish(turn=turn, outcome=finished_outcome("2 again"))

    assert list(conversation.messages.values_list("content", flat=True)) == ["one", "1", "two", "2", "2 again"]
    assert turn.user_message.content == "two"
    conversation.refresh_from_db()
    shown = message_path_dicts(conversation=conversation)
    assert [(m["content"], m["index"], len(m["siblings"])) for m in shown] == [
        ("one", 1, 1), ("1", 1, 1), ("two", 1, 1), ("2 again", 2, 2)]


def test_the_next_turn_continues_from_the_branch_shown(alice, smol, smollm2_hf_tokenizer):
    from webapp.chat.services import conversation_switch

    conversation = conversation_of(alice, ("user", "one"), ("assistant", "1"))
    first_question, first_answer = conversation.messages.all()
    edited = prepare(alice, type="edit", conversation=conversation.pk, message=first_question.pk, content="uno")
    turn_finish(turn=edited, outcome=finished_outcome("I"))
    conversation.refresh_from_db()
    assert [m.content for m in conversation_switch(conversation=conversation, message_id=first_question.pk)] == [
        "one", "1"]

    turn = prepare(alice, type="send", conversation=conversation.pk, content="two")

    assert turn.user_message.parent_id == first_answer.pk
    assert turn.prompt_token_ids == apply_chat_template(smollm2_hf_tokenizer, [
        {"role": "user", "content": "one"}, {"role": "assistant", "content": "1"}, {"role": "user", "content": "two"}])


def finished_outcome(text: str) -> Outcome:
    outcome = Outcome()
    outcome.add(Chunk("r", text, [1, 2], None, True, "stop", num_prompt_tokens=3, num_output_tokens=2,
                      num_cached_tokens=0, time_to_first_token=0.01))
    return outcome


@pytest.mark.parametrize("data, param", [
    ({"type": "send", "content": "  "}, "content"),
    ({"type": "send", "content": "hi", "temperature": "3"}, "temperature"),
    ({"type": "send", "content": "hi", "max_tokens": "lots"}, "max_tokens"),
    ({"type": "send", "content": "hi", "model": "retired"}, "model"),
    ({"type": "edit", "conversation": None, "content": "x"}, "conversation"),
    ({"type": "dance"}, "type"),
])
def test_bad_turns_are_refused_naming_the_field_and_save_nothing(alice, smol, data, param):
    with pytest.raises(ChatInputError) as refused:
        prepare(alice, **data)
    assert refused.value.param == param
    assert not Message.objects.exists()


def test_a_foreign_conversation_id_reads_as_missing(alice, bob, smol):
    theirs = conversation_of(bob, ("user", "hello"))
    with pytest.raises(ChatInputError) as refused:
        prepare(alice, type="send", conversation=theirs.pk, content="hijack")
    assert refused.value.code == "not_found" and theirs.messages.count() == 1


def test_finishing_a_turn_saves_the_answer_and_its_usage(alice, smol):
    turn = prepare(alice, type="send", content="hi")
    outcome = Outcome()
    outcome.add(Chunk(turn.request_id, "Hello", [1, 2], None, True, "stop", num_prompt_tokens=30,
                      num_output_tokens=2, num_cached_tokens=16, time_to_first_token=0.05))

    message = turn_finish(turn=turn, outcome=outcome)

    assert (message.role, message.content, message.model_name, message.prompt_tokens, message.completion_tokens,
            message.cached_prompt_tokens, message.finish_reason) == ("assistant", "Hello", "smol", 30, 2, 16, "stop")
    usage = UsageRecord.objects.get(request_id=turn.request_id)
    assert (usage.user, usage.api_key, usage.status, usage.cached_prompt_tokens) == (alice, None, "ok", 16)


def test_ensure_admin_creates_one_superuser_once_and_prints_its_password():
    out = StringIO()
    call_command("ensure_admin", stdout=out)
    password = re.search(r"password: (\S+)", out.getvalue()).group(1)
    assert Client().login(username="admin", password=password)

    again = StringIO()
    call_command("ensure_admin", stdout=again)
    assert password not in again.getvalue()
    assert get_user_model().objects.filter(is_superuser=True).count() == 1
