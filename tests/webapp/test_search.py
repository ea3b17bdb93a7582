"""Search across a user's conversations: what a user finds, in what order, and what cannot go wrong.

Vendor-neutral tests run on whichever database the run uses (SQLite FTS5; PostgreSQL in make test's
second run, or by hand: python -m deploy.stack.postgres run -- python -m pytest tests/webapp/test_search.py);
the last two are about one vendor's machinery each (@pytest.mark.sqlite / @pytest.mark.postgres).
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.test import Client

from webapp.chat.models import Conversation, Message
from webapp.search.selectors import conversation_search

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]
HOSTILE = ['"', "AND OR NOT *", '"albatross', "NEAR(", "'", ":*", "a & b | !c", "(((", "*", "title:foo",
           "^x", "- -", "albatross) OR (", "\\", "%", "%s", "💥", "x" * 500, "\x00", "<script>", "a:* & 'b'"]


@pytest.fixture
def alice():
    return get_user_model().objects.create_user("alice", password="alice-pw-123")


@pytest.fixture
def bob():
    return get_user_model().objects.create_user("bob", password="bob-pw-123")


def conversation_of(user, title: str, *texts: str) -> Conversation:
    conversation = Conversation.objects.create(user=user, title=title)
    for i, text in enumerate(texts):
        Message.objects.create(conversation=conversation, role="user" if i % 2 == 0 else "assistant", content=text)
    return conversation


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_search_finds_a_word_from_a_conversation_three_conversations_back(alice):
    oldest = conversation_of(alice, "Seabirds", "Which bird glides longest?",
                             "The wandering albatross can glide for hours without a wingbeat.")
    conversation_of(alice, "Pasta", "How long do I boil spaghetti?", "About nine minutes.")
    conversation_of(alice, "Taxes", "When are taxes due?", "Usually in April.")
    conversation_of(alice, "Jokes", "Tell me a joke", "Why did the chicken cross the road?")
    answer = oldest.messages.get(role="assistant")

    hits = conversation_search(user=alice, text="albatross")

    assert [(h.conversation_id, h.message_id) for h in hits] == [(oldest.pk, answer.pk)]
    assert hits[0].url == f"/c/{oldest.pk}/#message-{answer.pk}"
    assert [s.text.lower() for s in hits[0].segments if s.is_hit] == ["albatross"]
    assert "wandering" in "".join(s.text for s in hits[0].segments)
    page = client_of(alice).get("/search/", {"q": "albatross"})
    assert page.status_code == 200
    assert f'href="/c/{oldest.pk}/#message-{answer.pk}"' in page.content.decode()


def test_the_message_that_is_most_about_the_word_comes_first(alice):
    once = conversation_of(alice, "A", "The lighthouse keeper went home early today, tired.")
    thrice = conversation_of(alice, "B", "Lighthouse, lighthouse, lighthouse: a keeper's song.")
    hits = conversation_search(user=alice, text="lighthouse")
    assert [h.conversation_id for h in hits] == [thrice.pk, once.pk]


def test_search_matches_other_forms_of_a_word_and_the_start_of_the_last_word(alice):
    conversation = conversation_of(alice, "Boats", "My grandfather sails boats on the lake.")
    assert [h.conversation_id for h in conversation_search(user=alice, text="sailing")] == [conversation.pk]
    assert [h.conversation_id for h in conversation_search(user=alice, text="grandfa")] == [conversation.pk]
    assert conversation_search(user=alice, text="grandfather lake") != []
    assert conversation_search(user=alice, text="grandfather mountain") == []  # every word must match


def test_search_finds_conversation_titles(alice):
    trip = conversation_of(alice, "Weekend in Lisbon", "What should I pack?")
    hits = conversation_search(user=alice, text="lisbon")
    assert [(h.conversation_id, h.message_id, h.role) for h in hits] == [(trip.pk, None, "title")]
    assert hits[0].url == f"/c/{trip.pk}/"


def test_a_title_that_repeats_a_message_gives_one_result_not_two(alice):
    conversation = conversation_of(alice, "Tell me about the zeppelin", "Tell me about the zeppelin", "It flew.")
    conversation_of(alice, "Airships", "A zeppelin is an airship, a zeppelin indeed, zeppelin zeppelin.")
    hits = conversation_search(user=alice, text="zeppelin")
    assert [h.message_id for h in hits if h.conversation_id == conversation.pk] == [
        conversation.messages.first().pk]
    assert len(hits) == 2


def test_a_user_finds_only_their_own_conversations(alice, bob):
    mine = conversation_of(alice, "Mine", "the zeppelin over the city")
    theirs = conversation_of(bob, "Zeppelin notes", "my zeppelin diary")
    assert {h.conversation_id for h in conversation_search(user=alice, text="zeppelin")} == {mine.pk}
    assert {h.conversation_id for h in conversation_search(user=bob, text="zeppelin")} == {theirs.pk}
    body = client_of(alice).get("/search/suggest", {"q": "zeppelin"}).json()
    assert [r["conversation"]["id"] for r in body["results"]] == [mine.pk]


def test_search_follows_edits_and_deletions(alice):
    conversation = conversation_of(alice, "Edits", "I like marmalade.")
    message = conversation.messages.get()
    message.content = "I like porridge."
    message.save()
    assert conversation_search(user=alice, text="marmalade") == []
    assert [h.message_id for h in conversation_search(user=alice, text="porridge")] == [message.pk]
    conversation.title = "Breakfast"
    conversation.save()
    assert [h.role for h in conversation_search(user=alice, text="breakfast")] == ["title"]
    conversation.delete()
    assert conversation_search(user=alice, text="porridge") == []
    assert conversation_search(user=alice, text="breakfast") == []


@pytest.mark.parametrize("query", HOSTILE)
def test_any_query_text_is_answered_without_a_server_error(alice, query):
    conversation_of(alice, "Seabirds", "The wandering albatross, and NOT the gull.")
    client = client_of(alice)
    page = client.get("/search/", {"q": query})
    suggest = client.get("/search/suggest", {"q": query})
    assert page.status_code == 200, page.content[:500]
    assert suggest.status_code == 200
    assert isinstance(suggest.json()["results"], list)


def test_operators_typed_by_the_user_are_words_not_syntax(alice):
    conversation = conversation_of(alice, "Seabirds", "The wandering albatross glides.")
    conversation_of(alice, "Other", "The gull shrieks.")
    # FTS5 would read `albatross OR gull` as a disjunction; here OR is a word that must match too.
    assert conversation_search(user=alice, text="albatross OR gull") == []
    assert [h.conversation_id for h in conversation_search(user=alice, text='"albatross')] == [conversation.pk]
    assert [h.conversation_id for h in conversation_search(user=alice, text="albatross*)")] == [conversation.pk]


def test_markup_in_a_message_shows_as_text_in_the_results(alice):
    conversation_of(alice, "XSS", "<script>alert(1)</script> <img src=x onerror=alert(2)> albatross")
    html = client_of(alice).get("/search/", {"q": "albatross"}).content.decode()
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "alert(1)&lt;/script&gt; &lt;img src=x onerror=alert(2)&gt; <mark>albatross</mark>" in html
    assert "<mark>albatross</mark>" in html
    results = client_of(alice).get("/search/suggest", {"q": "albatross"}).json()["results"]
    assert any("</script>" in part["text"] for part in results[0]["snippet"])  # text, for textContent


def test_search_needs_a_login(alice):
    assert Client().get("/search/", {"q": "x"}).status_code == 302
    refused = Client().get("/search/suggest", {"q": "x"})
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "not_authenticated"


@pytest.mark.sqlite
def test_this_pythons_sqlite_has_fts5_and_the_index_tables_exist():
    from webapp.search.sqlite_fts import fts5_missing_reason

    assert fts5_missing_reason(connection) is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE '%USING fts5%'")
        assert {row[0] for row in cursor.fetchall()} == {"search_message_fts", "search_conversation_fts",
                                                        "rag_chunk_fts"}  # webapp.rag's chunks


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
def test_sqlite_index_is_repaired_after_a_migration_rebuilds_the_chat_table(alice):
    """SQLite's ALTER path (copy the table, drop the old one) drops its triggers; post_migrate heals."""
    conversation = conversation_of(alice, "Before", "a quokka smiles")

    def triggers() -> set[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'search_%'")
            return {row[0] for row in cursor.fetchall()}

    assert len(triggers()) == 6
    with connection.schema_editor() as editor:
        editor._remake_table(Message)  # what an AlterField on chat_message does on SQLite
    assert triggers() == {t for t in triggers() if t.startswith("search_conversation")}  # message ones gone
    call_command("migrate", verbosity=0)
    assert len(triggers()) == 6
    Message.objects.create(conversation=conversation, role="assistant", content="and a wombat digs")
    assert {h.conversation_id for h in conversation_search(user=alice, text="wombat")} == {conversation.pk}
    assert {h.conversation_id for h in conversation_search(user=alice, text="quokka")} == {conversation.pk}


@pytest.mark.postgres
def test_postgres_search_is_answered_by_the_gin_index(alice):
    from django.contrib.postgres.search import SearchQuery, SearchVector

    conversation_of(alice, "Seabirds", "The wandering albatross glides.")
    query = SearchQuery("albatross", search_type="raw", config="english")
    queryset = Message.objects.annotate(document=SearchVector("content", config="english")).filter(document=query)
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        sql, params = queryset.query.sql_with_params()
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("SET enable_seqscan = on")
    assert "search_message_content_gin" in plan, plan
