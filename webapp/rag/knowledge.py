"""Knowledge bases: who may read and write one, and its writes (create, upload, delete, attach).

Reading a base (retrieving from it, opening its passages, attaching it): its owner, or any member
of its team now. Writing one (uploading, deleting documents, deleting it): its owner, or the team's
owners and admins (webapp.orgs roles: ``MANAGERS``). Staff have no right of their own here: a
base's documents are content, not configuration, and staff are members where they need to be.

An uploaded document goes through the chat's own checks (chat.documents: text by extension, PDFs by
pypdf) and the same chunking and indexing as a message's (services._document_create), in one
transaction: a document that cannot be read says why and leaves nothing behind.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from django.db import IntegrityError, transaction

from webapp.chat.documents import (MAX_NAME_CHARS, MAX_PDF_BYTES, DocumentError, documents_clean, pdf_text)
from webapp.orgs.access import MANAGERS, team_role
from webapp.orgs.models import Team
from webapp.rag.models import Document, KnowledgeBase
from webapp.rag.selectors import readable_knowledge_bases
from webapp.rag.services import IngestError, _document_create, _embed

NAME_LENGTH = 120


class KnowledgeError(ValueError):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def can_read(*, user, base: KnowledgeBase) -> bool:
    if base.team_id is None:
        return base.owner_id == user.pk
    return team_role(user=user, team=base.team) is not None


def can_write(*, user, base: KnowledgeBase) -> bool:
    if base.team_id is None:
        return base.owner_id == user.pk
    return team_role(user=user, team=base.team) in MANAGERS


def base_get_readable(*, user, base_id) -> KnowledgeBase | None:
    try:
        return readable_knowledge_bases(user_id=user.pk).select_related("team").get(pk=int(base_id))
    except (KnowledgeBase.DoesNotExist, TypeError, ValueError):
        return None


def base_create(*, user, name: str, team: Team | None = None) -> KnowledgeBase:
    name = (name or "").strip()
    if not name or len(name) > NAME_LENGTH:
        raise KnowledgeError(f"Give the knowledge base a name of at most {NAME_LENGTH} characters.")
    if team is not None and team_role(user=user, team=team) not in MANAGERS:
        raise KnowledgeError(f"Only the owners and admins of {team.name} make its knowledge bases.")
    try:
        with transaction.atomic():
            return KnowledgeBase.objects.create(name=name, owner=None if team else user, team=team)
    except IntegrityError:
        raise KnowledgeError(f"There is already a knowledge base named {name!r} there.") from None


def base_delete(*, user, base: KnowledgeBase) -> None:
    if not can_write(user=user, base=base):
        raise KnowledgeError("Only its owner (or its team's owners and admins) may delete this knowledge base.")
    base.delete()


def upload_text(*, name: str, data: bytes) -> tuple[str, str]:
    """An uploaded file as (name, text), through the chat page's checks; DocumentError saying why not."""
    name = PurePosixPath((name or "").replace("\\", "/")).name[:MAX_NAME_CHARS] or "document"
    if name.lower().endswith(".pdf"):
        return name, pdf_text(name, data)
    if len(data) > MAX_PDF_BYTES:
        raise DocumentError(f"{name} is larger than {MAX_PDF_BYTES // (1024 * 1024)} MiB.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DocumentError(f"{name} is not UTF-8 text.") from None
    (cleaned,) = documents_clean([{"name": name, "text": text}])
    return cleaned["name"], cleaned["text"]


def document_add(*, user, base: KnowledgeBase, name: str, data: bytes, embedder=None) -> Document:
    """File one uploaded document in the base, chunked and indexed, all or nothing; KnowledgeError saying
    why not (unreadable, no text, no right)."""
    if not can_write(user=user, base=base):
        raise KnowledgeError("Only its owner (or its team's owners and admins) may add documents here.")
    try:
        name, text = upload_text(name=name, data=data)
        with transaction.atomic():
            document = _document_create(name=name, raw_text=text, owner_id=user.pk, knowledge_base=base)
            if embedder is not None:
                _embed([document], embedder)
    except (DocumentError, IngestError) as exc:
        raise KnowledgeError(exc.message) from None
    return document


def document_delete(*, user, base: KnowledgeBase, document_id) -> bool:
    if not can_write(user=user, base=base):
        raise KnowledgeError("Only its owner (or its team's owners and admins) may remove documents here.")
    return Document.objects.filter(knowledge_base=base, pk=document_id).delete()[0] > 0


def _readable_of(*, user, base_ids) -> list[KnowledgeBase]:
    if not isinstance(base_ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in base_ids):
        raise KnowledgeError("knowledge_bases must be a list of knowledge base ids.")
    bases = list(readable_knowledge_bases(user_id=user.pk).filter(pk__in=base_ids))
    if len(bases) != len(set(base_ids)):
        raise KnowledgeError("One of these knowledge bases is not yours or your team's.")
    return bases


def preset_bases_set(*, user, preset, base_ids) -> None:
    """The bases a user's own preset brings (each readable by them now); a preset only names them:
    a turn still retrieves only from what its sender may read then."""
    unreadable = preset.knowledge_bases.exclude(pk__in=readable_knowledge_bases(user_id=user.pk).values("id"))
    preset.knowledge_bases.set([*_readable_of(user=user, base_ids=base_ids), *unreadable])


def preset_bases(*, user, preset_ids: list[int]) -> dict[int, list[int]]:
    """{preset id: the ids of its bases that ``user`` may read now}."""
    out: dict[int, list[int]] = {}
    through = KnowledgeBase.presets.through.objects.filter(
        systempromptpreset_id__in=preset_ids,
        knowledgebase_id__in=readable_knowledge_bases(user_id=user.pk).values("id"))
    for preset_id, base_id in through.values_list("systempromptpreset_id", "knowledgebase_id").order_by("knowledgebase_id"):
        out.setdefault(preset_id, []).append(base_id)
    return out


def conversation_bases_set(*, user, conversation, base_ids) -> list[KnowledgeBase]:
    """Attach exactly these bases to the conversation (the page sends its choice with each turn).
    Every one must be readable by ``user``; bases attached before that the user cannot read now (a
    team they left) stay attached, unused by their turns, for whoever can still read them."""
    bases = _readable_of(user=user, base_ids=base_ids)
    readable = readable_knowledge_bases(user_id=user.pk)
    unreadable = conversation.knowledge_bases.exclude(pk__in=readable.values("id"))
    conversation.knowledge_bases.set([*bases, *unreadable])
    return bases
