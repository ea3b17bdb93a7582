"""Documents attached to chat messages, indexed as chunks for retrieval.

A Document exists only once all of its chunks are written: ingestion (services.py) writes both in
one transaction, so a failed or cancelled one leaves nothing, and retrieval never meets half a
document. ``owner`` is whose chunks these are: every read filters on it (selectors.py).
"""

from django.conf import settings
from django.db import models


class Document(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="rag_documents")
    conversation = models.ForeignKey("chat.Conversation", on_delete=models.CASCADE, related_name="rag_documents")
    # The user message it is attached to, and its place in that message's attachments.
    message = models.ForeignKey("chat.Message", on_delete=models.CASCADE, related_name="rag_documents")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16)  # text | markdown | html | pdf (chunking.document_kind)
    text = models.TextField()  # what the chunks are spans of (an HTML document's readable text)
    num_pages = models.PositiveIntegerField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["message", "position"], name="rag_document_once")]

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
