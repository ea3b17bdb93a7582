"""Conversations out and back in: a user's export as JSON (every branch), and its import.

An export is one document: ``format``/``version``, the owner (id and username), the conversations
each with its settings and every message of its tree (ids local to the file, numbered in the
order written, so a parent always comes before its children), and a ``signature``.

The signature is an HMAC of the rest (Django's signing with SECRET_KEY, salted), so an import
can tell an export of this site, made for this user, from anything else: a file that is not an
export, an export someone edited (its owner id changed to pass as one's own, say) or another
user's export is refused. An owner field alone could be edited; only the site can sign one. The
price: an export imports only into the site that made it (another site's key differs), and an
edited export is refused rather than trusted. The import is one transaction: a refusal creates
nothing.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from django.core import signing
from django.db import transaction
from django.utils import timezone
from django.utils.crypto import constant_time_compare
from django.utils.dateparse import parse_datetime

from webapp.chat.documents import DocumentError, documents_clean
from webapp.chat.models import Conversation, Message
from webapp.chat.sampling import SamplingError, sampling_params
from webapp.chat.selectors import message_list

FORMAT, VERSION = "pagoda-conversations", 1
SALT = "pagoda.chat.export"
MAX_IMPORT_BYTES = 64 * 1024 * 1024
FINISH_REASONS = {"", "stop", "length", "abort"}
COUNTS = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens")


class ImportRefused(ValueError):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def _digest(document: dict) -> str:
    body = {k: v for k, v in document.items() if k != "signature"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                          .encode()).hexdigest()


def sign(document: dict) -> dict:
    """The document with its signature (replacing any it had)."""
    return {**document, "signature": signing.Signer(salt=SALT).signature(_digest(document))}


def _conversation_dict(conversation: Conversation) -> dict:
    local: dict[int, int] = {}
    messages = []
    for message in message_list(conversation=conversation):  # oldest first: parents before children
        local[message.pk] = len(local) + 1
        messages.append({
            "id": local[message.pk], "parent": local.get(message.parent_id), "role": message.role,
            "content": message.content, "attachments": message.attachments, "model_name": message.model_name,
            **{name: getattr(message, name) for name in COUNTS},
            "finish_reason": message.finish_reason, "created_at": message.created_at.isoformat()})
    return {"title": conversation.title, "model_name": conversation.model_name,
            "system_prompt": conversation.system_prompt, "sampling": conversation.sampling,
            "current_leaf": local.get(conversation.current_leaf_id),
            "created_at": conversation.created_at.isoformat(), "updated_at": conversation.updated_at.isoformat(),
            "messages": messages}


def conversations_export(*, user, conversations) -> dict:
    """The signed export of ``conversations`` (the user's own: the caller scopes them)."""
    return sign({"format": FORMAT, "version": VERSION, "exported_at": timezone.now().isoformat(),
                 "owner": {"id": user.pk, "username": user.get_username()},
                 "conversations": [_conversation_dict(c) for c in conversations]})


# ---------------------------------------------------------------------------------------- import
def _check_signed(document, user) -> None:
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ImportRefused("This file is not a Pagoda conversations export.")
    if document.get("version") != VERSION:
        raise ImportRefused(f"This export is version {document.get('version')!r}; this site reads version {VERSION}.")
    signature = document.get("signature")
    expected = signing.Signer(salt=SALT).signature(_digest(document))
    if not isinstance(signature, str) or not constant_time_compare(signature, expected):
        raise ImportRefused("This export was not made by this site, or it was changed since; it cannot be imported.")
    owner = document.get("owner")
    if not isinstance(owner, dict) or owner.get("id") != user.pk:
        raise ImportRefused("This export belongs to another account; only its owner can import it.")
    if not isinstance(document.get("conversations"), list):
        raise ImportRefused("The export holds no list of conversations.")


def _when(value, where: str) -> datetime:
    when = parse_datetime(value) if isinstance(value, str) else None
    if when is None:
        raise ImportRefused(f"{where}: a date is missing or unreadable.")
    return when


def _text(value, where: str, max_chars: int | None = None) -> str:
    if not isinstance(value, str) or "\x00" in value or (max_chars is not None and len(value) > max_chars):
        raise ImportRefused(f"{where} must be text" + (f" of at most {max_chars} characters." if max_chars else "."))
    return value


def _message(data, where: str, known: set[int]) -> dict:
    if not isinstance(data, dict):
        raise ImportRefused(f"{where} is not a message.")
    local_id, parent = data.get("id"), data.get("parent")
    if not isinstance(local_id, int) or isinstance(local_id, bool) or local_id in known:
        raise ImportRefused(f"{where}: its id is missing or repeated.")
    if parent is not None and parent not in known:
        raise ImportRefused(f"{where}: its parent is not an earlier message of the conversation.")
    if data.get("role") not in Message.Role.values:
        raise ImportRefused(f"{where}: the role must be one of {', '.join(Message.Role.values)}.")
    if data.get("finish_reason", "") not in FINISH_REASONS:
        raise ImportRefused(f"{where}: unknown finish_reason {data.get('finish_reason')!r}.")
    counts = {name: data.get(name, 0) for name in COUNTS}
    if any(not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**31 for v in counts.values()):
        raise ImportRefused(f"{where}: token counts must be whole numbers from 0.")
    try:
        attachments = documents_clean(data.get("attachments") or [])
    except DocumentError as exc:
        raise ImportRefused(f"{where}: {exc.message}") from None
    return {"id": local_id, "parent": parent, "role": data["role"], "content": _text(data.get("content"), where),
            "attachments": attachments, "model_name": _text(data.get("model_name", ""), where, 64), **counts,
            "finish_reason": data.get("finish_reason", ""), "created_at": _when(data.get("created_at"), where)}


def _conversation(data, where: str) -> dict:
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise ImportRefused(f"{where} is not a conversation.")
    known: set[int] = set()
    messages = []
    for n, item in enumerate(data["messages"], 1):
        messages.append(_message(item, f"{where}, message {n}", known))
        known.add(messages[-1]["id"])
    if data.get("current_leaf") is not None and data["current_leaf"] not in known:
        raise ImportRefused(f"{where}: the message shown is not one of its messages.")
    sampling = data.get("sampling") or {}
    if not isinstance(sampling, dict):
        raise ImportRefused(f"{where}: sampling must be an object.")
    try:
        sampling_params(sampling)
    except SamplingError as exc:
        raise ImportRefused(f"{where}: {exc.message}") from None
    return {"title": _text(data.get("title", ""), where, 200), "model_name": _text(data.get("model_name", ""), where, 64),
            "system_prompt": _text(data.get("system_prompt", ""), where), "sampling": sampling,
            "current_leaf": data.get("current_leaf"), "created_at": _when(data.get("created_at"), where),
            "updated_at": _when(data.get("updated_at"), where), "messages": messages}


def _create(user, data: dict) -> Conversation:
    conversation = Conversation.objects.create(user=user, title=data["title"], model_name=data["model_name"],
                                               system_prompt=data["system_prompt"], sampling=data["sampling"])
    created: dict[int, Message] = {}
    for item in data["messages"]:  # parents first: each row gets its parent's new id
        message = Message(conversation=conversation, parent=created.get(item["parent"]), role=item["role"],
                          content=item["content"], attachments=item["attachments"], model_name=item["model_name"],
                          finish_reason=item["finish_reason"], **{name: item[name] for name in COUNTS})
        message.root = item["parent"] is None
        message.save()
        created[item["id"]] = message
    for item in data["messages"]:  # auto_now_add wrote the import's time
        Message.objects.filter(pk=created[item["id"]].pk).update(created_at=item["created_at"])
    leaf = created.get(data["current_leaf"])
    Conversation.objects.filter(pk=conversation.pk).update(
        current_leaf=leaf, created_at=data["created_at"], updated_at=data["updated_at"])
    conversation.refresh_from_db()
    return conversation


@transaction.atomic
def conversations_import(*, user, document) -> list[Conversation]:
    """Recreate the conversations of ``document`` (a parsed export) for ``user``: every one or,
    refused with ImportRefused saying why, none."""
    _check_signed(document, user)
    checked = [_conversation(c, f"Conversation {n}") for n, c in enumerate(document["conversations"], 1)]
    return [_create(user, data) for data in checked]
