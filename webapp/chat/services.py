"""Writes of conversations, and one chat turn: the history becomes an engine request, its outcome a message.

Synchronous (ORM); the consumer calls these through ``database_sync_to_async``. Tokenizing goes
through registry.tokenizers (the model's own chat template); the chunks are summed by
usage.outcome.Outcome and recorded by usage.services.usage_record_finish, exactly as for the
OpenAI-compatible API. A turn is held to the user's ChatLimits by the API keys' own enforcement
(webapp.keys.enforcement): admitted before anything is saved, its worst case reserved once the
history is tokenized, settled in ``turn_finish``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from django.db import transaction

from webapp.chat.documents import DocumentError, documents_clean
from webapp.chat.grounding import grounded_history
from webapp.chat.models import Conversation, Message, ModelChatDefaults, SystemPromptPreset
from webapp.chat.prefix_sharing import shared_prefix_len
from webapp.chat.sampling import FIELDS as SAMPLING_FIELDS
from webapp.chat.sampling import SamplingError, sampling_params
from webapp.chat.selectors import Tree, conversation_get
from webapp.rag.knowledge import KnowledgeError, conversation_bases_set, preset_bases_set
from webapp.rag.services import IngestError
from webapp.keys.enforcement import LimitExceeded, limits_admit, limits_release, limits_reserve, worst_case_tokens
from webapp.keys.limits import LimitStoreUnavailable
from webapp.keys.models import FAIR_SHARE_WEIGHT_DEFAULT, ChatLimits
from webapp.keys.selectors import chatlimits_allows_model
from webapp.keys.services import chatlimits_get_or_create
from webapp.keys.tenancy import user_tenant
from webapp.registry.models import Model, ModelVersion
from webapp.registry.chat_templates import add_turn_ends
from webapp.registry.selectors import modelversion_get_active, modelversion_tokenizer
from webapp.registry.tokenizers import ChatTemplateError
from webapp.usage.models import CHAT_REQUEST_PREFIX, UsageRecord
from webapp.usage.outcome import Outcome
from webapp.usage.services import usage_record_finish, usage_record_start
from workers.protocol import GenerateRequest

TITLE_LENGTH = 60
ACTIONS = ("send", "regenerate", "edit")
# Usage is accounted under the chat-completions endpoint: the page is a chat completion without a key.
ENDPOINT = UsageRecord.Endpoint.CHAT_COMPLETIONS


class ChatInputError(Exception):
    """A turn the page must refuse; shown to the user as an error message."""

    def __init__(self, code: str, message: str, param: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.code, self.message, self.param, self.retry_after = code, message, param, retry_after

    def to_dict(self) -> dict:
        error = {"type": "error", "code": self.code, "message": self.message, "param": self.param}
        if self.retry_after is not None:
            error["retry_after"] = self.retry_after  # seconds, as the API's Retry-After
        return error


@dataclass
class Turn:
    request_id: str
    user: object
    conversation: Conversation
    user_message: Message
    model: Model
    version: ModelVersion
    prompt_token_ids: list[int]
    params: dict  # SamplingParams keyword arguments
    started: float  # time.monotonic()
    limits: ChatLimits | None = None  # what the turn holds until turn_finish settles it
    is_finished: bool = False
    shared_prefix_len: int = 0  # leading prompt tokens of a staff-shared system prompt
    sources: list = field(default_factory=list)  # the passages the prompt carries (Message.sources)

    def engine_request(self) -> GenerateRequest:
        # The logged-in user, never the page's message: the engine scopes its prefix cache to them,
        # and shares itself between users at the weight of their chat limits.
        weight = self.limits.fair_share_weight if self.limits else FAIR_SHARE_WEIGHT_DEFAULT
        return GenerateRequest(request_id=self.request_id, model=self.model.slug,
                               prompt_token_ids=self.prompt_token_ids, params=self.params,
                               tenant=user_tenant(self.user.pk), tenant_weight=weight,
                               shared_prefix_len=self.shared_prefix_len)


def conversation_create(*, user, title: str = "") -> Conversation:
    return Conversation.objects.create(user=user, title=title[:200])


def conversation_rename(*, conversation: Conversation, title: str) -> Conversation:
    conversation.title = title.strip()[:200]
    conversation.save(update_fields=["title", "updated_at"])
    return conversation


def conversation_delete(*, conversation: Conversation) -> None:
    conversation.delete()


def _text(data: dict, name: str, max_chars: int | None = None) -> str:
    value = data.get(name) or ""
    if not isinstance(value, str):
        raise ChatInputError("invalid_parameter", f"{name} must be text", name)
    if "\x00" in value:  # PostgreSQL's text cannot hold it
        raise ChatInputError("invalid_parameter", f"{name} must not hold a NUL character", name)
    if max_chars is not None and len(value) > max_chars:
        raise ChatInputError("message_too_large", f"This text has {len(value)} characters; the most allowed is "
                             f"{max_chars}.", name)
    return value


PRESET_NAME_LENGTH = 80


def preset_save(*, user, name, text, max_chars: int, knowledge_bases=None) -> SystemPromptPreset:
    """Save a system prompt under a name (the user's own preset of that name is replaced), with the
    knowledge bases it brings when ``knowledge_bases`` is a list (None: those it had)."""
    name, text = _text({"name": name}, "name", PRESET_NAME_LENGTH).strip(), _text({"text": text}, "text", max_chars)
    if not name:
        raise ChatInputError("invalid_parameter", "Give the preset a name.", "name")
    if not text.strip():
        raise ChatInputError("invalid_parameter", "A preset needs a system prompt.", "text")
    with transaction.atomic():
        preset, _ = SystemPromptPreset.objects.update_or_create(user=user, name=name, defaults={"text": text})
        if knowledge_bases is not None:
            try:
                preset_bases_set(user=user, preset=preset, base_ids=knowledge_bases)
            except KnowledgeError as exc:
                raise ChatInputError("invalid_parameter", exc.message, "knowledge_bases") from None
    return preset


def preset_delete(*, user, preset_id) -> bool:
    """Delete one of the user's own presets (staff's shared ones are deleted in the admin)."""
    return SystemPromptPreset.objects.filter(user=user, pk=_id(preset_id) or 0).delete()[0] > 0


def _user_message(conversation: Conversation, content: str, parent: Message | None,
                  attachments: list[dict]) -> Message:
    message = Message(conversation=conversation, role=Message.Role.USER, content=content, parent=parent,
                      attachments=attachments)
    message.root = parent is None
    message.save()
    return message


def _apply_action(*, user, action: str, data: dict, max_chars: int) -> tuple[Conversation, Message]:
    """Write the turn's user side: a new message at the end of the shown path, an edited version of
    one (a sibling: the original and what followed it stay), or an earlier message answered again."""
    conversation_id = data.get("conversation")
    conversation = conversation_get(user=user, conversation_id=conversation_id) if conversation_id else None
    if conversation_id and conversation is None:
        raise ChatInputError("not_found", "This conversation no longer exists.", "conversation")
    tree = Tree(conversation) if conversation is not None else None
    try:
        attachments = documents_clean(data.get("documents"))
    except DocumentError as exc:
        raise ChatInputError("invalid_document", exc.message, "documents") from None
    if action == "send":
        content = _text(data, "content", max_chars)
        if not content.strip():
            raise ChatInputError("invalid_parameter", "Type a message first.", "content")
        if conversation is None:
            conversation = conversation_create(user=user, title=" ".join(content.split())[:TITLE_LENGTH])
            return conversation, _user_message(conversation, content, None, attachments)
        parent = tree.by_id.get(_id(data.get("parent"))) if data.get("parent") is not None else tree.leaf()
        if data.get("parent") is not None and parent is None:
            raise ChatInputError("invalid_parameter", "The message to continue from is not in this conversation.",
                                 "parent")
        return conversation, _user_message(conversation, content, parent, attachments)
    if conversation is None:
        raise ChatInputError("invalid_parameter", f"{action} needs a conversation", "conversation")
    message = tree.by_id.get(_id(data.get("message")))
    if action == "regenerate":
        if message is None and data.get("message") is None:  # the last question on the shown path
            message = next((m for m in reversed(tree.path_to(tree.leaf())) if m.role == Message.Role.USER), None)
        elif message is not None and message.role == Message.Role.ASSISTANT:
            message = tree.by_id.get(message.parent_id)  # the answer's question, answered again
        if message is None or message.role != Message.Role.USER:
            raise ChatInputError("invalid_parameter", "There is no message to answer again.", "message")
        return conversation, message
    if message is None or message.role != Message.Role.USER:
        raise ChatInputError("invalid_parameter", "Only your own messages can be edited.", "message")
    content = _text(data, "content", max_chars)
    if not content.strip():
        raise ChatInputError("invalid_parameter", "A message cannot be empty.", "content")
    # An edited message keeps its documents unless the edit brings others.
    return conversation, _user_message(conversation, content, tree.by_id.get(message.parent_id),
                                       attachments if data.get("documents") is not None else message.attachments)


def _id(value) -> int | None:
    return int(value) if isinstance(value, int) or (isinstance(value, str) and value.isdigit()) else None


def conversation_switch(*, conversation: Conversation, message_id) -> list[Message] | None:
    """Show another version of a message: the path now runs through it and down its newest
    continuation. None if the message is not in the conversation."""
    tree = Tree(conversation)
    message = tree.by_id.get(_id(message_id))
    if message is None:
        return None
    leaf = tree.newest_leaf_under(message)
    Conversation.objects.filter(pk=conversation.pk).update(current_leaf=leaf)
    conversation.current_leaf = leaf
    return tree.path_to(leaf)


# The limit store (Redis) unreachable: the turn is refused as the API refuses a request (503
# queue_unavailable, Retry-After 5), as an error frame with the same code and retry_after.
LIMITS_UNAVAILABLE = "queue_unavailable"
LIMITS_UNAVAILABLE_RETRY_AFTER_S = 5


def _refused(exc: LimitExceeded | LimitStoreUnavailable) -> ChatInputError:
    if isinstance(exc, LimitStoreUnavailable):
        return ChatInputError(LIMITS_UNAVAILABLE, "The server cannot reach the store of its rate limits; "
                              "send this again in a moment.", None, LIMITS_UNAVAILABLE_RETRY_AFTER_S)
    return ChatInputError(exc.code, exc.message, None, exc.retry_after)


def _check_fits(prompt_ids: list[int], max_tokens: int | None, max_model_len: int | None, message: Message,
                model: str) -> None:
    """Refuse, before anything runs, a prompt the model's context cannot hold with its answer."""
    if not max_model_len or len(prompt_ids) + (max_tokens or 1) <= max_model_len:
        return
    names = [d["name"] for d in message.attachments]
    answer = f" plus {max_tokens} for the answer" if max_tokens else " plus at least one for the answer"
    what = f"With {', '.join(names)} the conversation" if names else "The conversation"
    raise ChatInputError(
        "context_length_exceeded",
        f"{what} needs {len(prompt_ids)} tokens{answer}; {model} reads at most {max_model_len}. "
        + ("Attach a shorter document, or start a new chat with it." if names
           else "Lower max tokens, or start a new chat."), "documents" if names else "max_tokens")


def turn_prepare(*, user, data: dict, started: float) -> Turn:
    """Validate a page message, admit it under the user's limits, save its user side, tokenize the
    whole history and reserve its worst case; ChatInputError if refused (then nothing is held)."""
    action = data.get("type")
    if action not in ACTIONS:
        raise ChatInputError("invalid_parameter", f"unknown message type {action!r}", "type")
    limits = chatlimits_get_or_create(user=user)
    slug = _text(data, "model")
    version = modelversion_get_active(slug=slug)
    if version is None or not chatlimits_allows_model(limits=limits, model=version.model):
        raise ChatInputError("model_not_found", f"The model {slug!r} is not served.", "model")
    if not version.tokenizer_dir:
        raise ChatInputError("model_not_ready", f"The model {slug!r} is still being prepared.", "model")
    defaults = ModelChatDefaults.objects.filter(model=version.model).first()
    try:
        # The page's values over the staff's defaults for the model, each within the API's limits.
        params = sampling_params({**(defaults.sampling if defaults else {}),
                                  **{k: v for k, v in data.items() if k in SAMPLING_FIELDS and v not in (None, "")}})
    except SamplingError as exc:
        raise ChatInputError("invalid_parameter", exc.message, exc.param) from None
    system_prompt = _text(data, "system_prompt", limits.max_message_chars)
    tokenizer = modelversion_tokenizer(version)
    params = add_turn_ends(params, tokenizer)  # a staff-set template's turn end
    request_id = CHAT_REQUEST_PREFIX + uuid.uuid4().hex
    try:
        limits_admit(subject=limits, request_id=request_id)
    except (LimitExceeded, LimitStoreUnavailable) as exc:
        raise _refused(exc) from exc
    try:
        with transaction.atomic():
            conversation, user_message = _apply_action(user=user, action=action, data=data,
                                                       max_chars=limits.max_message_chars)
            conversation.model_name, conversation.system_prompt = slug, system_prompt
            conversation.sampling = {k: v for k, v in params.items() if v is not None}
            conversation.current_leaf = user_message
            conversation.save(update_fields=["model_name", "system_prompt", "sampling", "current_leaf", "updated_at"])
            if data.get("knowledge_bases") is not None:  # the page's choice; absent: as before
                try:
                    conversation_bases_set(user=user, conversation=conversation, base_ids=data["knowledge_bases"])
                except KnowledgeError as exc:
                    raise ChatInputError("invalid_parameter", exc.message, "knowledge_bases") from None
            history = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
            max_model_len = version.engine_settings.get("max_model_len") or tokenizer.max_model_len
            # The prompt is the path shown, up to the message answered: other branches stay out of it.
            try:
                path, sources = grounded_history(user=user, path=Tree(conversation).path_to(user_message),
                                                 answered=user_message, max_model_len=max_model_len)
            except IngestError as exc:
                raise ChatInputError("invalid_document", exc.message, "documents") from None
            history += path
            try:
                # The same rendering every turn, so a conversation's earlier turns are a prefix of the
                # next prompt and the engine's prefix cache serves them.
                prompt_ids = tokenizer.apply_chat_template(history)
            except ChatTemplateError as exc:
                raise ChatInputError("invalid_parameter", str(exc), "messages") from exc
            num_shared = shared_prefix_len(tokenizer=tokenizer, messages=history, prompt_ids=prompt_ids)
            _check_fits(prompt_ids, params["max_tokens"], max_model_len, user_message, slug)
            try:  # last, so that a refusal also takes back the saved message
                limits_reserve(subject=limits, request_id=request_id, tokens=worst_case_tokens(
                    num_prompt_tokens=len(prompt_ids), max_tokens=params["max_tokens"],
                    max_model_len=max_model_len), model_id=version.model_id, num_prompt_tokens=len(prompt_ids))
                usage_record_start(request_id=request_id, endpoint=ENDPOINT, started=started, model=version.model,
                                   version=version, num_prompt_tokens=len(prompt_ids), user=user)
            except (LimitExceeded, LimitStoreUnavailable) as exc:
                raise _refused(exc) from exc
    except BaseException:
        limits_release(subject=limits, request_id=request_id)
        raise
    return Turn(request_id=request_id, user=user, conversation=conversation,
                user_message=user_message, model=version.model, version=version, prompt_token_ids=prompt_ids,
                params=params, started=started, limits=limits, shared_prefix_len=num_shared, sources=sources)


def turn_finish(*, turn: Turn, outcome: Outcome, aborted: bool = False) -> Message | None:
    """Save the answer (a stopped one keeps what had arrived) and complete its usage record, which
    settles what the turn held under the user's limits (once: a second call does nothing)."""
    if turn.is_finished:
        return None
    turn.is_finished = True
    try:
        with transaction.atomic():
            record = usage_record_finish(
                request_id=turn.request_id, endpoint=ENDPOINT, started=turn.started, outcome=outcome,
                model=turn.model, version=turn.version, num_prompt_tokens=len(turn.prompt_token_ids), user=turn.user,
                limits=turn.limits, aborted=aborted)
            if not outcome.text and record.status != UsageRecord.Status.OK:
                return None
            finish_reason = {UsageRecord.Status.ABORTED: "abort", UsageRecord.Status.ERROR: ""}.get(
                record.status, record.finish_reason)
            answer = Message.objects.create(
                conversation=turn.conversation, parent=turn.user_message, role=Message.Role.ASSISTANT,
                content=outcome.text, model_name=turn.model.slug, prompt_tokens=record.prompt_tokens,
                completion_tokens=record.completion_tokens, cached_prompt_tokens=record.cached_prompt_tokens,
                finish_reason=finish_reason, sources=turn.sources)
            Conversation.objects.filter(pk=turn.conversation.pk).update(current_leaf=answer)
            return answer
    except BaseException:  # rolled back, the settling too: free what the turn holds
        if turn.limits is not None:
            limits_release(subject=turn.limits, request_id=turn.request_id)
        raise
