"""Following, from this web process, an answer that another one runs (distributed mode: the Redis
answer board, chat.relay, makes one for a socket and hands it what the owner sends).

A socket that attaches to an answer registered by another process gets a ``Follower``: it joins
the answer's group, then asks the owner for the text so far ("chat.attach"). The owner's reply
("chat.resume") carries the number of the last frame already in that text; frames arrive
numbered, so the follower shows each one once and in order, whichever came first (a frame from
before the snapshot is dropped, one from after it waits for it). A missing frame (the group send
dropped it: Redis hiccup, a full channel) is healed by asking for a fresh snapshot after
``GAP_S``: the page gets one more "resume" with the whole text so far.

Failure: every ``CHECK_S`` the follower looks at the registry. The owner renews its entry every
third of its lifetime while it lives; once the entry has been missing for longer than one
renewal (so not a Redis restart the owner has yet to re-register after) and no last frame came
(the owner died, or its last frame was lost), the follower ends from the database: the stored
answer as a "done" frame, or {"type": "error", "code": "answer_lost"} when nothing was stored.
A registry it cannot read for ``UNREACHABLE_S`` ends it too ("answer_unreachable": reload later).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

import redis
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from webapp.chat.generations import relay_ttl_s
from webapp.chat.models import Message
from webapp.chat.selectors import Tree
from webapp.usage.models import UsageRecord

logger = logging.getLogger(__name__)
CHECK_S = 1.0  # how often the registry is looked at
GAP_S = 2.0  # a frame missing this long (later ones arrived): ask for a fresh snapshot
RESUME_S = 5.0  # the owner's answer to "chat.attach" awaited this long: ask again
UNREACHABLE_S = 30.0  # the registry unreadable this long: give up following
STORE_TRIES = 3  # an answer just stopped may take a moment to be stored


class Follower:
    def __init__(self, *, board, entry: dict, conversation_id: int, user_id: int, channel_name: str,
                 emit: Callable[[dict], None], on_end: Callable[["Follower"], None]):
        self.board = board  # the RedisAnswerBoard: the registry, and the way to the owner
        self.entry, self.request_id, self.owner = entry, entry["request_id"], entry["owner"]
        self.conversation_id, self.user_id, self.channel_name = conversation_id, user_id, channel_name
        self.emit, self.on_end = emit, on_end
        self.shown: int | None = None  # number of the last frame shown; None until a snapshot came
        self.pending: dict[int, dict] = {}  # frames that arrived ahead of their turn, by number
        self.waiting_since: float | None = None  # a snapshot or a missing frame awaited since
        self.ended = False
        self.baseline = 0  # the newest earlier answer to the same question (for the store's one)
        self.watch: asyncio.Task | None = None

    def message(self, kind: str) -> dict:
        return {"type": kind, "conversation": self.conversation_id, "request_id": self.request_id,
                "user": self.user_id, "reply_to": self.channel_name}

    async def begin(self) -> None:
        question = self.entry["start_frame"]["user_message"]["id"]
        self.baseline = await database_sync_to_async(_newest_answer_id)(question)
        await get_channel_layer().group_add(self.board.group_name(self.request_id), self.channel_name)
        await self._ask()
        self.watch = asyncio.create_task(self._watching())

    async def stop(self) -> None:
        await self.board.send(self.owner, self.message("chat.stop"))

    async def close(self) -> None:
        """The socket went away, or the answer ended: leave the group (and tell the owner)."""
        if not self.ended:
            self.ended = True
            await self.board.send(self.owner, self.message("chat.detach"))
        if self.watch is not None and self.watch is not asyncio.current_task():
            self.watch.cancel()
        try:
            await get_channel_layer().group_discard(self.board.group_name(self.request_id), self.channel_name)
        except Exception as exc:
            logger.warning("chat follow: leaving %s failed: %s", self.request_id, exc)

    # ------------------------------------------------------------- what the owner sends
    def on_resume(self, message: dict) -> None:
        if self.ended or (self.shown is not None and message["seq"] <= self.shown):
            return  # an older snapshot than what is shown (two asks answered)
        self.shown, self.waiting_since = message["seq"], None
        for seq in [s for s in self.pending if s <= self.shown]:
            del self.pending[seq]
        self.emit(message["frame"])
        self._drain()

    def on_frames(self, message: dict) -> None:
        if self.ended:
            return
        for offset, frame in enumerate(message["frames"]):
            seq = message["first"] + offset
            if self.shown is None or seq > self.shown:
                self.pending[seq] = frame
        self._drain()

    async def on_gone(self) -> None:
        """The answer ended before the owner heard this follower: it is in the database."""
        if not self.ended:
            await self._conclude()

    def _drain(self) -> None:
        if self.shown is None:
            return
        while self.shown + 1 in self.pending:
            frame = self.pending.pop(self.shown + 1)
            self.shown += 1
            self.emit(frame)
            if frame["type"] in ("done", "error"):
                self._end()
                return
        if not self.pending:
            self.waiting_since = None
        elif self.waiting_since is None:
            self.waiting_since = time.monotonic()

    def _end(self) -> None:
        self.ended = True
        self.on_end(self)
        asyncio.ensure_future(self.close())

    # ------------------------------------------------------------- when the owner goes quiet
    async def _ask(self) -> None:
        self.shown, self.waiting_since = None, time.monotonic()
        await self.board.send(self.owner, self.message("chat.attach"))

    async def _watching(self) -> None:
        misses, unreadable_since, said_at = 0, None, time.monotonic()
        while not self.ended:
            await asyncio.sleep(CHECK_S)
            if self.ended:
                return
            if time.monotonic() - said_at >= relay_ttl_s() / 3:
                said_at = time.monotonic()
                await self.board.send(self.owner, self.message("chat.hear"))  # still listening
            waited = time.monotonic() - self.waiting_since if self.waiting_since is not None else 0.0
            if waited > (RESUME_S if self.shown is None else GAP_S):
                logger.info("chat follow: %s: a fresh snapshot (%s)", self.request_id,
                            "no answer" if self.shown is None else f"frame {self.shown + 1} missing")
                await self._ask()
            try:
                found = await self.board.entry(self.conversation_id, user_id=self.user_id, strict=True)
                unreadable_since = None
            except redis.RedisError:
                unreadable_since = unreadable_since or time.monotonic()
                if time.monotonic() - unreadable_since > UNREACHABLE_S:
                    await self._conclude(unreachable=True)
                continue
            misses = misses + 1 if found is None or found["request_id"] != self.request_id else 0
            if misses >= max(2, math.ceil((relay_ttl_s() / 3 + CHECK_S) / CHECK_S)):  # ended, or its owner died
                await self._conclude()

    async def _conclude(self, unreachable: bool = False) -> None:
        """End from the database: the stored answer, or a clear error when none was stored."""
        question = self.entry["start_frame"]["user_message"]["id"]
        stored = None
        for attempt in range(STORE_TRIES):
            stored = await database_sync_to_async(_stored)(self.request_id, question, self.baseline)
            if stored is not None or self.ended:
                break
            await asyncio.sleep(CHECK_S)
        if self.ended:
            return
        if stored is not None:
            self.emit({"type": "done", "conversation": {"id": self.conversation_id}, **stored})
        elif unreachable:
            self.emit({"type": "error", "code": "answer_unreachable",
                       "message": "The server writing this answer cannot be reached; reload later to see it."})
        else:
            logger.warning("chat follow: answer %s ended without being stored (its web process died?)",
                           self.request_id)
            self.emit({"type": "error", "code": "answer_lost",
                       "message": "The server writing this answer stopped before it finished; it was not saved."})
        self._end()


def _newest_answer_id(question_id: int) -> int:
    newest = Message.objects.filter(parent_id=question_id, role=Message.Role.ASSISTANT).order_by("-id").first()
    return newest.pk if newest is not None else 0


def _stored(request_id: str, question_id: int, baseline: int) -> dict | None:
    """The finished turn's last frame, from the database; None while its usage record runs (or is not written)."""
    record = UsageRecord.objects.filter(request_id=request_id).exclude(status=UsageRecord.Status.RUNNING).first()
    if record is None:
        return None
    answer = (Message.objects.filter(parent_id=question_id, role=Message.Role.ASSISTANT, pk__gt=baseline)
              .select_related("conversation").order_by("-id").first())
    return {"finish_reason": answer.finish_reason if answer is not None else "abort",
            "message": Tree(answer.conversation).to_dict(answer) if answer is not None else None,
            "usage": {"prompt_tokens": record.prompt_tokens, "completion_tokens": record.completion_tokens,
                      "cached_prompt_tokens": record.cached_prompt_tokens}}
