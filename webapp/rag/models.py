"""Documents indexed as chunks for retrieval: attached to a chat message, or filed in a knowledge base.

A Document exists only once all of its chunks are written: ingestion (services.py) writes both in
one transaction, so a failed or cancelled one leaves nothing, and retrieval never meets half a
document. Who may read a document's chunks (selectors.readable_documents, every read filters on it):
a message's document, its ``owner`` (the conversation's user); a knowledge base's, whoever may read
the base: its owner, or the members of its team *now* (``owner`` is then only who uploaded it, and
grants nothing).
"""

from django.conf import settings
from django.db import models


class KnowledgeBase(models.Model):
    """A named collection of documents: a user's own (``owner``) or a team's (``team``), never both.
    A team's is read by its members and written by its owners and admins (webapp.orgs roles);
    conversations it is attached to retrieve from it as the user sending each turn."""

    name = models.CharField(max_length=120)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                              related_name="knowledge_bases")
    team = models.ForeignKey("orgs.Team", null=True, blank=True, on_delete=models.CASCADE,
                             related_name="knowledge_bases")
    conversations = models.ManyToManyField("chat.Conversation", blank=True, related_name="knowledge_bases")
    # The user's own presets that bring it: choosing one on the chat page checks it (knowledge.py).
    presets = models.ManyToManyField("chat.SystemPromptPreset", blank=True, related_name="knowledge_bases")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(owner__isnull=False, team__isnull=True)
                                   | models.Q(owner__isnull=True, team__isnull=False), name="rag_kb_one_holder"),
            models.UniqueConstraint(fields=["owner", "name"], name="rag_kb_name_per_owner"),
            models.UniqueConstraint(fields=["team", "name"], name="rag_kb_name_per_team"),
        ]

    def __str__(self) -> str:
        return self.name


class Document(models.Model):
    # A message's document: the conversation's user. A knowledge base's: who uploaded it (no right).
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="rag_documents")
    conversation = models.ForeignKey("chat.Conversation", null=True, on_delete=models.CASCADE,
                                     related_name="rag_documents")
    # The user message it is attached to, and its place in that message's attachments (none: in a base).
    message = models.ForeignKey("chat.Message", null=True, on_delete=models.CASCADE, related_name="rag_documents")
    position = models.PositiveSmallIntegerField(default=0)
    knowledge_base = models.ForeignKey(KnowledgeBase, null=True, on_delete=models.CASCADE, related_name="documents")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16)  # text | markdown | html | pdf (chunking.document_kind)
    text = models.TextField()  # what the chunks are spans of (an HTML document's readable text)
    num_pages = models.PositiveIntegerField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["message", "position"], name="rag_document_once"),
            models.CheckConstraint(condition=models.Q(message__isnull=False, knowledge_base__isnull=True)
                                   | models.Q(message__isnull=True, knowledge_base__isnull=False),
                                   name="rag_document_message_or_base"),
        ]

    def __str__(self) -> str:
        return self.name


class Chunk(models.Model):
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    ordinal = models.PositiveIntegerField()
    page = models.PositiveIntegerField(null=True)  # 1-based, for documents with pages
    heading = models.CharField(max_length=200, blank=True)
    start = models.PositiveIntegerField()  # Document.text[start:end] == text
    end = models.PositiveIntegerField()
    text = models.TextField()  # indexed by the keyword index (migrations/0002_chunk_fts.py)
    # The chunk's vector (float32, little-endian) from the embedding model ``embedding_model``, when
    # one was active at ingestion (vectors.py); null: keyword search only.
    embedding = models.BinaryField(null=True)
    embedding_model = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["document_id", "ordinal"]

    def __str__(self) -> str:
        return f"{self.document.name} #{self.ordinal}"
