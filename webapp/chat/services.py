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
from dataclasses import dataclass

from django.db import transaction

from webapp.chat.models import Conversation, Message
from webapp.chat.selectors import conversation_get
from webapp.keys.enforcement import LimitExceeded, limits_admit, limits_release, limits_reserve, worst_case_tokens
from webapp.keys.limits import LimitStoreUnavailable
from webapp.keys.models import ChatLimits
from webapp.keys.selectors import chatlimits_allows_model
from webapp.keys.services import chatlimits_get_or_create
from webapp.registry.models import Model, ModelVersion
from webapp.registry.selectors import modelversion_get_active
from webapp.registry.tokenizers import ChatTemplateError, load_tokenizer
from webapp.usage.models import UsageRecord
from webapp.usage.outcome import Outcome
from webapp.usage.services import usage_record_finish
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

    def engine_request(self) -> GenerateRequest:
        return GenerateRequest(request_id=self.request_id, model=self.model.slug,
                               prompt_token_ids=self.prompt_token_ids, params=self.params)


def conversation_create(*, user, title: str = "") -> Conversation:
    return Conversation.objects.create(user=user, title=title[:200])


def conversation_rename(*, conversation: Conversation, title: str) -> Conversation:
    conversation.title = title.strip()[:200]
    conversation.save(update_fields=["title", "updated_at"])
    return conversation


def conversation_delete(*, conversation: Conversation) -> None:
    conversation.delete()


def _number(data: dict, name: str, low: float, high: float, *, integer: bool = False):
    value = data.get(name)
    if value is None or value == "":
        return None
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        raise ChatInputError("invalid_parameter", f"{name} must be a number", name) from None
    if not low <= number <= high:
        raise ChatInputError("invalid_parameter", f"{name} must be between {low} and {high}", name)
    return number


def _sampling_params(data: dict) -> dict:
    params = {"max_tokens": _number(data, "max_tokens", 1, 1_000_000, integer=True)}
    for name, high in (("temperature", 2.0), ("top_p", 1.0)):
        value = _number(data, name, 0.0, high)
        if value is not None:
            params[name] = value
    return params


def _text(data: dict, name: str, max_chars: int | None = None) -> str:
    value = data.get(name) or ""
    if not isinstance(value, str):
        raise ChatInputError("invalid_parameter", f"{name} must be text", name)
    if max_chars is not None and len(value) > max_chars:
        raise ChatInputError("message_too_large", f"This text has {len(value)} characters; the most allowed is "
                             f"{max_chars}.", name)
    return value


def _apply_action(*, user, action: str, data: dict, max_chars: int) -> tuple[Conversation, Message]:
    """Write the turn's user side: a new message, an edited one, or the last one again."""
    conversation_id = data.get("conversation")
    conversation = conversation_get(user=user, conversation_id=conversation_id) if conversation_id else None
    if conversation_id and conversation is None:
        raise ChatInputError("not_found", "This conversation no longer exists.", "conversation")
    if action == "send":
        content = _text(data, "content", max_chars)
        if not content.strip():
            raise ChatInputError("invalid_parameter", "Type a message first.", "content")
        if conversation is None:
            conversation = conversation_create(user=user, title=" ".join(content.split())[:TITLE_LENGTH])
        return conversation, Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                                    content=content)
    if conversation is None:
        raise ChatInputError("invalid_parameter", f"{action} needs a conversation", "conversation")
    if action == "regenerate":
        user_message = conversation.messages.filter(role=Message.Role.USER).last()
        if user_message is None:
            raise ChatInputError("invalid_parameter", "There is no message to answer again.", "conversation")
    else:
        user_message = conversation.messages.filter(role=Message.Role.USER, pk=data.get("message")).first() \
            if str(data.get("message", "")).isdigit() else None
        if user_message is None:
            raise ChatInputError("invalid_parameter", "Only your own messages can be edited.", "message")
        content = _text(data, "content", max_chars)
        if not content.strip():
            raise ChatInputError("invalid_parameter", "A message cannot be empty.", "content")
        user_message.content = content
        user_message.save(update_fields=["content"])
    # Everything after the message is replaced by the new answer.
    conversation.messages.filter(pk__gt=user_message.pk).delete()
    return conversation, user_message


# The limit store (Redis) unreachable: the turn is refused as the API refuses a request (503
# queue_unavailable, Retry-After 5), as an error frame with the same code and retry_after.
LIMITS_UNAVAILABLE = "queue_unavailable"
LIMITS_UNAVAILABLE_RETRY_AFTER_S = 5


def _refused(exc: LimitExceeded | LimitStoreUnavailable) -> ChatInputError:
    if isinstance(exc, LimitStoreUnavailable):
        return ChatInputError(LIMITS_UNAVAILABLE, "The server cannot reach the store of its rate limits; "
                              "send this again in a moment.", None, LIMITS_UNAVAILABLE_RETRY_AFTER_S)
    return ChatInputError(exc.code, exc.message, None, exc.retry_after)


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
    params = _sampling_params(data)
    system_prompt = _text(data, "system_prompt", limits.max_message_chars)
    tokenizer = load_tokenizer(version.tokenizer_dir)
    request_id = "chat-" + uuid.uuid4().hex
    try:
        limits_admit(subject=limits, request_id=request_id)
    except (LimitExceeded, LimitStoreUnavailable) as exc:
        raise _refused(exc) from exc
    try:
        with transaction.atomic():
            conversation, user_message = _apply_action(user=user, action=action, data=data,
                                                       max_chars=limits.max_message_chars)
            conversation.model_name, conversation.system_prompt = slug, system_prompt
            conversation.save(update_fields=["model_name", "system_prompt", "updated_at"])
            history = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
            history += [{"role": m.role, "content": m.content} for m in conversation.messages.all()]
            try:
                # The same rendering every turn, so a conversation's earlier turns are a prefix of the
                # next prompt and the engine's prefix cache serves them.
                prompt_ids = tokenizer.apply_chat_template(history)
            except ChatTemplateError as exc:
                raise ChatInputError("invalid_parameter", str(exc), "messages") from exc
            try:  # last, so that a refusal also takes back the saved message
                limits_reserve(subject=limits, request_id=request_id, tokens=worst_case_tokens(
                    num_prompt_tokens=len(prompt_ids), max_tokens=params["max_tokens"],
                    max_model_len=version.engine_settings.get("max_model_len") or tokenizer.max_model_len))
            except (LimitExceeded, LimitStoreUnavailable) as exc:
                raise _refused(exc) from exc
    except BaseException:
        limits_release(subject=limits, request_id=request_id)
        raise
    return Turn(request_id=request_id, user=user, conversation=conversation,
                user_message=user_message, model=version.model, version=version, prompt_token_ids=prompt_ids,
                params=params, started=started, limits=limits)


def turn_finish(*, turn: Turn, outcome: Outcome, aborted: bool = False) -> Message | None:
    """Save the answer (a stopped one keeps what had arrived) and its usage record, and settle
    what the turn held under the user's limits (once: a second call does nothing)."""
    if turn.is_finished:
        return None
    turn.is_finished = True
    record = None
    try:
        with transaction.atomic():
            record = usage_record_finish(
                request_id=turn.request_id, endpoint=ENDPOINT, started=turn.started, outcome=outcome,
                model=turn.model, version=turn.version, num_prompt_tokens=len(turn.prompt_token_ids), user=turn.user,
                aborted=aborted)
            if not outcome.text and record.status != UsageRecord.Status.OK:
                return None
            finish_reason = {UsageRecord.Status.ABORTED: "abort", UsageRecord.Status.ERROR: ""}.get(
                record.status, record.finish_reason)
            return Message.objects.create(
                conversation=turn.conversation, role=Message.Role.ASSISTANT, content=outcome.text,
                model_name=turn.model.slug, prompt_tokens=record.prompt_tokens,
                completion_tokens=record.completion_tokens, cached_prompt_tokens=record.cached_prompt_tokens,
                finish_reason=finish_reason)
    finally:
        if turn.limits is not None:
            tokens = record.prompt_tokens + record.completion_tokens if record is not None else 0
            limits_release(subject=turn.limits, request_id=turn.request_id, tokens=tokens)
