"""Chat answers that outlive their socket: one running generation per conversation, in this process.

A turn's generation runs as its own task, not the socket's: a socket that closes only stops
listening. Every socket of the same user can listen to it (a reload, another tab, switching back
to the conversation): ``attach`` hands it the text so far, then the live frames, with nothing
lost or repeated in between (the snapshot and the subscription happen without an await, on the
event loop that runs the generation). Each listener is the socket's own outbox queue, so a slow
socket never holds the engine's stream up.

What aborts it: Stop (``stop``), or the user's cap on answers nobody is listening to
(``PAGODA_CHAT_MAX_BACKGROUND_ANSWERS``, default 2): when a socket goes away and leaves more
than that many of the user's answers without a listener, the oldest of them is stopped. The
shutdown drain sees each one through ``track`` and records it as it records API requests.

In distributed mode (REDIS_URL set) this registry still holds only this process's answers, and
chat.relay makes each of them known to the other web processes and publishes its frames
(numbered: ``seq``): a socket on another process follows it (chat.follow), Stop pressed there
stops it, and such a remote listener counts as a listener for the cap while it keeps saying so
(a follower whose process died lapses after ``relay.ttl_s()``). Embedded mode never uses the relay.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from contextlib import aclosing
from dataclasses import dataclass, field

from channels.db import database_sync_to_async
from django.conf import settings

from webapp.chat import relay
from webapp.chat.selectors import Tree
from webapp.chat.services import Turn, turn_finish
from webapp.config.shutdown import track
from webapp.usage.outcome import Outcome
from workers.connect import get_engine_client
from workers.protocol import NO_WORKER

logger = logging.getLogger(__name__)
DEFAULT_MAX_BACKGROUND_ANSWERS = 2


def max_background_answers() -> int:
    return int(getattr(settings, "PAGODA_CHAT_MAX_BACKGROUND_ANSWERS", DEFAULT_MAX_BACKGROUND_ANSWERS))


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
        now, lapse = time.monotonic(), relay.ttl_s()
        return bool(self.listeners) or any(now - heard_at < lapse for heard_at in self.remote.values())

    def broadcast(self, frame: dict) -> None:
        self.seq += 1
        self.ended = self.ended or frame["type"] in ("done", "error")
        for outbox in list(self.listeners):
            outbox.put_nowait(frame)
        if self.published is not None and self.remote:  # none follows it elsewhere: nothing to publish
            self.published.put_nowait((self.seq, frame))


_running: dict[int, Generation] = {}  # conversation id -> its running answer
_claimed: set[int] = set()  # conversations whose next turn is being prepared (two tabs sending at once)


def claim(conversation_id: int | None) -> bool:
    """Hold a conversation while its turn is prepared; False if another socket holds it."""
    if conversation_id is None:
        return True
    if conversation_id in _claimed:
        return False
    _claimed.add(conversation_id)
    return True


def unclaim(conversation_id: int | None) -> None:
    _claimed.discard(conversation_id)


def all_running() -> list[Generation]:
    return list(_running.values())


def running_for(*, user, conversation_id) -> Generation | None:
    try:
        generation = _running.get(int(conversation_id))
    except (TypeError, ValueError):
        return None
    return generation if generation is not None and generation.user_id == user.pk else None


def running_conversation_ids(*, user) -> set[int]:
    """The user's conversations with an answer running: here, or (distributed mode) in any process."""
    here = {g.conversation_id for g in _running.values() if g.user_id == user.pk}
    return here | relay.running_ids(user_id=user.pk) if relay.enabled() else here


def start(*, turn: Turn, start_frame: dict, outbox: asyncio.Queue) -> Generation:
    """Run the turn's generation in its own task, with ``outbox`` listening from its start frame."""
    generation = Generation(turn=turn, start_frame=start_frame)
    _running[generation.conversation_id] = generation
    outbox.put_nowait(start_frame)
    generation.listeners.add(outbox)
    generation.task = asyncio.create_task(_run(generation))
    generation.task.add_done_callback(lambda task: _cancelled_before_running(generation, task))
    # Tracked: a server shutting down waits for the answer (or records it as aborted).
    track(turn.request_id, generation.task, until_done=True)
    if relay.enabled():
        relay.publish(generation)  # after the callback above: its abort frame is published too
    return generation


def attach(generation: Generation, outbox: asyncio.Queue) -> None:
    """The text so far as one "resume" frame, then every frame after it."""
    outbox.put_nowait({**generation.start_frame, "type": "resume", "text": generation.text})
    generation.listeners.add(outbox)
    generation.unheard_since = None


def hear_remote(generation: Generation, channel: str) -> None:
    """A socket on another process follows the answer (chat.relay)."""
    generation.remote[channel] = time.monotonic()
    generation.unheard_since = None


def unhear_remote(generation: Generation, channel: str) -> None:
    generation.remote.pop(channel, None)
    if not generation.heard:
        generation.unheard_since = time.monotonic()
    stop_over_cap(generation.user_id)


def detach(outbox: asyncio.Queue, *, user) -> None:
    """A socket went away: it stops listening; past the user's cap, the oldest unheard answer stops."""
    for generation in list(_running.values()):
        if outbox in generation.listeners:
            generation.listeners.discard(outbox)
            if not generation.heard:
                generation.unheard_since = time.monotonic()
    stop_over_cap(user.pk)


def stop_over_cap(user_id: int) -> None:
    """Past the user's cap of answers nobody listens to, the oldest of them stops."""
    unheard = sorted((g for g in _running.values() if g.user_id == user_id and not g.heard),
                     key=lambda g: g.unheard_since or 0.0)
    for generation in unheard[:max(0, len(unheard) - max_background_answers())]:
        logger.info("chat answer %s stopped: over the cap of background answers", generation.turn.request_id)
        stop(generation)


def stop(generation: Generation) -> None:
    if generation.task is not None and not generation.task.done():
        generation.task.cancel()


def _cancelled_before_running(generation: Generation, task: asyncio.Task) -> None:
    """A task cancelled before its first step never ran _run: record its turn as aborted here."""
    if generation.turn.is_finished:
        return
    if _running.get(generation.conversation_id) is generation:
        del _running[generation.conversation_id]
    finishing = asyncio.ensure_future(database_sync_to_async(turn_finish)(turn=generation.turn, outcome=Outcome(),
                                                                           aborted=True))
    track(generation.turn.request_id + ":finish", finishing, until_done=True)
    generation.broadcast({"type": "done", "conversation": {"id": generation.conversation_id},
                          "finish_reason": "abort", "message": None, "usage": None})


def _error_text(code: str, message: str, model: str) -> str:
    if code == NO_WORKER:
        return f"No worker is serving the model {model!r} right now. Start one, or pick another model."
    return message


async def _run(generation: Generation) -> None:
    turn = generation.turn
    outcome = Outcome()
    first_at = None
    first_tokens = 0
    aborted = False
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
        if _running.get(generation.conversation_id) is generation:
            del _running[generation.conversation_id]  # stored: a page loaded from now on shows it
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


relay.serve(sys.modules[__name__])  # what another process asks of this one's answers
