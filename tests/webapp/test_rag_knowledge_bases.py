"""Knowledge bases: named collections of documents, a user's or a team's, filled on their page and
attached to a conversation, whose turns then retrieve from them with citations.

The ownership rule, tested here through every way a chunk can come out (retrieval into the prompt,
the answer's citations, the passage endpoint, the chat page's list): a base is read by its owner,
or by the members of its team *now*; retrieval is evaluated as the user sending the turn, so the
same conversation with the same base attached retrieves nothing from it once its user has left the
team; and a conversation is only ever continued by its own user (others get not_found).
"""

from __future__ import annotations

import json

import pytest

from tests.webapp.orgs_fixtures import team
from tests.webapp.test_chat_pages import alice, bob, finished_outcome, logged_in, prepare, smol  # noqa: F401
from tests.webapp.test_rag_retrieval import fts_hits, paged_document, user_prompt
from webapp.chat.services import ChatInputError, turn_finish
from webapp.orgs.models import Membership
from webapp.orgs.services import membership_remove
from webapp.rag.knowledge import KnowledgeError, base_create, document_add
from webapp.rag.models import Chunk, Document, KnowledgeBase
from webapp.rag.selectors import passages_retrieve
from webapp.sharing.services import share_create

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]  # full-text search, transactions

SECRET = "The vault code is heliotrope."
QUESTION = "What is the vault code?"


def filled_base(user, name="Vault", team=None, fact=SECRET, fact_page=9) -> KnowledgeBase:
    base = base_create(user=user, name=name, team=team)
    document_add(user=user, base=base, name="vault.txt", data=paged_document("vault.txt", fact_page, fact)["text"].encode())
    return base


def bases_in_page(user, conversation_id=None) -> list[str]:
    html = logged_in(user).get(f"/c/{conversation_id}/" if conversation_id else "/").content.decode()
    state = json.loads(html.split('id="chat-state" type="application/json">')[1].split("</script>")[0])
    return [b["name"] for b in state["knowledge_bases"]]


@pytest.fixture
def crew(alice, bob):
    """Team ``ops``: alice its owner, bob a member; carol is in no team."""
    from django.contrib.auth import get_user_model

    ops = team("ops")
    Membership.objects.create(team=ops, user=alice, role=Membership.Role.OWNER)
    Membership.objects.create(team=ops, user=bob, role=Membership.Role.MEMBER)
    return ops, get_user_model().objects.create_user("carol", password="carol-pw-123")


def test_a_base_is_made_and_filled_on_its_page_and_a_bad_document_says_why_leaving_nothing(alice, smol):
    client = logged_in(alice)
    assert 'href="/account/knowledge/"' in client.get("/").content.decode()  # reachable from the chat page
    created = client.post("/account/knowledge/", {"name": "Harbour"})
    base = KnowledgeBase.objects.get(name="Harbour", owner=alice)
    assert created.url == f"/account/knowledge/{base.pk}/"

    from django.core.files.uploadedfile import SimpleUploadedFile

    good = SimpleUploadedFile("log.md", "# Tides\n\nThe keeper's cat is called Biscuit.\n".encode())
    page = client.post(created.url, {"file": good}, follow=True).content.decode()
    assert "Added log.md" in page and "log.md" in page
    for name, data, why in [("scan.pdf", b"%PDF-1.4 not really", "could not be read as a PDF"),
                            ("blob.txt", b"\xff\xfe\x00binary", "not UTF-8 text"),
                            ("empty.txt", b"\f\f\f   ", "has no text to read"),
                            ("tool.exe", b"MZ", "only text files")]:
        page = client.post(created.url, {"file": SimpleUploadedFile(name, data)}, follow=True).content.decode()
        assert "Not added" in page and why in page, name
    assert list(Document.objects.values_list("name", flat=True)) == ["log.md"]
    assert Chunk.objects.filter(document__name="log.md").count() == Chunk.objects.count()
    assert fts_hits("Biscuit") == 1

    client.post(f"/account/knowledge/{base.pk}/delete")  # deleting the base takes its index rows too
    assert not KnowledgeBase.objects.exists() and Chunk.objects.count() == 0 and fts_hits("Biscuit") == 0


def test_an_attached_base_is_retrieved_from_and_cited(alice, smol, smollm2_hf_tokenizer):
    base = filled_base(alice)

    turn = prepare(alice, type="send", content=QUESTION, knowledge_bases=[base.pk])

    assert list(turn.conversation.knowledge_bases.all()) == [base]
    assert "[1] vault.txt, page 9\n" in user_prompt(turn, smollm2_hf_tokenizer)
    assert turn.sources[0]["document"] == "vault.txt" and turn.sources[0]["page"] == 9
    turn_finish(turn=turn, outcome=finished_outcome("heliotrope [1]"))
    passage = logged_in(alice).get(f"/rag/passages/{turn.sources[0]['chunk']}").json()
    assert "heliotrope" in passage["text"]
    # The next turn keeps the base attached without naming it; an empty list detaches it.
    again = prepare(alice, type="send", conversation=turn.conversation.pk, content="And the vault code again?")
    assert again.sources and again.sources[0]["document"] == "vault.txt"
    detached = prepare(alice, type="send", conversation=turn.conversation.pk, content=QUESTION, knowledge_bases=[])
    assert detached.sources == [] and not turn.conversation.knowledge_bases.exists()


def test_a_user_never_gets_another_users_base(alice, bob, smol, smollm2_hf_tokenizer):
    base = filled_base(alice)
    alices = prepare(alice, type="send", content=QUESTION, knowledge_bases=[base.pk])
    chunk = alices.sources[0]["chunk"]

    with pytest.raises(ChatInputError) as refused:  # attaching it
        prepare(bob, type="send", content=QUESTION, knowledge_bases=[base.pk])
    assert refused.value.param == "knowledge_bases"
    with pytest.raises(ChatInputError) as refused:  # continuing her conversation, which has it attached
        prepare(bob, type="send", conversation=alices.conversation.pk, content=QUESTION)
    assert refused.value.code == "not_found"

    ids = list(Document.objects.values_list("id", flat=True))
    assert passages_retrieve(owner_id=bob.pk, document_ids=ids, question="vault code heliotrope",
                             max_chars=10_000, max_passages=6) == []  # even naming its documents
    assert logged_in(bob).get(f"/rag/passages/{chunk}").status_code == 404
    assert logged_in(bob).get(f"/account/knowledge/{base.pk}/").status_code == 404
    assert bases_in_page(bob) == []
    with pytest.raises(KnowledgeError):
        document_add(user=bob, base=base, name="mine.txt", data=b"bob was here")


def test_a_teams_base_is_read_by_its_members_written_by_its_managers_and_gone_when_one_leaves(
        alice, bob, crew, smol, smollm2_hf_tokenizer):
    ops, carol = crew
    base = filled_base(alice, name="Ops runbook", team=ops)  # alice: the team's owner
    with pytest.raises(KnowledgeError):  # bob is a member: he reads it, he does not fill it
        document_add(user=bob, base=base, name="b.txt", data=b"the vault code is sunflower")
    with pytest.raises(KnowledgeError):
        base_create(user=bob, name="Mine", team=ops)
    assert logged_in(bob).post(f"/account/knowledge/{base.pk}/delete").status_code == 302
    assert KnowledgeBase.objects.filter(pk=base.pk).exists()  # refused: he is no manager

    bobs = prepare(bob, type="send", content=QUESTION, knowledge_bases=[base.pk])
    assert "heliotrope" in user_prompt(bobs, smollm2_hf_tokenizer)
    chunk = bobs.sources[0]["chunk"]
    turn_finish(turn=bobs, outcome=finished_outcome("heliotrope [1]"))
    assert logged_in(bob).get(f"/rag/passages/{chunk}").status_code == 200
    assert bases_in_page(bob, bobs.conversation.pk) == ["Ops runbook"]
    share = share_create(conversation=bobs.conversation)

    # carol, in no team: not by attaching, not by the passage a shared copy of bob's answer cites.
    with pytest.raises(ChatInputError):
        prepare(carol, type="send", content=QUESTION, knowledge_bases=[base.pk])
    assert logged_in(carol).get(f"/s/{share.token}/").status_code == 200  # she reads the copy
    assert logged_in(carol).get(f"/rag/passages/{chunk}").status_code == 404
    assert bases_in_page(carol) == []

    # bob leaves the team: his own conversation, base still attached, no longer retrieves from it.
    membership_remove(actor=alice, team=ops, user=bob)
    after = prepare(bob, type="send", conversation=bobs.conversation.pk, content=QUESTION)
    prompt = user_prompt(after, smollm2_hf_tokenizer)  # (his own earlier answer "heliotrope [1]" stays in it)
    assert "<sources>" not in prompt and "The vault code is" not in prompt and after.sources == []
    assert logged_in(bob).get(f"/rag/passages/{chunk}").status_code == 404
    assert bases_in_page(bob, bobs.conversation.pk) == []
    assert passages_retrieve(owner_id=bob.pk, document_ids=list(Document.objects.values_list("id", flat=True)),
                             question="vault code heliotrope", max_chars=10_000, max_passages=6) == []
    with pytest.raises(ChatInputError):  # nor can he attach it again
        prepare(bob, type="send", conversation=bobs.conversation.pk, content=QUESTION, knowledge_bases=[base.pk])
    # alice, still in the team, reads it as before.
    assert logged_in(alice).get(f"/rag/passages/{chunk}").status_code == 200


def test_a_base_of_another_team_is_never_retrieved(alice, bob, crew, smol, smollm2_hf_tokenizer):
    ops, carol = crew
    other = team("finance")
    Membership.objects.create(team=other, user=carol, role=Membership.Role.ADMIN)
    finance = filled_base(carol, name="Ledger", team=other, fact="The payroll password is marigold.", fact_page=4)
    runbook = filled_base(alice, name="Runbook", team=ops)

    bobs = prepare(bob, type="send", content="What are the vault code and the payroll password? marigold",
                   knowledge_bases=[runbook.pk])

    assert "[1] vault.txt" in user_prompt(bobs, smollm2_hf_tokenizer)
    assert "marigold." not in user_prompt(bobs, smollm2_hf_tokenizer)
    assert all(Chunk.objects.get(pk=s["chunk"]).document.knowledge_base_id == runbook.pk for s in bobs.sources)
    ledger_chunk = Chunk.objects.filter(document__knowledge_base=finance).first().pk
    assert logged_in(bob).get(f"/rag/passages/{ledger_chunk}").status_code == 404
    assert logged_in(carol).get(f"/rag/passages/{ledger_chunk}").status_code == 200


def test_a_preset_brings_its_bases_and_names_only_those_its_user_may_read(alice, bob, crew, smol):
    from webapp.chat.selectors import preset_list
    from webapp.chat.services import preset_save

    ops, carol = crew
    mine, runbook = filled_base(alice), filled_base(alice, name="Runbook", team=ops)
    preset_save(user=alice, name="Vault", text="Answer from the vault.", max_chars=1000, knowledge_bases=[mine.pk])
    assert [p["knowledge_bases"] for p in preset_list(user=alice)] == [[mine.pk]]
    preset_save(user=alice, name="Vault", text="Answer tersely.", max_chars=1000)  # None: keeps its bases
    assert [p["knowledge_bases"] for p in preset_list(user=alice)] == [[mine.pk]]
    with pytest.raises(ChatInputError) as refused:  # not his to name
        preset_save(user=bob, name="Hers", text="x", max_chars=1000, knowledge_bases=[mine.pk])
    assert refused.value.param == "knowledge_bases"

    preset_save(user=bob, name="Ops", text="Use the runbook.", max_chars=1000, knowledge_bases=[runbook.pk])
    assert [p["knowledge_bases"] for p in preset_list(user=bob)] == [[runbook.pk]]
    membership_remove(actor=alice, team=ops, user=bob)
    assert [p["knowledge_bases"] for p in preset_list(user=bob)] == [[]]  # gone from what his page is told
