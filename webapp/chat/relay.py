"""The answer board of distributed mode (REDIS_URL set, channels_redis): this process's answers,
as in embedded mode, plus those the other web processes run, heard through Redis.

The process that runs an answer (its owner) makes it known in Redis and publishes its frames; a
socket of the same user on any other process follows it (chat.follow).

- The registry: ``pagoda:chat:answer:<conversation>`` holds {request_id, user, owner, start_frame}
  (``owner``: the owning process's relay channel) and the user's sorted set
  ``pagoda:chat:answers:<user>`` scores each running conversation with the time its entry lapses.
  Both live ``relay_ttl_s()`` seconds and the owner renews them every third of it: a dead owner's
  answers leave the registry by themselves, which is how a follower elsewhere learns it died.
- The frames: every frame the owner broadcasts gets a number (``Generation.seq``) and, once a
  follower has attached (an answer nobody follows elsewhere costs Redis nothing), goes in order
  and in batches to the channel-layer group ``group_name(request_id)`` as "chat.frames".
- The relay channel: one per process, for followers' requests: "chat.attach" (answered with
  "chat.resume": the text so far and the number of the last frame in it, taken without an await
  so that it splits the numbered frames exactly; or "chat.gone" when the answer has ended),
  "chat.hear" (a follower still listens: it says so every ``relay_ttl_s() / 3``; one silent for
  ``relay_ttl_s()`` no longer counts as a listener, and the cap on unheard answers applies again),
  "chat.detach" (a follower's socket went away) and "chat.stop" (Stop pressed on another process).
  Its tasks start with the first answer this process runs on an event loop.

A Redis error here is logged and costs only the other processes' view: the answer and its own
process's listeners go on as in embedded mode.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref

import redis
import redis.asyncio
from channels.layers import get_channel_layer

from webapp.chat.board import LocalAnswerBoard, Socket
from webapp.chat.follow import Follower
from webapp.chat.generations import Generation, relay_ttl_s
from webapp.chat.services import Turn

logger = logging.getLogger(__name__)
REDIS_OPTIONS = dict(decode_responses=True, socket_connect_timeout=2.0, socket_timeout=5.0)


def answer_key(conversation_id: int) -> str:
    return f"pagoda:chat:answer:{conversation_id}"


def user_key(user_id: int) -> str:
    return f"pagoda:chat:answers:{user_id}"


class RedisAnswerBoard(LocalAnswerBoard):
    def __init__(self, url: str):
        super().__init__()
        self.url = url
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> redis.asyncio
        self._sync: redis.Redis | None = None
        self._published: dict[int, Generation] = {}  # conversation id -> an answer this process makes known
        self._relay: dict = {}  # event loop -> (this process's relay channel name, its tasks)

    @staticmethod
    def group_name(request_id: str) -> str:
        return f"chat-answer.{request_id}"

    def aredis(self) -> redis.asyncio.Redis:
        """redis.asyncio connections belong to the loop that made them: one client per loop."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = redis.asyncio.Redis.from_url(self.url, **REDIS_OPTIONS)
        return client

    # -------------------------------------------------------------- the board, across processes
    def running_ids(self, *, user) -> set[int]:
        return super().running_ids(user=user) | self._registered_ids(user_id=user.pk)

    def start(self, socket: Socket, *, turn: Turn, start_frame: dict) -> Generation:
        generation = super().start(socket, turn=turn, start_frame=start_frame)
        self._publish(generation)  # after launch's done callback: its abort frame is published too
        return generation

    async def leave(self, socket: Socket) -> None:
        await super().leave(socket)
        for follower in list(socket.followers.values()):
            await follower.close()

    async def relayed(self, socket: Socket, message: dict) -> None:
        follower = next((f for f in socket.followers.values() if f.request_id == message.get("request_id")), None)
        if follower is None:
            return
        kind = message.get("type")
        if kind == "chat.resume":
            follower.on_resume(message)
        elif kind == "chat.frames":
            follower.on_frames(message)
        elif kind == "chat.gone":
            await follower.on_gone()

    async def _runs_elsewhere(self, conversation_id, *, user) -> bool:
        return await self.entry(conversation_id, user_id=user.pk) is not None

    async def _follow(self, socket: Socket, conversation_id) -> bool:
        """Follow the conversation's answer if another process runs it; False if none does."""
        entry = await self.entry(conversation_id, user_id=socket.user.pk)
        if entry is None:
            return False
        conversation = int(conversation_id)
        follower = socket.followers.get(conversation)
        if follower is not None and not follower.ended and follower.request_id == entry["request_id"]:
            return True  # followed already
        if follower is not None:
            await follower.close()  # an earlier answer of the conversation: a newer one runs now

        def followed(ended: Follower) -> None:
            if socket.followers.get(ended.conversation_id) is ended:
                del socket.followers[ended.conversation_id]

        follower = Follower(board=self, entry=entry, conversation_id=conversation, user_id=socket.user.pk,
                            channel_name=socket.channel_name, emit=socket.emit, on_end=followed)
        socket.followers[conversation] = follower
        await follower.begin()
        return True

    async def _stop_elsewhere(self, socket: Socket, conversation_id) -> None:
        if conversation_id is None:
            for follower in list(socket.followers.values()):
                await follower.stop()
        elif (entry := await self.entry(conversation_id, user_id=socket.user.pk)) is not None:
            await self.send(entry["owner"], {"type": "chat.stop", "conversation": int(conversation_id),
                                             "request_id": entry["request_id"], "user": socket.user.pk})

    # -------------------------------------------------------------- the registry, read anywhere
    async def entry(self, conversation_id, *, user_id: int, strict: bool = False) -> dict | None:
        """The running answer of the conversation if the user's and registered (by any process), else
        None; an unreachable Redis is None too, unless ``strict`` (then it raises redis.RedisError)."""
        try:
            raw = await self.aredis().get(answer_key(int(conversation_id)))
        except (TypeError, ValueError):
            return None
        except redis.RedisError as exc:
            if strict:
                raise
            logger.warning("chat relay: the registry of running answers is unreachable: %s", exc)
            return None
        found = json.loads(raw) if raw else None
        return found if found is not None and found["user"] == user_id else None

    def _registered_ids(self, *, user_id: int) -> set[int]:
        """The user's conversations with an answer running in any process (a web request's thread)."""
        try:
            if self._sync is None:
                self._sync = redis.Redis.from_url(self.url, **REDIS_OPTIONS)
            return {int(c) for c in self._sync.zrangebyscore(user_key(user_id), time.time(), "+inf")}
        except redis.RedisError as exc:
            logger.warning("chat relay: the registry of running answers is unreachable: %s", exc)
            return set()

    @staticmethod
    async def send(channel: str, message: dict) -> bool:
        try:
            await get_channel_layer().send(channel, message)
            return True
        except Exception as exc:  # Redis down, or the channel full (its reader gone)
            logger.warning("chat relay: %s to %s not sent: %s", message.get("type"), channel, exc)
            return False

    # -------------------------------------------------------------- the owner's side
    def _publish(self, generation: Generation) -> None:
        """Make the answer known and publish its numbered frames until its task ends."""
        frames: asyncio.Queue = asyncio.Queue()
        generation.published = frames
        generation.task.add_done_callback(lambda _task: frames.put_nowait(None))
        asyncio.create_task(self._publishing(generation, frames))

    async def _publishing(self, generation: Generation, frames: asyncio.Queue) -> None:
        group = self.group_name(generation.turn.request_id)
        self._published[generation.conversation_id] = generation
        try:
            await self._register(generation, await self._relay_channel())
            ended = False
            while not ended:
                batch = [await frames.get()]
                while not frames.empty():
                    batch.append(frames.get_nowait())
                ended = batch[-1] is None
                numbered = [item for item in batch if item is not None]
                if numbered:
                    await _group_send(group, {"type": "chat.frames", "request_id": generation.turn.request_id,
                                              "first": numbered[0][0], "frames": [frame for _seq, frame in numbered]})
        except Exception:
            logger.exception("chat relay: publishing answer %s failed", generation.turn.request_id)
        finally:
            if self._published.get(generation.conversation_id) is generation:
                del self._published[generation.conversation_id]
            await self._unregister(generation)

    async def _register(self, generation: Generation, owner: str) -> None:
        generation.owner = owner
        try:
            await self._renew(generation)
        except redis.RedisError as exc:
            logger.warning("chat relay: answer %s not registered: %s", generation.turn.request_id, exc)

    async def _renew(self, generation: Generation) -> None:
        ttl = relay_ttl_s()
        value = json.dumps({"request_id": generation.turn.request_id, "user": generation.user_id,
                            "owner": generation.owner, "start_frame": generation.start_frame})
        async with self.aredis().pipeline(transaction=True) as pipe:
            pipe.set(answer_key(generation.conversation_id), value, px=int(ttl * 1000))
            pipe.zadd(user_key(generation.user_id), {str(generation.conversation_id): time.time() + ttl})
            pipe.zremrangebyscore(user_key(generation.user_id), "-inf", time.time())
            pipe.expire(user_key(generation.user_id), int(ttl) + 1)
            await pipe.execute()

    async def _unregister(self, generation: Generation) -> None:
        client = self.aredis()
        key = answer_key(generation.conversation_id)
        try:
            raw = await client.get(key)
            if raw and json.loads(raw)["request_id"] == generation.turn.request_id:
                await client.delete(key)
                await client.zrem(user_key(generation.user_id), str(generation.conversation_id))
        except redis.RedisError as exc:
            logger.warning("chat relay: answer %s not unregistered (it lapses by itself): %s",
                           generation.turn.request_id, exc)

    async def _relay_channel(self) -> str:
        """This process's relay channel, and the tasks that answer on it and renew the registry."""
        loop = asyncio.get_running_loop()
        if loop not in self._relay:
            layer = get_channel_layer()
            # channels_redis's default prefix: the process's channels share one receive loop, which
            # reads only the queue of the prefix its current holder asked for.
            name = await layer.new_channel()
            if loop not in self._relay:  # nobody made one while this await ran
                self._relay[loop] = (name, [asyncio.create_task(self._answering(layer, name)),
                                            asyncio.create_task(self._renewing())])
        return self._relay[loop][0]

    async def _renewing(self) -> None:
        while True:
            await asyncio.sleep(relay_ttl_s() / 3)
            try:
                for user_id in {g.user_id for g in self._published.values()}:
                    self.stop_over_cap(user_id)  # followers whose process died have lapsed
                for generation in list(self._published.values()):
                    if generation.owner is None or self._published.get(generation.conversation_id) is not generation:
                        continue  # not registered yet, or ended (and unregistered) during an earlier renewal
                    await self._renew(generation)
            except redis.RedisError as exc:
                logger.warning("chat relay: running answers not renewed: %s", exc)
            except Exception:  # this loop must outlive a bug: without it every answer here would lapse
                logger.exception("chat relay: renewing running answers failed")

    async def _answering(self, layer, name: str) -> None:
        while True:
            try:
                message = await layer.receive(name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("chat relay: reading %s failed: %s", name, exc)
                await asyncio.sleep(1.0)
                continue
            try:
                await self._handle(message)
            except Exception:
                logger.exception("chat relay: %s failed", message.get("type"))

    async def _handle(self, message: dict) -> None:
        generation = self._published.get(message.get("conversation"))
        if generation is None or generation.turn.request_id != message.get("request_id") \
                or generation.user_id != message.get("user"):
            generation = None
        kind, reply_to = message.get("type"), message.get("reply_to")
        if kind == "chat.attach" and reply_to:
            if generation is None or generation.ended:
                await self.send(reply_to, {"type": "chat.gone", "request_id": message.get("request_id")})
                return
            generation.hear_remote(reply_to)
            # Taken together, without an await: the text holds exactly the frames up to seq.
            resume = {**generation.start_frame, "type": "resume", "text": generation.text}
            await self.send(reply_to, {"type": "chat.resume", "request_id": generation.turn.request_id,
                                       "seq": generation.seq, "frame": resume})
        elif kind == "chat.hear" and generation is not None and reply_to:
            generation.hear_remote(reply_to)
        elif kind == "chat.detach" and generation is not None and reply_to:
            generation.unhear_remote(reply_to)
            self.stop_over_cap(generation.user_id)
        elif kind == "chat.stop" and generation is not None:
            logger.info("chat answer %s stopped from another web process", generation.turn.request_id)
            generation.stop()


async def _group_send(group: str, message: dict) -> None:
    try:
        await get_channel_layer().group_send(group, message)
    except Exception as exc:
        logger.warning("chat relay: frames of %s not published: %s", group, exc)
