"""Conversations as Markdown, to read or keep: each one's path as the page shows it (its other
versions are counted, and kept whole in the JSON export, webapp/chat/transfer.py)."""

from __future__ import annotations

from django.utils import timezone

from webapp.chat.models import Conversation
from webapp.chat.selectors import Tree


def _quote_block(text: str) -> str:
    return "\n".join("> " + line if line else ">" for line in text.splitlines()) or ">"


def conversation_markdown(conversation: Conversation) -> str:
    tree = Tree(conversation)
    lines = [f"# {conversation}", ""]
    about = [f"model {conversation.model_name}"] if conversation.model_name else []
    about.append(f"started {timezone.localtime(conversation.created_at):%Y-%m-%d %H:%M %Z}")
    lines += ["*" + " · ".join(about) + "*", ""]
    if conversation.system_prompt.strip():
        lines += ["**System prompt**", "", _quote_block(conversation.system_prompt), ""]
    for message in tree.path_to(tree.leaf()):
        who = "You" if message.role == "user" else (message.model_name or "Assistant")
        lines += [f"## {who}", ""]
        if message.attachments:
            lines += ["Attached: " + ", ".join(f"`{d['name']}`" for d in message.attachments), ""]
        lines += [message.content.rstrip(), ""]
        others = len(tree.siblings(message)) - 1
        if others:
            lines += [f"*(one of {others + 1} versions of this message; the JSON export holds them all)*", ""]
    return "\n".join(lines).rstrip() + "\n"


def conversations_markdown(conversations) -> str:
    return "\n---\n\n".join(conversation_markdown(c) for c in conversations)
