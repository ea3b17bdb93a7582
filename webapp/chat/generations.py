"""One chat answer and the task that writes it: its text so far, its listeners, its frames.

A turn's generation runs as its own task, not the socket's: a socket that closes only stops
listening. ``launch`` starts the task; the answer board (chat.board) keeps the running ones and
is told through ``on_stored`` once the answer is in the database (a page loaded from then on
shows it). Each local listener is a socket's own outbox queue, so a slow socket never holds the
engine's stream up; ``attach`` hands a listener the text so far, then the live frames, with
nothing lost or repeated in between (the snapshot and the subscription happen without an await,
on the event loop that runs the generation).

Every frame is numbered (``seq``) for the listeners on other web processes (chat.relay), which
count as listeners while they keep saying so: one silent for ``relay_ttl_s()`` has lapsed. The
shutdown drain sees each task through ``track`` and records it as it records API requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from channels.db import database_sync_to_async
from django.conf import settings

from webapp.chat.selectors import Tree
from webapp.chat.services import Turn, turn_finish
from webapp.config.shutdown import track
from webapp.usage.checkpoints import get_checkpoints
from webapp.usage.outcome import Outcome
from workers.connect import get_engine_client
from workers.protocol import NO_WORKER

logger = logging.getLogger(__name__)
DEFAULT_RELAY_TTL_S = 10.0


def relay_ttl_s() -> float:
    """PAGODA_CHAT_RELAY_TTL_S: how long an answer's entry in Redis lives without being renewed,
    and how long a listener on another web process counts without saying so."""
    return float(getattr(settings, "PAGODA_CHAT_RELAY_TTL_S", DEFAULT_RELAY_TTL_S))


@dataclass
class Generation:
    turn: Turn
    start_frame: dict  # what a listener is told first: the conversation, its path, the model
    text: str = ""  # the answer so far
    listeners: set = field(default_factory=set)  # asyncio.Queue, one per socket
    task: asyncio.Task | None = None
    unheard_since: float | None = None  # time.monotonic() the last listener left
    seq: int = 0  # frames broadcast so far (the start frame is not one)
    remote: dict = field(default_factory=dict)  # relay channel of a socket elsewhere -> monotonic() last heard
    published: asyncio.Queue | None = None  # (seq, frame) for the other processes; distributed mode only
    owner: str | None = None  # this process's relay channel, once registered
    ended: bool = False  # its last frame ("done" or "error") is broadcast: the answer is stored

    @property
    def user_id(self) -> int:
        return self.turn.user.pk

    @property
    def conversation_id(self) -> int:
        return self.turn.conversation.pk

    @property
    def heard(self) -> bool:
        now, lapse = time.monotonic(), relay_ttl_s()
        return bool(self.listeners) or any(now - heard_at < lapse for heard_at in self.remote.values())

    def broadcast(self, frame: dict) -> None:
        self.seq += 1
        self.ended = self.ended or frame["type"] in ("done", "error")
        for outbox in list(self.listeners):
            outbox.put_nowait(frame)
        if self.published is not None and self.remote:  # none follows it elsewhere: nothing to publish
            self.published.put_nowait((self.seq, frame))

    def attach(self, outbox: asyncio.Queue) -> None:
        """The text so far as one "resume" frame, then every frame after it."""
        outbox.put_nowait({**self.start_frame, "type": "resume", "text": self.text})
        self.listeners.add(outbox)
        self.unheard_since = None

    def detach(self, outbox: asyncio.Queue) -> None:
        if outbox in self.listeners:
            self.listeners.discard(outbox)
            if not self.heard:
                self.unheard_since = time.monotonic()

    def hear_remote(self, channel: str) -> None:
        """A socket on another process follows the answer (it says so every third of the TTL)."""
        self.remote[channel] = time.monotonic()
        self.unheard_since = None

    def unhear_remote(self, channel: str) -> None:
        self.remote.pop(channel, None)
        if not self.heard:
            self.unheard_since = time.monotonic()

    def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()


def launch(generation: Generation, *, on_stored: Callable[[Generation], None]) -> None:
    """Run the generation in its own task; ``on_stored(generation)`` once its answer is stored."""
    generation.task = asyncio.create_task(_run(generation, on_stored))
    generation.task.add_done_callback(lambda task: _cancelled_before_running(generation, task, on_stored))
    # Tracked: a server shutting down waits for the answer (or records it as aborted).
    track(generation.turn.request_id, generation.task, until_done=True)


def _cancelled_before_running(generation: Generation, task: asyncio.Task,
                              on_stored: Callable[[Generation], None]) -> None:
    """A task cancelled before its first step never ran _run: record its turn as aborted here."""
    if generation.turn.is_finished:
        return
    on_stored(generation)
    finishing = asyncio.ensure_future(database_sync_to_async(turn_finish)(turn=generation.turn, outcome=Outcome(),
                                                                           aborted=True))
    track(generation.turn.request_id + ":finish", finishing, until_done=True)
    generation.broadcast({"type": "done", "conversation": {"id": generation.conversation_id},
                          "finish_reason": "abort", "message": None, "usage": None})


def _error_text(code: str, message: str, model: str) -> str:
    if code == NO_WORKER:
        return f"No worker is serving the model {model!r} right now. Start one, or pick another model."
    return message


async def _run(generation: Generation, on_stored: Callable[[Generation], None]) -> None:
    turn = generation.turn
    outcome = Outcome()
    first_at = None
    first_tokens = 0
    aborted = False
    get_checkpoints().watch(turn.request_id, outcome, turn.started)
    try:
        chunks = get_engine_client(settings.REDIS_URL).generate(turn.engine_request())
        async with aclosing(chunks):
            async for chunk in chunks:
                outcome.add(chunk)
                if chunk.error is not None:
                    break
                if first_at is None and chunk.token_ids:
                    first_at, first_tokens = time.monotonic(), len(chunk.token_ids)
                if chunk.text:
                    generation.text += chunk.text
                    generation.broadcast({"type": "delta", "text": chunk.text})
    except asyncio.CancelledError:
        aborted = True  # Stop, the cap or the shutdown drain: aclosing has aborted the request
    except Exception:
        logger.exception("chat generation %s failed", turn.request_id)
    ended = time.monotonic()
    try:
        # Shielded: a second cancel (stop, then the drain) must not lose the saved answer.
        message = await asyncio.shield(database_sync_to_async(_finish)(turn, outcome, aborted))
    finally:
        get_checkpoints().unwatch(turn.request_id)
        on_stored(generation)  # stored: a page loaded from now on shows it
    generation.broadcast(_last_frame(turn, outcome, message, aborted, first_at, first_tokens, ended))


def _finish(turn: Turn, outcome: Outcome, aborted: bool) -> dict | None:
    """Store the answer; the page's view of it, with its siblings (the earlier answers to the question)."""
    message = turn_finish(turn=turn, outcome=outcome, aborted=aborted)
    return Tree(turn.conversation).to_dict(message) if message is not None else None


def _last_frame(turn: Turn, outcome: Outcome, message, aborted: bool, first_at, first_tokens: int,
                ended: float) -> dict:
    if outcome.error is not None:
        return {"type": "error", "code": outcome.error.code,
                "message": _error_text(outcome.error.code, outcome.error.message, turn.model.slug)}
    if not aborted and not outcome.finished:
        return {"type": "error", "code": "internal_error", "message": "The server had an error while writing the answer."}
    decode_tokens = outcome.num_output_tokens - first_tokens
    tokens_per_s = decode_tokens / (ended - first_at) if first_at and decode_tokens > 0 and ended > first_at else None
    prompt_tokens = outcome.num_prompt_tokens or 0
    return {
        "type": "done", "conversation": {"id": turn.conversation.pk},
        "finish_reason": "abort" if aborted else outcome.finish_reason,
        "message": message,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": outcome.num_output_tokens,
                  "cached_prompt_tokens": outcome.num_cached_tokens},
        "tokens_per_s": tokens_per_s, "time_to_first_token": outcome.time_to_first_token,
        "prefix_cache_hit": outcome.num_cached_tokens / prompt_tokens if prompt_tokens else 0.0}
