"""The chat page's WebSocket: one JSON message per turn in, streamed deltas out.

Page -> server: {"type": "send"|"regenerate"|"edit", "conversation", "message", "content", "model",
                 "system_prompt", "temperature", "top_p", "max_tokens"} and {"type": "stop"}.
Server -> page: {"type": "start", ...}, {"type": "delta", "text"}, {"type": "done", "message", "usage",
                 "tokens_per_s", "prefix_cache_hit", "finish_reason"}, {"type": "error", "code", "message"}.

One generation at a time per socket, run as a task: "stop" and a closed socket cancel it, and
closing the EngineClient iterator (aclosing) aborts the request in the engine.

Bounds, from the user's ChatLimits: at most ``max_sockets`` open sockets per user (one more is
accepted only to be told {"type": "error", "code": "too_many_connections"} and closed with
TOO_MANY_SOCKETS); a frame larger than the message size allows, or one that is not JSON, is
answered with an error frame ("message_too_large", "invalid_json") and the socket stays usable.
Turns are held to the same limits as API keys (chat.services.turn_prepare). The limit store
(Redis) unreachable: a turn gets {"type": "error", "code": "queue_unavailable", "retry_after": 5},
a new socket the same frame, then the close code TRY_AGAIN_LATER (the page reconnects by itself).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from contextlib import aclosing

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from webapp.chat.selectors import message_to_dict
from webapp.chat.services import (LIMITS_UNAVAILABLE, LIMITS_UNAVAILABLE_RETRY_AFTER_S, ChatInputError, Turn,
                                  turn_finish, turn_prepare)
from webapp.config.shutdown import shutting_down, track
from webapp.keys.limits import LimitStoreUnavailable, get_limit_store
from webapp.keys.services import chatlimits_get_or_create
from webapp.usage.outcome import Outcome
from workers.connect import get_engine_client
from workers.protocol import NO_WORKER

logger = logging.getLogger(__name__)
NOT_AUTHENTICATED = 4401  # close code the page reads as "log in again"
TOO_MANY_SOCKETS = 4429  # close code: the user has max_sockets chat sockets open already
TRY_AGAIN_LATER = 1013  # close code: the limit store is unreachable, sockets cannot be counted
# A frame carries the message and the system prompt, each up to max_message_chars characters, as
# JSON (a character is at most 12 bytes escaped), plus the settings around them.
FRAME_OVERHEAD_BYTES = 4096


def max_frame_bytes(max_message_chars: int) -> int:
    return 2 * 12 * max_message_chars + FRAME_OVERHEAD_BYTES


def _sockets_name(limits) -> str:
    return f"{limits.counter_name}:sockets"


def _error_text(code: str, message: str, model: str) -> str:
    if code == NO_WORKER:
        return f"No worker is serving the model {model!r} right now. Start one, or pick another model."
    return message


class ChatConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        self.user = self.scope.get("user")
        self.task: asyncio.Task | None = None
        self.turn: Turn | None = None
        self.socket_id = uuid.uuid4().hex
        self.limits = None
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=NOT_AUTHENTICATED)
            return
        limits = await database_sync_to_async(chatlimits_get_or_create)(user=self.user)
        await self.accept()
        try:
            held = await self._hold_socket(limits)
        except LimitStoreUnavailable as exc:
            logger.warning("chat socket refused: %s", exc)
            await self.send_json({"type": "error", "code": LIMITS_UNAVAILABLE,
                                  "retry_after": LIMITS_UNAVAILABLE_RETRY_AFTER_S,
                                  "message": "The server cannot reach the store of its rate limits; "
                                             "reconnecting in a moment."})
            await self.close(code=TRY_AGAIN_LATER)
            return
        if not held:
            await self.send_json({"type": "error", "code": "too_many_connections",
                                  "message": f"You have {limits.max_sockets} chat connections open already; "
                                             f"close a tab and reload."})
            await self.close(code=TOO_MANY_SOCKETS)
            return
        self.limits = limits

    async def _hold_socket(self, limits) -> bool:
        """Take (or refresh: a slot expires after limits.SLOT_TTL_S) this socket's place."""
        store = get_limit_store()
        return await database_sync_to_async(store.slot_take)(_sockets_name(limits), self.socket_id,
                                                             limits.max_sockets, time.time())

    async def disconnect(self, code):
        task = getattr(self, "task", None)
        if task is not None and not task.done():
            task.cancel()  # closing the tab aborts the generation
            await asyncio.gather(task, return_exceptions=True)
        turn = getattr(self, "turn", None)
        if turn is not None and not turn.is_finished:  # cancelled before it ever ran
            await database_sync_to_async(turn_finish)(turn=turn, outcome=Outcome(), aborted=True)
        if getattr(self, "limits", None) is not None:
            await database_sync_to_async(get_limit_store().slot_release)(_sockets_name(self.limits), self.socket_id)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        """A frame: bounded in size and parsed here, so that a bad one gets an error frame, not a crash."""
        if self.limits is None:
            return  # refused socket, closing
        frame = text_data if text_data is not None else bytes_data
        if frame is None:
            return
        limit = max_frame_bytes(self.limits.max_message_chars)
        if len(frame) > limit:
            await self.send_json({"type": "error", "code": "message_too_large", "param": None,
                                  "message": f"This message is too large ({len(frame)} bytes; the most is {limit})."})
            return
        try:
            content = json.loads(frame)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
            await self.send_json({"type": "error", "code": "invalid_json", "param": None,
                                  "message": "The message is not valid JSON."})
            return
        try:
            await self._hold_socket(self.limits)
        except LimitStoreUnavailable:
            pass  # the socket stays; a turn that needs the store is refused in turn_prepare
        try:
            await self.receive_json(content)
        except Exception:
            logger.exception("chat turn failed")
            await self._send_safely({"type": "error", "code": "internal_error",
                                     "message": "The server had an error with this message."})

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict):
            await self.send_json({"type": "error", "code": "invalid_parameter", "message": "expected an object"})
            return
        if content.get("type") == "stop":
            if self.task is not None and not self.task.done():
                self.task.cancel()
            return
        if shutting_down():
            await self.send_json({"type": "error", "code": "server_shutting_down",
                                  "message": "The server is restarting; send this again in a moment."})
            return
        if self.task is not None and not self.task.done():
            await self.send_json({"type": "error", "code": "busy",
                                  "message": "An answer is still being written; stop it first."})
            return
        try:
            turn = await database_sync_to_async(turn_prepare)(user=self.user, data=content,
                                                              started=time.monotonic())
        except ChatInputError as exc:
            await self.send_json(exc.to_dict())
            return
        self.turn = turn
        try:
            await self.send_json({"type": "start", "request_id": turn.request_id, "model": turn.model.slug,
                                  "conversation": {"id": turn.conversation.pk, "title": turn.conversation.title},
                                  "user_message": message_to_dict(turn.user_message)})
        except BaseException:
            await asyncio.shield(database_sync_to_async(turn_finish)(turn=turn, outcome=Outcome(), aborted=True))
            raise
        # Tracked: a server shutting down waits for the answer (or records it as aborted).
        self.task = asyncio.create_task(self._generate(turn))
        track(turn.request_id, self.task, until_done=True)

    async def _generate(self, turn: Turn) -> None:
        outcome = Outcome()
        first_at = None
        first_tokens = 0
        aborted = False
        chunks = get_engine_client(settings.REDIS_URL).generate(turn.engine_request())
        try:
            async with aclosing(chunks):
                async for chunk in chunks:
                    outcome.add(chunk)
                    if chunk.error is not None:
                        break
                    if first_at is None and chunk.token_ids:
                        first_at, first_tokens = time.monotonic(), len(chunk.token_ids)
                    if chunk.text:
                        await self.send_json({"type": "delta", "text": chunk.text})
        except asyncio.CancelledError:
            aborted = True  # stop or a closed socket: aclosing has aborted the request
        except Exception:
            logger.exception("chat generation %s failed", turn.request_id)
        ended = time.monotonic()
        # Shielded: a second cancel (stop, then the tab closing) must not lose the saved answer.
        message = await asyncio.shield(database_sync_to_async(turn_finish)(turn=turn, outcome=outcome,
                                                                           aborted=aborted))
        if outcome.error is not None:
            await self._send_safely({"type": "error", "code": outcome.error.code,
                                     "message": _error_text(outcome.error.code, outcome.error.message,
                                                            turn.model.slug)})
            return
        if not aborted and not outcome.finished:
            await self._send_safely({"type": "error", "code": "internal_error",
                                     "message": "The server had an error while writing the answer."})
            return
        decode_tokens = outcome.num_output_tokens - first_tokens
        tokens_per_s = decode_tokens / (ended - first_at) if first_at and decode_tokens > 0 and ended > first_at \
            else None
        prompt_tokens = outcome.num_prompt_tokens or 0
        await self._send_safely({
            "type": "done", "finish_reason": "abort" if aborted else outcome.finish_reason,
            "message": message_to_dict(message) if message else None,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": outcome.num_output_tokens,
                      "cached_prompt_tokens": outcome.num_cached_tokens},
            "tokens_per_s": tokens_per_s, "time_to_first_token": outcome.time_to_first_token,
            "prefix_cache_hit": outcome.num_cached_tokens / prompt_tokens if prompt_tokens else 0.0})

    async def _send_safely(self, content: dict) -> None:
        try:
            await self.send_json(content)
        except Exception:  # the socket is already gone (tab closed)
            pass
