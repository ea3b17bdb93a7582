"""Documents past PAGODA_RAG_PASTE_MAX_CHARS are retrieved from, not pasted: the turn's prompt
carries the passages that answer it, numbered; the answer keeps them as its sources and each opens
as a passage. Ingestion is all or nothing, and a user only ever reaches their own chunks."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.webapp.test_chat_pages import alice, bob, finished_outcome, logged_in, prepare, smol  # noqa: F401
from webapp.chat.models import Message
from webapp.chat.selectors import message_to_dict
from webapp.chat.services import ChatInputError, turn_finish
from webapp.rag.models import Chunk, Document
from webapp.rag.selectors import passages_retrieve
from webapp.search.selectors import conversation_search

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]  # full-text search, transactions
FILLER = ("The harbour log notes the tide, the wind from the west, and the boats that came in with their "
          "loads of salt, slate and barley before the evening bell. ")


def paged_document(name: str, fact_page: int, fact: str, num_pages: int = 60) -> dict:
    pages = [f"Page {n}. " + FILLER * 6 for n in range(1, num_pages + 1)]
    pages[fact_page - 1] += fact
    return {"name": name, "text": "\f".join(pages)}  # as webapp.chat.documents.pdf_text writes a PDF


def fts_hits(word: str) -> int:
    """Rows of the keyword index matching ``word`` (PostgreSQL's index is over rag_chunk itself)."""
    if connection.vendor != "sqlite":
        return Chunk.objects.filter(text__icontains=word).count()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM rag_chunk_fts WHERE rag_chunk_fts MATCH %s", [word])
        return cursor.fetchone()[0]


def user_prompt(turn, tokenizer) -> str:
    return tokenizer.decode(turn.prompt_token_ids)


def test_a_long_document_is_retrieved_from_and_the_answer_cites_the_right_page(alice, smol, smollm2_hf_tokenizer):
    document = paged_document("log.pdf", 37, "The keeper's cat is called Biscuit.")
    assert len(document["text"]) > 24_000

    turn = prepare(alice, type="send", content="What is the keeper's cat called?", documents=[document])
    prompt = user_prompt(turn, smollm2_hf_tokenizer)

    assert "[1] log.pdf, page 37\n" in prompt and "Biscuit" in prompt
    assert prompt.count("Page ") < 10  # a few passages, not sixty pages
    assert turn.sources[0] == {"n": 1, "chunk": turn.sources[0]["chunk"], "document": "log.pdf", "page": 37}
    answer = turn_finish(turn=turn, outcome=finished_outcome("Biscuit [1]."))
    assert message_to_dict(answer)["sources"] == turn.sources

    passage = logged_in(alice).get(f"/rag/passages/{turn.sources[0]['chunk']}").json()
    assert passage["document"] == "log.pdf" and passage["page"] == 37 and "Biscuit" in passage["text"]
    whole = Document.objects.get().text
    assert whole[passage["start"]:passage["end"]] == passage["text"]
    assert "\f" not in passage["before"] + passage["after"]  # the context stays on that page


def test_a_later_turn_reuses_the_index_and_keeps_only_the_names_of_earlier_documents(alice, smol,
                                                                                     smollm2_hf_tokenizer):
    first = prepare(alice, type="send", content="Who is Biscuit?", documents=[paged_document("log.pdf", 5, "Biscuit.")])
    turn_finish(turn=first, outcome=finished_outcome("A cat [1]."))
    num_chunks = Chunk.objects.count()

    second = prepare(alice, type="send", conversation=first.conversation.pk, content="Which boats came with slate?")

    assert Chunk.objects.count() == num_chunks and Document.objects.count() == 1
    prompt = user_prompt(second, smollm2_hf_tokenizer)
    assert "(Attached: log.pdf)\n\nWho is Biscuit?" in prompt and "Question: Which boats came with slate?" in prompt


def test_a_refused_turn_leaves_no_half_indexed_document(alice, smol):
    document = paged_document("log.pdf", 3, "The lamp burns whale oil.")

    with pytest.raises(ChatInputError) as refused:  # ingested, then refused: the answer cannot fit
        prepare(alice, type="send", content="What does the lamp burn?", documents=[document], max_tokens=8192)

    assert refused.value.code == "context_length_exceeded"
    assert Message.objects.count() == 0 and Document.objects.count() == 0 and Chunk.objects.count() == 0
    assert fts_hits("whale") == 0


def test_a_long_document_without_words_is_refused_saying_why(alice, smol):
    with pytest.raises(ChatInputError) as refused:
        prepare(alice, type="send", content="Summarise", documents=[{"name": "scan.pdf", "text": "\f" * 30_000}])

    assert refused.value.code == "invalid_document" and "scan.pdf has no text" in refused.value.message
    assert Document.objects.count() == 0 and Chunk.objects.count() == 0


def test_a_user_never_gets_another_users_chunk(alice, bob, smol, smollm2_hf_tokenizer):
    secret = "The vault code is heliotrope."
    alices = prepare(alice, type="send", content="What is the vault code?",
                     documents=[paged_document("vault.pdf", 9, secret)])
    turn_finish(turn=alices, outcome=finished_outcome("heliotrope [1]"))
    alice_documents = list(Document.objects.filter(owner=alice).values_list("id", flat=True))
    alice_chunk = alices.sources[0]["chunk"]

    bobs = prepare(bob, type="send", content="What is the vault code? heliotrope",
                   documents=[paged_document("mine.pdf", 2, "My boat is blue.")])

    assert "heliotrope" not in user_prompt(bobs, smollm2_hf_tokenizer).replace(
        "What is the vault code? heliotrope", "")  # the prompt: only his own question says it
    assert all(s["document"] == "mine.pdf" for s in bobs.sources)  # citations
    assert passages_retrieve(owner_id=bob.pk, document_ids=alice_documents, question="vault code heliotrope",
                             max_chars=10_000, max_passages=6) == []  # even naming her documents
    assert logged_in(bob).get(f"/rag/passages/{alice_chunk}").status_code == 404  # the side panel
    assert conversation_search(user=bob, text="heliotrope vault")[0].conversation_id == bobs.conversation.pk
    assert all(hit.conversation_id == bobs.conversation.pk for hit in conversation_search(user=bob, text="vault"))
    assert logged_in(alice).get(f"/rag/passages/{alice_chunk}").status_code == 200


def test_retrieval_latency_and_prompt_tokens_against_pasting_the_whole_text(alice, smol, smollm2_hf_tokenizer):
    """A printout, not a timing assertion: indexing and retrieval for a 60-page document, and the
    prompt tokens of the retrieved turn against the whole text's."""
    import time

    from webapp.rag.services import documents_ingest

    document = paged_document("log.pdf", 41, "The keeper's cat is called Biscuit.")
    turn = prepare(alice, type="send", content="What is the keeper's cat called?", documents=[document])
    Document.objects.all().delete()
    started = time.perf_counter()
    documents = documents_ingest(message=turn.user_message)
    indexed = time.perf_counter()
    timings = []
    for _ in range(20):
        begun = time.perf_counter()
        passages = passages_retrieve(owner_id=alice.pk, document_ids=[d.pk for d in documents],
                                     question="What is the keeper's cat called?", max_chars=6144, max_passages=6)
        timings.append(time.perf_counter() - begun)
    whole_tokens = len(smollm2_hf_tokenizer.encode(document["text"]))
    print(f"\n60 pages, {len(document['text']):,} chars, {Chunk.objects.count()} chunks: indexed in "
          f"{1000 * (indexed - started):.1f} ms; retrieval median {1000 * sorted(timings)[10]:.2f} ms; "
          f"prompt {len(turn.prompt_token_ids)} tokens with retrieval, {whole_tokens} for the whole text alone")
    assert passages[0].page == 41 and len(turn.prompt_token_ids) < whole_tokens // 4
