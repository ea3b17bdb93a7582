"""Documents attached to a chat message, up to PAGODA_RAG_PASTE_MAX_CHARS: the whole text joins the prompt, stays
with the message for every later turn, and a turn that does not fit the model's context is
refused with a message saying so, before anything is saved."""

from __future__ import annotations

import pytest

from engine.text.tokenizer import apply_chat_template
from webapp.chat.documents import prompt_text
from webapp.chat.models import Message
from webapp.chat.selectors import message_to_dict
from webapp.chat.services import ChatInputError, turn_finish

from tests.webapp.test_chat_pages import alice, prepare, smol  # noqa: F401
from tests.webapp.test_chat_pages import finished_outcome

pytestmark = pytest.mark.django_db
LINES = [f"{i:04d}: the keeper logged the tide at {i % 24:02d}:00 and wrote down the ships he saw." for i in range(260)]
DOCUMENT = {"name": "log.txt", "text": "\n".join(LINES)}  # about 20 KB


@pytest.mark.slow
def test_a_20_kb_document_reaches_the_prompt_whole_and_stays_for_the_next_turn(alice, smol, smollm2_hf_tokenizer):
    assert 19_000 < len(DOCUMENT["text"]) < 22_000
    first = prepare(alice, type="send", content="What was logged at line 0003?", documents=[DOCUMENT])
    turn_finish(turn=first, outcome=finished_outcome("The tide at 03:00."))
    second = prepare(alice, type="send", conversation=first.conversation.pk, content="And line 0200?")

    with_document = f'<document name="log.txt">\n{DOCUMENT["text"]}\n</document>\n\nWhat was logged at line 0003?'
    assert first.prompt_token_ids == apply_chat_template(smollm2_hf_tokenizer, [
        {"role": "user", "content": with_document}])
    assert smollm2_hf_tokenizer.decode(first.prompt_token_ids).count("0003: the keeper") == 1
    assert second.prompt_token_ids == apply_chat_template(smollm2_hf_tokenizer, [
        {"role": "user", "content": with_document}, {"role": "assistant", "content": "The tide at 03:00."},
        {"role": "user", "content": "And line 0200?"}])
    # The first prompt, the document in it, is where the second one starts: the prefix cache serves it.
    shared = len(first.prompt_token_ids) - 8
    assert second.prompt_token_ids[:shared] == first.prompt_token_ids[:shared]
    stored = Message.objects.get(pk=first.user_message.pk)
    assert stored.content == "What was logged at line 0003?" and stored.attachments == [DOCUMENT]
    assert message_to_dict(stored)["documents"] == ["log.txt"]


def test_a_document_that_does_not_fit_the_context_is_refused_saying_so(alice, smol, settings):
    settings.PAGODA_RAG_PASTE_MAX_CHARS = 1_000_000  # pasted whole (past the default, it is retrieved from)
    big = {"name": "big.md", "text": "word " * 40_000}

    with pytest.raises(ChatInputError) as refused:
        prepare(alice, type="send", content="Summarise", documents=[big], max_tokens=100)

    assert refused.value.code == "context_length_exceeded" and refused.value.param == "documents"
    assert "big.md" in refused.value.message and "reads at most 8192" in refused.value.message
    assert Message.objects.count() == 0


@pytest.mark.parametrize("document, words", [
    ({"name": "photo.png", "text": "x"}, "only text files"),
    ({"name": "data.csv", "text": "a,b\x00c"}, "not a text file"),
    ({"name": "", "text": "x"}, "needs a name"),
    ({"name": "a.txt", "text": "x" * 300_001}, "more than 300,000 characters"),
])
def test_a_file_that_is_not_text_is_refused_naming_it(alice, smol, document, words):
    with pytest.raises(ChatInputError) as refused:
        prepare(alice, type="send", content="Read this", documents=[document])

    assert refused.value.code == "invalid_document" and refused.value.param == "documents"
    assert words in refused.value.message
    assert Message.objects.count() == 0


def test_an_edited_message_keeps_its_documents(alice, smol):
    first = prepare(alice, type="send", content="Read this", documents=[{"name": "a.py", "text": "print(1)"}])

    edited = prepare(alice, type="edit", conversation=first.conversation.pk, message=first.user_message.pk,
                     content="Read this, please")

    assert edited.user_message.attachments == [{"name": "a.py", "text": "print(1)"}]
    assert prompt_text(content="hi", attachments=[]) == "hi"
