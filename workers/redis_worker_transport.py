"""Distributed mode's worker side: one model's request stream read through the consumer group,
replies and usage reports written in the same round trip, aborts heard on the model's channel,
heartbeats. The design, and the names both sides use, are in workers/redis_transport.py."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time

import redis

from workers.protocol import (HEARTBEAT_TTL_S, INVALID_PARAMETER, USAGE_REPORT_TTL_S, Chunk, ErrorInfo,
                              GenerateRequest, ProtocolError, Reply, UsageReport, WorkerInfo)
from workers.redis_transport import (GROUP, OUTAGE_ERRORS, READ_TIMEOUT_S, REDIS_OPTIONS, REPLY_TTL_S,
                                     WORKERS_SET, abort_channel, arrival_channel, reply_stream, request_stream, usage_key,
                                     worker_key)
from workers.transport import TransportUnreachable

logger = logging.getLogger(__name__)

DEAD_CONSUMER_IDLE_MS = 30_000


def _usage_updates(replies: list[tuple[str, Reply]], worker_id: str, model: str,
                   now: float) -> dict[str, dict]:
    """The usage report fields the chunks among ``replies`` change, per request (JSON values)."""
    updates: dict[str, dict] = {}
    for _reply_to, reply in replies:
        chunk = reply.chunk
        if chunk is not None and chunk.request_id:
            fields = updates.setdefault(chunk.request_id, {"request_id": chunk.request_id, "worker_id": worker_id,
                                                           "model": model})
            fields.update(UsageReport.fields_of(chunk, now))
    return {request_id: {name: json.dumps(value) for name, value in fields.items()}
            for request_id, fields in updates.items()}


def _outage_is_unreachable(method):
    """Redis down (refused, reset, timed out) leaves the method as TransportUnreachable."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except OUTAGE_ERRORS as exc:
            raise TransportUnreachable(f"Redis: {exc}") from exc
    return wrapper


class RedisWorkerTransport:
    """The worker side for one model and one worker id (see transport.WorkerTransport)."""

    def __init__(self, url: str, model: str, worker_id: str):
        self.model = model
        self.worker_id = worker_id
        self.stream = request_stream(model)
        self.key = worker_key(model, worker_id)
        self.r = redis.Redis.from_url(url, **REDIS_OPTIONS)
        self._to_ack: list[str] = []  # entries read, acknowledged with the claims they caused
        self._rejects: list[tuple[str, Reply]] = []  # errors for malformed entries, sent next
        self._pubsub = None
        self._aborts: list[str] = []  # heard while looking for arrivals, for poll_aborts
        self._arrived = False  # a request was published since the last read of the stream
        self.reconnect()

    @_outage_is_unreachable
    def reconnect(self) -> None:
        self._create_group()
        self._reap_dead_consumers()
        # Subscribed before the (next) announcement, so no abort for a claimed request is missed.
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                self._pubsub.close()
        self._pubsub = self.r.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(abort_channel(self.model), arrival_channel(self.model))
        self._arrived = True  # whatever was published while it was down

    def _create_group(self) -> None:
        try:
            self.r.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _reap_dead_consumers(self) -> None:
        """Forget consumers of SIGKILLed workers, and the entries they read but never
        acknowledged (their clients were told worker_lost): those would count as queued."""
        for consumer in self.r.xinfo_consumers(self.stream, GROUP):
            name = consumer["name"]
            if consumer["idle"] > DEAD_CONSUMER_IDLE_MS and not self.r.exists(
                    worker_key(self.model, name)):
                pending = self.r.xpending_range(self.stream, GROUP, min="-", max="+",
                                                count=10_000, consumername=name)
                if pending:
                    self.r.xdel(self.stream, *[p["message_id"] for p in pending])
                self.r.xgroup_delconsumer(self.stream, GROUP, name)

    @_outage_is_unreachable
    def heartbeat(self, info: WorkerInfo) -> None:
        with self.r.pipeline(transaction=False) as pipe:
            pipe.set(self.key, json.dumps(info.to_dict()), px=int(HEARTBEAT_TTL_S * 1000))
            pipe.sadd(WORKERS_SET, self.key)
            pipe.execute()

    @_outage_is_unreachable
    def unregister(self) -> None:
        with self.r.pipeline(transaction=False) as pipe:
            pipe.delete(self.key)
            pipe.srem(WORKERS_SET, self.key)
            pipe.xgroup_delconsumer(self.stream, GROUP, self.worker_id)
            pipe.execute()

    @_outage_is_unreachable
    def exchange(self, replies: list[tuple[str, Reply]], max_count: int,
                 timeout_s: float) -> list[GenerateRequest]:
        """Write ``replies`` (acknowledging the entries they answer), then read up to
        ``max_count`` new requests. Without waiting it is one round trip; with ``timeout_s`` > 0
        (an idle engine) the read blocks up to that long for the first request. On an outage
        nothing is lost here: the caller sends ``replies`` again, and the acks stay due."""
        replies = self._rejects + list(replies)
        read_now = max_count > 0 and timeout_s <= 0
        if max_count > 0:
            self._arrived = False  # read below; a later publish sets it again
        to_ack = self._to_ack
        with self.r.pipeline(transaction=False) as pipe:
            for reply_to, reply in replies:
                pipe.xadd(reply_to, {"data": json.dumps(reply.to_dict())})
            for reply_to in {reply_to for reply_to, _ in replies}:
                pipe.expire(reply_to, REPLY_TTL_S)
            for request_id, fields in _usage_updates(replies, self.worker_id, self.model, time.time()).items():
                pipe.hset(usage_key(request_id), mapping=fields)
                pipe.expire(usage_key(request_id), USAGE_REPORT_TTL_S)
            if to_ack:
                pipe.xack(self.stream, GROUP, *to_ack)
                pipe.xdel(self.stream, *to_ack)
            if read_now:
                pipe.xreadgroup(GROUP, self.worker_id, {self.stream: ">"}, count=max_count)
            results = pipe.execute(raise_on_error=False) if len(pipe) else []
        self._rejects, self._to_ack = [], self._to_ack[len(to_ack):]
        read = results.pop() if read_now else None
        for result in results:
            if isinstance(result, Exception):
                logger.error("a reply could not be written: %s", result)
        if read_now:
            return self._read(read)
        if max_count <= 0:
            return []
        try:
            # BLOCK 0 would mean forever; and it stays below the read timeout.
            result = self.r.xreadgroup(GROUP, self.worker_id, {self.stream: ">"}, count=max_count,
                                       block=max(1, int(min(timeout_s, READ_TIMEOUT_S / 2) * 1000)))
        except redis.ResponseError as exc:
            result = exc
        except OUTAGE_ERRORS:  # the replies are out already: not an error to send them again for
            logger.warning("worker %s: Redis went away during a read", self.worker_id)
            return []
        return self._read(result)

    def _read(self, result) -> list[GenerateRequest]:
        # NOGROUP: the stream was deleted between reads; UNBLOCKED: while this read waited.
        lost_stream = str(result).startswith(("NOGROUP", "UNBLOCKED"))
        if isinstance(result, redis.ResponseError) and lost_stream:
            logger.warning("the request stream of %s vanished (Redis restarted?): recreating it",
                           self.model)
            self._create_group()
            return []
        if isinstance(result, Exception):
            raise result
        requests = []
        for _stream, entries in result or []:
            for entry_id, fields in entries:
                self._to_ack.append(entry_id)
                req = self._parse(fields)
                if req is not None:
                    requests.append(req)
        return requests

    def _parse(self, fields: dict) -> GenerateRequest | None:
        try:
            data = json.loads(fields.get("data", ""))
        except ValueError:
            logger.warning("dropping a request that is not JSON: %r", fields)
            return None
        try:
            req = GenerateRequest.from_dict(data)
            if not req.reply_to.startswith(reply_stream("")):
                raise ProtocolError(f"reply_to must start with {reply_stream('')!r}")
            return req
        except ProtocolError as exc:
            logger.warning("dropping a malformed request: %s", exc)
            reply_to = data.get("reply_to") if isinstance(data, dict) else None
            if isinstance(reply_to, str) and reply_to.startswith(reply_stream("")):
                error = ErrorInfo(INVALID_PARAMETER, f"malformed request: {exc}")
                chunk = Chunk.failure(str(data.get("request_id", "")), error)
                self._rejects.append((reply_to, Reply("chunk", self.worker_id, chunk)))
            return None

    @_outage_is_unreachable
    def requeue(self, requests: list[GenerateRequest]) -> None:
        """Back on the model's stream (at its tail: a stream keeps arrival order)."""
        if not requests:
            return
        with self.r.pipeline(transaction=False) as pipe:
            for req in requests:
                pipe.xadd(self.stream, {"data": json.dumps(req.to_dict())})
            pipe.execute()

    @_outage_is_unreachable
    def poll_aborts(self) -> list[str]:
        self._listen()
        aborted, self._aborts = self._aborts, []
        return aborted

    @_outage_is_unreachable
    def arrived(self) -> bool:
        """Whether a request was published since the stream was last read: the messages the
        subscription already received, read off its socket (no round trip)."""
        self._listen()
        return self._arrived

    def _listen(self) -> None:
        arrivals = arrival_channel(self.model)
        while (message := self._pubsub.get_message(timeout=0.0)) is not None:
            if message.get("type") != "message":
                continue
            if message.get("channel") == arrivals:
                self._arrived = True
            else:
                self._aborts.append(message["data"])

    def close(self) -> None:
        try:
            self._pubsub.close()
        finally:
            self.r.close()
