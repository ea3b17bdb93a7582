"""The answer board: which chat answers are running, their text so far, following them and
stopping them. Chat's sockets and pages talk to it and to nothing else about running answers.

``get_answer_board()`` (chat.boards) chooses the board once for the REDIS_URL setting, as
``get_limit_store`` chooses the limit store: a ``LocalAnswerBoard`` in embedded mode (one web process: every answer
runs here), a ``RedisAnswerBoard`` (chat.relay) in distributed mode, which adds the answers the
other web processes run. Either way the answers this process runs are held here, one per
conversation (chat.generations writes each).

What aborts an answer: Stop (``stop``), or the user's cap on answers nobody is listening to
(``PAGODA_CHAT_MAX_BACKGROUND_ANSWERS``, default 2): when a socket goes away (``leave``) and
leaves more than that many of the user's answers without a listener, the oldest of them stops.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from django.conf import settings

from webapp.chat import generations
from webapp.chat.generations import Generation
from webapp.chat.services import Turn

logger = logging.getLogger(__name__)
DEFAULT_MAX_BACKGROUND_ANSWERS = 2


def max_background_answers() -> int:
    return int(getattr(settings, "PAGODA_CHAT_MAX_BACKGROUND_ANSWERS", DEFAULT_MAX_BACKGROUND_ANSWERS))


@dataclass(eq=False)
class Socket:
    """A chat socket as the board sees it: whose it is, where its frames go (its outbox, in order),
    its channel-layer name, and the answers it follows on other web processes (chat.follow)."""

    user: object
    outbox: asyncio.Queue
    channel_name: str
    followers: dict = field(default_factory=dict)  # conversation id -> Follower

    def emit(self, frame: dict) -> None:
        self.outbox.put_nowait(frame)


class AnswerBoard(ABC):
    """What a chat socket or page may ask about running answers, whichever process runs them."""

    @abstractmethod
    def claim(self, conversation_id: int | None) -> bool:
        """Hold a conversation while its turn is prepared; False if another socket holds it."""

    @abstractmethod
    def unclaim(self, conversation_id: int | None) -> None: ...

    @abstractmethod
    def running_ids(self, *, user) -> set[int]:
        """The user's conversations with an answer running (for the page's sidebar; not async)."""

    @abstractmethod
    async def is_running(self, conversation_id, *, user) -> bool:
        """An answer is being written in the conversation: a new turn there is "busy"."""

    @abstractmethod
    def start(self, socket: Socket, *, turn: Turn, start_frame: dict) -> Generation:
        """Run the turn's answer, with ``socket`` listening from its start frame."""

    @abstractmethod
    async def attach(self, socket: Socket, conversation_id) -> bool:
        """The socket hears the conversation's running answer: the text so far as one "resume"
        frame, then every frame after it. False when none runs."""

    @abstractmethod
    async def stop(self, socket: Socket, conversation_id) -> None:
        """Stop the conversation's answer; without one, those the socket listens to."""

    @abstractmethod
    async def leave(self, socket: Socket) -> None:
        """The socket went away: it stops listening; the answers themselves keep running."""

    @abstractmethod
    async def relayed(self, socket: Socket, message: dict) -> None:
        """A channel-layer message for the socket about an answer it follows ("chat.resume",
        "chat.frames", "chat.gone")."""


class LocalAnswerBoard(AnswerBoard):
    """The answers this process runs, and nothing elsewhere: embedded mode's board."""

    def __init__(self):
        self.running: dict[int, Generation] = {}  # conversation id -> its running answer
        self.claimed: set[int] = set()  # conversations whose next turn is being prepared (two tabs at once)

    def claim(self, conversation_id: int | None) -> bool:
        if conversation_id is None:
            return True
        if conversation_id in self.claimed:
            return False
        self.claimed.add(conversation_id)
        return True

    def unclaim(self, conversation_id: int | None) -> None:
        self.claimed.discard(conversation_id)

    def running_ids(self, *, user) -> set[int]:
        return {g.conversation_id for g in self.running.values() if g.user_id == user.pk}

    async def is_running(self, conversation_id, *, user) -> bool:
        return self.running_here(conversation_id, user=user) is not None or (
            conversation_id is not None and await self._runs_elsewhere(conversation_id, user=user))

    def running_here(self, conversation_id, *, user) -> Generation | None:
        try:
            generation = self.running.get(int(conversation_id))
        except (TypeError, ValueError):
            return None
        return generation if generation is not None and generation.user_id == user.pk else None

    def start(self, socket: Socket, *, turn: Turn, start_frame: dict) -> Generation:
        generation = Generation(turn=turn, start_frame=start_frame)
        self.running[generation.conversation_id] = generation
        socket.emit(start_frame)
        generation.listeners.add(socket.outbox)
        generations.launch(generation, on_stored=self._forget)
        return generation

    async def attach(self, socket: Socket, conversation_id) -> bool:
        running = self.running_here(conversation_id, user=socket.user)
        if running is None:
            return await self._follow(socket, conversation_id)
        if socket.outbox not in running.listeners:
            running.attach(socket.outbox)
        return True

    async def stop(self, socket: Socket, conversation_id) -> None:
        running = self.running_here(conversation_id, user=socket.user) if conversation_id is not None else None
        stopping = [running] if running is not None else [g for g in self.running.values()
                                                          if socket.outbox in g.listeners]
        for generation in stopping:
            generation.stop()
        if running is None:
            await self._stop_elsewhere(socket, conversation_id)

    async def leave(self, socket: Socket) -> None:
        for generation in list(self.running.values()):
            generation.detach(socket.outbox)
        self.stop_over_cap(socket.user.pk)

    async def relayed(self, socket: Socket, message: dict) -> None:
        """Never called: in embedded mode no socket follows an answer elsewhere."""

    def stop_over_cap(self, user_id: int) -> None:
        """Past the user's cap of answers nobody listens to, the oldest of them stops."""
        unheard = sorted((g for g in self.running.values() if g.user_id == user_id and not g.heard),
                         key=lambda g: g.unheard_since or 0.0)
        for generation in unheard[:max(0, len(unheard) - max_background_answers())]:
            logger.info("chat answer %s stopped: over the cap of background answers", generation.turn.request_id)
            generation.stop()

    def _forget(self, generation: Generation) -> None:
        """The answer is stored (or never ran): it is no longer running here."""
        if self.running.get(generation.conversation_id) is generation:
            del self.running[generation.conversation_id]

    # What another web process runs: nothing, in embedded mode (RedisAnswerBoard says otherwise).
    async def _runs_elsewhere(self, conversation_id, *, user) -> bool:
        return False

    async def _follow(self, socket: Socket, conversation_id) -> bool:
        return False

    async def _stop_elsewhere(self, socket: Socket, conversation_id) -> None:
        return None
