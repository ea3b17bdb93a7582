"""Reads of conversations; every read is scoped to its owner.

A conversation's messages form a tree (chat.models); ``message_path`` is the path the page
shows, each message with its siblings (the versions the page moves between with ‹ 2/3 ›).
"""

from __future__ import annotations

from django.db.models import F, Q, QuerySet

from webapp.chat.models import Conversation, Message, ModelChatDefaults, SystemPromptPreset


def conversation_list(*, user) -> QuerySet[Conversation]:
    return Conversation.objects.filter(user=user)


def conversation_get(*, user, conversation_id) -> Conversation | None:
    """The user's conversation, or None (another user's id reads as missing)."""
    try:
        return Conversation.objects.filter(user=user, pk=int(conversation_id)).first()
    except (TypeError, ValueError):
        return None


def message_list(*, conversation: Conversation) -> QuerySet[Message]:
    """Every message of the conversation, all branches, oldest first."""
    return conversation.messages.all()


class Tree:
    """A conversation's messages in memory: parents, children and siblings without more queries."""

    def __init__(self, conversation: Conversation):
        self.conversation = conversation
        self.by_id = {m.pk: m for m in message_list(conversation=conversation)}
        self.children: dict[int | None, list[Message]] = {}
        for message in self.by_id.values():  # oldest first: a message's versions in the order written
            self.children.setdefault(message.parent_id, []).append(message)

    def siblings(self, message: Message) -> list[Message]:
        return self.children.get(message.parent_id, [message])

    def newest_leaf_under(self, message: Message) -> Message:
        """Down from ``message`` along the newest child each time: where a branch's continuation ends."""
        while self.children.get(message.pk):
            message = self.children[message.pk][-1]
        return message

    def leaf(self) -> Message | None:
        leaf = self.by_id.get(self.conversation.current_leaf_id)
        if leaf is None and self.by_id:
            leaf = self.by_id[max(self.by_id)]
        return leaf

    def path_to(self, message: Message | None) -> list[Message]:
        path = []
        while message is not None:
            path.append(message)
            message = self.by_id.get(message.parent_id)
        return path[::-1]

    def to_dict(self, message: Message) -> dict:
        siblings = [m.pk for m in self.siblings(message)]
        return {**message_to_dict(message), "siblings": siblings, "index": siblings.index(message.pk) + 1}


def message_path(*, conversation: Conversation, leaf: Message | None = None) -> list[Message]:
    """The shown path: from a root to ``leaf`` (default: the conversation's current leaf)."""
    tree = Tree(conversation)
    return tree.path_to(tree.by_id.get(leaf.pk) if leaf is not None else tree.leaf())


def message_path_dicts(*, conversation: Conversation, leaf: Message | None = None) -> list[dict]:
    tree = Tree(conversation)
    return [tree.to_dict(m) for m in tree.path_to(tree.by_id.get(leaf.pk) if leaf is not None else tree.leaf())]


def message_to_dict(message: Message) -> dict:
    return {"id": message.pk, "role": message.role, "content": message.content, "model": message.model_name,
            "parent": message.parent_id, "documents": [d["name"] for d in message.attachments],
            "prompt_tokens": message.prompt_tokens, "completion_tokens": message.completion_tokens,
            "cached_prompt_tokens": message.cached_prompt_tokens, "finish_reason": message.finish_reason,
            "sources": message.sources}


def preset_list(*, user) -> list[dict]:
    """The system prompt presets the user can pick: everyone's (staff's), then the user's own."""
    presets = SystemPromptPreset.objects.filter(Q(user=None) | Q(user=user)).order_by(F("user").asc(nulls_first=True),
                                                                                       "name", "id")
    from webapp.rag.knowledge import preset_bases

    presets = list(presets)
    bases = preset_bases(user=user, preset_ids=[p.pk for p in presets])  # those the user may read now
    return [{"id": p.pk, "name": p.name, "text": p.text, "shared": p.user_id is None,
             "knowledge_bases": bases.get(p.pk, [])} for p in presets]


def chat_defaults_by_model(*, slugs: list[str]) -> dict[str, dict]:
    """Staff's defaults of the models ``slugs``: {slug: {"sampling": {...}, "system_prompt": str}}."""
    return {d.model.slug: {"sampling": d.sampling, "system_prompt": d.system_prompt}
            for d in ModelChatDefaults.objects.filter(model__slug__in=slugs).select_related("model")}
