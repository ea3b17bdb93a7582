"""The chat page's WebSocket: one JSON message per turn in, streamed deltas out.

Page -> server: {"type": "send"|"regenerate"|"edit", "conversation", "message", "content", "model",
                 "system_prompt", "temperature", "top_p", "max_tokens"} and {"type": "stop"}.
Server -> page: {"type": "start", ...}, {"type": "delta", "text"}, {"type": "done", "message", "usage",
                 "tokens_per_s", "prefix_cache_hit", "finish_reason"}, {"type": "error", "code", "message"}.

One generation at a time per socket, run as a task: "stop" and a closed socket cancel it, and
closing the EngineClient iterator (aclosing) aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from webapp.chat.selectors import message_to_dict
from webapp.chat.services import ChatInputError, Turn, turn_finish, turn_prepare
from webapp.config.shutdown import shutting_down, track
from webapp.usage.outcome import Outcome
from workers.connect import get_engine_client
from workers.protocol import NO_WORKER

logger = logging.getLogger(__name__)
NOT_AUTHENTICATED = 4401  # close code the page reads as "log in again"


def _error_text(code: str, message: str, model: str) -> str:
    if code == NO_WORKER:
        return f"No worker is serving the model {model!r} right now. Start one, or pick another model."
    return message


class ChatConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        self.user = self.scope.get("user")
        self.task: asyncio.Task | None = None
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=NOT_AUTHENTICATED)
            return
        await self.accept()

    async def disconnect(self, code):
        task = getattr(self, "task", None)
        if task is not None and not task.done():
            task.cancel()  # closing the tab aborts the generation
            await asyncio.gather(task, return_exceptions=True)

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
        await self.send_json({"type": "start", "request_id": turn.request_id, "model": turn.model.slug,
                              "conversation": {"id": turn.conversation.pk, "title": turn.conversation.title},
                              "user_message": message_to_dict(turn.user_message)})
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
