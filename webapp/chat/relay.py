"""Chat answers heard from other web processes (distributed mode: REDIS_URL set, channels_redis).

The process that runs an answer (its owner, chat.generations) makes it known in Redis and
publishes its frames; a socket of the same user on any other process follows it (chat.follow).

- The registry: ``pagoda:chat:answer:<conversation>`` holds {request_id, user, owner, start_frame}
  (``owner``: the owning process's relay channel) and the user's sorted set
  ``pagoda:chat:answers:<user>`` scores each running conversation with the time its entry lapses.
  Both live ``ttl_s()`` seconds and the owner renews them every third of it: a dead owner's
  answers leave the registry by themselves, which is how a follower elsewhere learns it died.
- The frames: every frame the owner broadcasts gets a number (``Generation.seq``) and, once a
  follower has attached (an answer nobody follows elsewhere costs Redis nothing), goes in order
  and in batches to the channel-layer group ``group_name(request_id)`` as "chat.frames".
- The relay channel: one per process, for followers' requests: "chat.attach" (answered with
  "chat.resume": the text so far and the number of the last frame in it, taken without an await
  so that it splits the numbered frames exactly; or "chat.gone" when the answer has ended),
  "chat.hear" (a follower still listens: it says so every ``ttl_s() / 3``; one silent for
  ``ttl_s()`` no longer counts as a listener, and the cap on unheard answers applies again),
  "chat.detach" (a follower's socket went away) and "chat.stop" (Stop pressed on another process).

A Redis error here is logged and costs only the other processes' view: the answer and its own
process's listeners go on as in embedded mode, which never uses any of this.
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
from django.conf import settings

logger = logging.getLogger(__name__)
DEFAULT_TTL_S = 10.0
REDIS_OPTIONS = dict(decode_responses=True, socket_connect_timeout=2.0, socket_timeout=5.0)
_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> redis.asyncio client
_sync: dict = {}  # url -> redis.Redis
_published: dict = {}  # conversation id -> Generation, the answers this process makes known
_relay: dict = {}  # event loop -> (this process's relay channel name, its tasks)
# What the owner side does when another process asks (chat.generations sets it: ``serve``):
# hear_remote(generation, channel), unhear_remote(generation, channel), stop(generation),
# stop_over_cap(user_id).
_owner = None


def serve(owner) -> None:
    """The owner of this process's answers (a module or object with the four calls above);
    the relay calls back into it, so it never imports chat.generations."""
    global _owner
    _owner = owner


def enabled() -> bool:
    return bool(settings.REDIS_URL)


def ttl_s() -> float:
    return float(getattr(settings, "PAGODA_CHAT_RELAY_TTL_S", DEFAULT_TTL_S))


def answer_key(conversation_id: int) -> str:
    return f"pagoda:chat:answer:{conversation_id}"


def user_key(user_id: int) -> str:
    return f"pagoda:chat:answers:{user_id}"


def group_name(request_id: str) -> str:
    return f"chat-answer.{request_id}"


def aredis() -> redis.asyncio.Redis:
    """redis.asyncio connections belong to the loop that made them: one client per loop."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = redis.asyncio.Redis.from_url(settings.REDIS_URL, **REDIS_OPTIONS)
    return client


# ------------------------------------------------------------------ the registry, read anywhere
async def entry(conversation_id, *, user_id: int, strict: bool = False) -> dict | None:
    """The running answer of the conversation if the user's and registered (by any process), else
    None; an unreachable Redis is None too, unless ``strict`` (then it raises redis.RedisError)."""
    try:
        raw = await aredis().get(answer_key(int(conversation_id)))
    except (TypeError, ValueError):
        return None
    except redis.RedisError as exc:
        if strict:
            raise
        logger.warning("chat relay: the registry of running answers is unreachable: %s", exc)
        return None
    found = json.loads(raw) if raw else None
    return found if found is not None and found["user"] == user_id else None


def running_ids(*, user_id: int) -> set[int]:
    """The user's conversations with an answer running in any process (for the page's sidebar)."""
    try:
        client = _sync.get(settings.REDIS_URL)
        if client is None:
            client = _sync[settings.REDIS_URL] = redis.Redis.from_url(settings.REDIS_URL, **REDIS_OPTIONS)
        return {int(c) for c in client.zrangebyscore(user_key(user_id), time.time(), "+inf")}
    except redis.RedisError as exc:
        logger.warning("chat relay: the registry of running answers is unreachable: %s", exc)
        return set()


async def send(channel: str, message: dict) -> bool:
    try:
        await get_channel_layer().send(channel, message)
        return True
    except Exception as exc:  # Redis down, or the channel full (its reader gone)
        logger.warning("chat relay: %s to %s not sent: %s", message.get("type"), channel, exc)
        return False


# ------------------------------------------------------------------ the owner's side
def publish(generation) -> None:
    """Make the answer known and publish its numbered frames until its task ends."""
    frames: asyncio.Queue = asyncio.Queue()
    generation.published = frames
    generation.task.add_done_callback(lambda _task: frames.put_nowait(None))
    asyncio.create_task(_publish(generation, frames))


async def _publish(generation, frames: asyncio.Queue) -> None:
    group = group_name(generation.turn.request_id)
    _published[generation.conversation_id] = generation
    try:
        await _register(generation, await _relay_channel())
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
        if _published.get(generation.conversation_id) is generation:
            del _published[generation.conversation_id]
        await _unregister(generation)


async def _group_send(group: str, message: dict) -> None:
    try:
        await get_channel_layer().group_send(group, message)
    except Exception as exc:
        logger.warning("chat relay: frames of %s not published: %s", group, exc)


async def _register(generation, owner: str) -> None:
    generation.owner = owner
    try:
        await _renew(aredis(), generation)
    except redis.RedisError as exc:
        logger.warning("chat relay: answer %s not registered: %s", generation.turn.request_id, exc)


async def _renew(client, generation) -> None:
    ttl = ttl_s()
    value = json.dumps({"request_id": generation.turn.request_id, "user": generation.user_id,
                        "owner": generation.owner, "start_frame": generation.start_frame})
    async with client.pipeline(transaction=True) as pipe:
        pipe.set(answer_key(generation.conversation_id), value, px=int(ttl * 1000))
        pipe.zadd(user_key(generation.user_id), {str(generation.conversation_id): time.time() + ttl})
        pipe.zremrangebyscore(user_key(generation.user_id), "-inf", time.time())
        pipe.expire(user_key(generation.user_id), int(ttl) + 1)
        await pipe.execute()


async def _unregister(generation) -> None:
    client = aredis()
    key = answer_key(generation.conversation_id)
    try:
        raw = await client.get(key)
        if raw and json.loads(raw)["request_id"] == generation.turn.request_id:
            await client.delete(key)
            await client.zrem(user_key(generation.user_id), str(generation.conversation_id))
    except redis.RedisError as exc:
        logger.warning("chat relay: answer %s not unregistered (it lapses by itself): %s",
                       generation.turn.request_id, exc)


async def _relay_channel() -> str:
    """This process's relay channel, and the tasks that answer on it and renew the registry."""
    loop = asyncio.get_running_loop()
    if loop not in _relay:
        layer = get_channel_layer()
        # channels_redis's default prefix: the process's channels share one receive loop, which
        # reads only the queue of the prefix its current holder asked for.
        name = await layer.new_channel()
        if loop not in _relay:  # nobody made one while this await ran
            _relay[loop] = (name, [asyncio.create_task(_answer(layer, name)), asyncio.create_task(_renewing())])
    return _relay[loop][0]


async def _renewing() -> None:
    while True:
        await asyncio.sleep(ttl_s() / 3)
        try:
            for user_id in {g.user_id for g in _published.values()}:
                _owner.stop_over_cap(user_id)  # followers whose process died have lapsed
            for generation in list(_published.values()):
                if generation.owner is None or _published.get(generation.conversation_id) is not generation:
                    continue  # not registered yet, or ended (and unregistered) during an earlier renewal
                await _renew(aredis(), generation)
        except redis.RedisError as exc:
            logger.warning("chat relay: running answers not renewed: %s", exc)
        except Exception:  # this loop must outlive a bug: without it every answer here would lapse
            logger.exception("chat relay: renewing running answers failed")


async def _answer(layer, name: str) -> None:
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
            await _handle(message)
        except Exception:
            logger.exception("chat relay: %s failed", message.get("type"))


async def _handle(message: dict) -> None:
    generation = _published.get(message.get("conversation"))
    if generation is None or generation.turn.request_id != message.get("request_id") \
            or generation.user_id != message.get("user"):
        generation = None
    kind, reply_to = message.get("type"), message.get("reply_to")
    if kind == "chat.attach" and reply_to:
        if generation is None or generation.ended:
            await send(reply_to, {"type": "chat.gone", "request_id": message.get("request_id")})
            return
        _owner.hear_remote(generation, reply_to)
        # Taken together, without an await: the text holds exactly the frames up to seq.
        resume = {**generation.start_frame, "type": "resume", "text": generation.text}
        await send(reply_to, {"type": "chat.resume", "request_id": generation.turn.request_id,
                              "seq": generation.seq, "frame": resume})
    elif kind == "chat.hear" and generation is not None and reply_to:
        _owner.hear_remote(generation, reply_to)
    elif kind == "chat.detach" and generation is not None and reply_to:
        _owner.unhear_remote(generation, reply_to)
    elif kind == "chat.stop" and generation is not None:
        logger.info("chat answer %s stopped from another web process", generation.turn.request_id)
        _owner.stop(generation)
