"""The chat page's WebSocket: one JSON message per turn in, streamed deltas out.

Page -> server: {"type": "send"|"regenerate"|"edit", "conversation", "message", "content", "model",
                 "system_prompt", "temperature", "top_p", "max_tokens"}, {"type": "stop", "conversation"}
                 {"type": "attach", "conversation"} and {"type": "switch", "conversation", "message"}
                 (show another version of a message; answered with {"type": "path", "messages"}),
                 {"type": "preset_save", "name", "text", "knowledge_bases"?} and {"type": "preset_delete", "id"} (answered
                 with {"type": "presets", "presets"}).
Server -> page: {"type": "start", ...}, {"type": "resume", ..., "text"} (an answer already running:
                 the text so far), {"type": "idle", "conversation"} (none is), {"type": "delta", "text"},
                 {"type": "done", "message", "usage", "tokens_per_s", "prefix_cache_hit", "finish_reason"},
                 {"type": "error", "code", "message"}.

A turn's generation belongs to its conversation, not to the socket: the answer board
(chat.board, the only way this socket learns about running answers) keeps it running when the
socket closes, and any socket of the user can attach to it, on this web process or (distributed
mode) another one. One at a time per conversation; "stop" cancels it, and closing the
EngineClient iterator (aclosing) aborts the request in the engine. Every frame after the
handshake goes through the socket's outbox queue, so that frames from the generation and from the
socket keep their order. An answer followed on another process reaches this socket as
channel-layer messages ("chat.resume", "chat.frames", "chat.gone"), handed to the board.

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
import logging
import time
import uuid

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from webapp.chat.board import Socket
from webapp.chat.boards import get_answer_board
from webapp.chat.documents import MAX_DOCUMENT_FRAME_BYTES
from webapp.chat.selectors import conversation_get, message_path_dicts, message_to_dict, preset_list
from webapp.chat.services import (LIMITS_UNAVAILABLE, LIMITS_UNAVAILABLE_RETRY_AFTER_S, ChatInputError,
                                  conversation_switch, preset_delete, preset_save, turn_finish, turn_prepare)
from webapp.config.shutdown import shutting_down
from webapp.keys.limits import LimitStoreUnavailable, get_limit_store
from webapp.keys.services import chatlimits_get_or_create
from webapp.openai_api.body import JsonInputError, json_read
from webapp.usage.outcome import Outcome

logger = logging.getLogger(__name__)
NOT_AUTHENTICATED = 4401  # close code the page reads as "log in again"
TOO_MANY_SOCKETS = 4429  # close code: the user has max_sockets chat sockets open already
TRY_AGAIN_LATER = 1013  # close code: the limit store is unreachable, sockets cannot be counted
# A frame carries the message and the system prompt, each up to max_message_chars characters, as
# JSON (a character is at most 12 bytes escaped), plus the settings around them.
FRAME_OVERHEAD_BYTES = 4096


def max_frame_bytes(max_message_chars: int) -> int:
    """The message, the system prompt and the attached documents (chat.documents), as JSON."""
    return 2 * 12 * max_message_chars + FRAME_OVERHEAD_BYTES + MAX_DOCUMENT_FRAME_BYTES


def _sockets_name(limits) -> str:
    return f"{limits.counter_name}:sockets"


class ChatConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        self.user = self.scope.get("user")
        self.socket_id = uuid.uuid4().hex
        self.limits = None
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.pump: asyncio.Task | None = None
        self.board = get_answer_board()
        self.socket: Socket | None = None
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=NOT_AUTHENTICATED)
            return
        self.socket = Socket(user=self.user, outbox=self.outbox, channel_name=self.channel_name)
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
        self.pump = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        while True:
            frame = await self.outbox.get()
            try:
                await self.send_json(frame)
            except Exception:  # the socket is already gone (tab closed)
                return

    def emit(self, frame: dict) -> None:
        self.outbox.put_nowait(frame)

    async def _hold_socket(self, limits) -> bool:
        """Take (or refresh: a slot expires after limits.SLOT_TTL_S) this socket's place."""
        store = get_limit_store()
        return await database_sync_to_async(store.slot_take)(_sockets_name(limits), self.socket_id,
                                                             limits.max_sockets, time.time())

    async def disconnect(self, code):
        if getattr(self, "socket", None) is not None:
            await self.board.leave(self.socket)  # the answers themselves keep running
        pump = getattr(self, "pump", None)
        if pump is not None:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
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
            self.emit({"type": "error", "code": "message_too_large", "param": None,
                       "message": f"This message is too large ({len(frame)} bytes; the most is {limit})."})
            return
        try:  # numbers as the API reads them: one no setting can hold is refused naming it
            content = json_read(frame, check_text=False)
        except JsonInputError as exc:
            if exc.is_syntax:  # not JSON, not UTF-8, nested too deep
                self.emit({"type": "error", "code": "invalid_json", "param": None,
                           "message": "The message is not valid JSON."})
            else:
                self.emit({"type": "error", "code": "invalid_parameter", "param": exc.param,
                           "message": f"{exc.param or 'The message'} {exc.problem}."})
            return
        try:
            await self._hold_socket(self.limits)
        except LimitStoreUnavailable:
            pass  # the socket stays; a turn that needs the store is refused in turn_prepare
        try:
            await self.receive_json(content)
        except Exception:
            logger.exception("chat turn failed")
            self.emit({"type": "error", "code": "internal_error",
                       "message": "The server had an error with this message."})

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict):
            self.emit({"type": "error", "code": "invalid_parameter", "message": "expected an object"})
            return
        kind, conversation_id = content.get("type"), content.get("conversation")
        if kind == "stop":
            await self.board.stop(self.socket, conversation_id)
            return
        if kind == "attach":
            if not await self.board.attach(self.socket, conversation_id):
                self.emit({"type": "idle", "conversation": conversation_id})
            return
        if kind in ("preset_save", "preset_delete"):
            await self._preset(kind, content)
            return
        busy = await self.board.is_running(conversation_id, user=self.user)
        if kind == "switch":
            await self._switch(conversation_id, content.get("message"), busy)
            return
        if shutting_down():
            self.emit({"type": "error", "code": "server_shutting_down",
                       "message": "The server is restarting; send this again in a moment."})
            return
        claim = int(conversation_id) if str(conversation_id).isdigit() else None
        if busy or not self.board.claim(claim):
            self.emit({"type": "error", "code": "busy",
                       "message": "An answer is still being written in this conversation; stop it first."})
            return
        try:
            turn = await database_sync_to_async(turn_prepare)(user=self.user, data=content,
                                                              started=time.monotonic())
        except ChatInputError as exc:
            self.emit(exc.to_dict())
            return
        finally:
            self.board.unclaim(claim)
        try:
            path = await database_sync_to_async(message_path_dicts)(conversation=turn.conversation,
                                                                    leaf=turn.user_message)
        except BaseException:  # the turn holds its limits and a running usage record: end them
            await asyncio.shield(database_sync_to_async(turn_finish)(turn=turn, outcome=Outcome(), aborted=True))
            raise
        start_frame = {"type": "start", "request_id": turn.request_id, "model": turn.model.slug,
                       "conversation": {"id": turn.conversation.pk, "title": turn.conversation.title},
                       "user_message": message_to_dict(turn.user_message), "path": path}
        self.board.start(self.socket, turn=turn, start_frame=start_frame)

    async def chat_resume(self, message: dict) -> None:
        """An answer another web process runs, followed by this socket (the board's follower)."""
        await self.board.relayed(self.socket, message)

    chat_frames = chat_gone = chat_resume

    async def _switch(self, conversation_id, message_id, busy: bool) -> None:
        """Show another version of a message: {"type": "path", "messages"} with the path through it."""
        if busy:
            self.emit({"type": "error", "code": "busy", "param": "message",
                       "message": "An answer is still being written in this conversation; stop it first."})
            return

        def switch():
            conversation = conversation_get(user=self.user, conversation_id=conversation_id)
            if conversation is None or conversation_switch(conversation=conversation, message_id=message_id) is None:
                return None
            return message_path_dicts(conversation=conversation)

        messages = await database_sync_to_async(switch)()
        if messages is None:
            self.emit({"type": "error", "code": "not_found", "param": "message",
                       "message": "This message is not in the conversation."})
            return
        self.emit({"type": "path", "conversation": int(conversation_id), "messages": messages})

    async def _preset(self, kind: str, content: dict) -> None:
        def change():
            if kind == "preset_save":
                preset_save(user=self.user, name=content.get("name"), text=content.get("text"),
                            max_chars=self.limits.max_message_chars, knowledge_bases=content.get("knowledge_bases"))
            else:
                preset_delete(user=self.user, preset_id=content.get("id"))
            return preset_list(user=self.user)

        try:
            self.emit({"type": "presets", "presets": await database_sync_to_async(change)()})
        except ChatInputError as exc:
            self.emit(exc.to_dict())
