"""Distributed mode's transport: Redis streams, chosen over the Channels layer on purpose.

- Requests: one stream per model, read by the model's workers through one consumer group.
  A consumer group is a work queue (each entry goes to exactly one worker), which a Channels
  group (a broadcast) is not; and a worker reads only as many entries as it has free slots, so
  idle workers pick up what busy ones leave. XREADGROUP BLOCK lets an idle worker wait without
  spinning, and XPENDING tells a waiting client which worker took its request.
- Replies: one stream per request, with a TTL refreshed on every write, so replies written
  after the client left (an abort's last chunk) expire on their own. A stream has no capacity
  limit to hit (Channels' per-channel capacity drops messages) and keeps order.
- Aborts: a pub/sub channel per model; every worker of the model hears them and whichever
  holds the request aborts it.
- Usage reports: a hash per request (``pagoda:usage:<request_id>``, protocol.UsageReport) that the
  worker updates with every chunk it sends, in the same round trip, and that lives
  USAGE_REPORT_TTL_S after the last: the web side bills from it a request whose web process died.
- Heartbeats: a key per worker holding its WorkerInfo as JSON, with a TTL; the key's existence
  is liveness, so no clocks are compared across hosts. A set lists the keys for enumeration.
- Admission: a request is queued only while fewer than the bound of its model's entries are in
  the stream (XLEN and XADD in one script, so web processes cannot overshoot together); entries
  leave the stream once a worker acknowledges them, so XLEN counts what waits. Nothing is ever
  trimmed: a full queue refuses, it does not drop the oldest.
- Faults: every client has connect and read timeouts (a blocking read's BLOCK stays below the
  read timeout), so an outage fails fast; a worker rides it out (workers/engine_worker.py) and
  reconnect() re-creates what a restarted server lost (the group, the subscription).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import weakref
from dataclasses import dataclass

import redis
import redis.asyncio

from workers.protocol import (HEARTBEAT_TTL_S, INVALID_PARAMETER, USAGE_REPORT_TTL_S, WATCH_INTERVAL_S,
                              Chunk, ErrorInfo, GenerateRequest, ProtocolError, Reply, UsageReport,
                              WorkerInfo)
from workers.transport import EngineClient, TransportUnreachable, is_serving

logger = logging.getLogger(__name__)

GROUP = "engine-workers"
WORKERS_SET = "pagoda:workers"
REPLY_TTL_S = 60
DEAD_CONSUMER_IDLE_MS = 30_000
CONNECT_TIMEOUT_S = 2.0
# Above the longest BLOCK any caller uses (a client's WATCH_INTERVAL_S, a worker's IDLE_POLL_S).
READ_TIMEOUT_S = 5.0
assert WATCH_INTERVAL_S < READ_TIMEOUT_S
REDIS_OPTIONS = dict(decode_responses=True, socket_connect_timeout=CONNECT_TIMEOUT_S,
                     socket_timeout=READ_TIMEOUT_S, health_check_interval=30)
# Transient: the server is down, restarting or too slow; anything else is a bug and raises.
OUTAGE_ERRORS = (redis.ConnectionError, redis.TimeoutError)

# KEYS[1] the model's stream; ARGV: bound, the entry's JSON. The new entry id, or false if full.
_SUBMIT = """
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return false end
return redis.call('XADD', KEYS[1], '*', 'data', ARGV[2])
"""
# KEYS[1] the stream; ARGV: group, entry id. 1 when withdrawn, 0 when a worker has read it.
_WITHDRAW = """
local ok, pending = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if ok and #pending > 0 then return 0 end
return redis.call('XDEL', KEYS[1], ARGV[2])
"""


def request_stream(model: str) -> str:
    return f"pagoda:requests:{model}"


def worker_key(model: str, worker_id: str) -> str:
    return f"pagoda:worker:{model}:{worker_id}"


def abort_channel(model: str) -> str:
    return f"pagoda:abort:{model}"


def reply_stream(request_id: str) -> str:
    return f"pagoda:reply:{request_id}"


def usage_key(request_id: str) -> str:
    return f"pagoda:usage:{request_id}"


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


def _parse_report(fields: dict) -> UsageReport | None:
    try:
        return UsageReport.from_dict({name: json.loads(value) for name, value in fields.items()})
    except (ValueError, ProtocolError):
        logger.warning("ignoring a malformed usage report: %r", fields)
        return None


def _parse_workers(values) -> list[WorkerInfo]:
    infos = []
    for raw in values:
        if raw is None:
            continue
        try:
            infos.append(WorkerInfo.from_dict(json.loads(raw)))
        except (ValueError, ProtocolError):
            logger.warning("ignoring a malformed worker record: %r", raw[:200])
    return infos


@dataclass
class _Ticket:
    entry_id: str  # the request's entry in the model's stream
    last_id: str = "0-0"  # last reply read


class RedisEngineClient(EngineClient):
    transport_errors = (redis.RedisError,)
    transient_errors = (redis.TimeoutError,)

    def __init__(self, url: str):
        self.url = url
        self._sync = redis.Redis.from_url(url, **REDIS_OPTIONS)
        # redis.asyncio connections belong to the loop that made them: one client per loop.
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _redis(self) -> redis.asyncio.Redis:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = redis.asyncio.Redis.from_url(self.url, **REDIS_OPTIONS)
            client.submit_script = client.register_script(_SUBMIT)
            client.withdraw_script = client.register_script(_WITHDRAW)
            self._clients[loop] = client
        return client

    async def abort(self, model: str, request_id: str) -> None:
        await self._redis().publish(abort_channel(model), request_id)

    def abort_now(self, model: str, request_ids: list[str]) -> None:
        with self._sync.pipeline(transaction=False) as pipe:
            for request_id in request_ids:
                pipe.publish(abort_channel(model), request_id)
            pipe.execute()

    def usage_reports(self, request_ids: list[str]) -> dict[str, UsageReport]:
        with self._sync.pipeline(transaction=False) as pipe:
            for request_id in request_ids:
                pipe.hgetall(usage_key(request_id))
            found = pipe.execute()
        reports = (_parse_report(fields) for fields in found if fields)
        return {report.request_id: report for report in reports if report is not None}

    def live_workers(self, model: str | None = None) -> list[WorkerInfo]:
        keys = sorted(self._sync.smembers(WORKERS_SET))
        if model is not None:
            keys = [k for k in keys if k.startswith(worker_key(model, ""))]
        if not keys:
            return []
        values = self._sync.mget(keys)
        expired = [k for k, v in zip(keys, values) if v is None]
        if expired:
            self._sync.srem(WORKERS_SET, *expired)
        infos = [w for w in _parse_workers(values) if model in (None, w.model)]
        return sorted(infos, key=lambda w: (w.model, w.started_at))

    def _reply_address(self, request_id: str) -> str:
        return reply_stream(request_id)

    async def _submit(self, req: GenerateRequest, max_queued: int) -> _Ticket | None:
        entry_id = await self._redis().submit_script(
            keys=[request_stream(req.model)], args=[max_queued, json.dumps(req.to_dict())])
        return _Ticket(entry_id) if entry_id else None

    async def _withdraw(self, req: GenerateRequest, ticket: _Ticket) -> bool:
        return bool(await self._redis().withdraw_script(
            keys=[request_stream(req.model)], args=[GROUP, ticket.entry_id]))

    async def _next_replies(self, req: GenerateRequest, ticket: _Ticket,
                            timeout_s: float) -> list[Reply]:
        result = await self._redis().xread({req.reply_to: ticket.last_id},
                                           block=max(1, int(timeout_s * 1000)))
        replies = []
        for _stream, entries in result or []:
            for entry_id, fields in entries:
                ticket.last_id = entry_id
                replies.append(Reply.from_dict(json.loads(fields["data"])))
        return replies

    async def _serving_workers(self, model: str) -> list[WorkerInfo]:
        r = self._redis()
        keys = [k for k in await r.smembers(WORKERS_SET) if k.startswith(worker_key(model, ""))]
        if not keys:
            return []
        return [w for w in _parse_workers(await r.mget(keys)) if w.model == model and is_serving(w)]

    async def _is_alive(self, model: str, worker_id: str) -> bool:
        return bool(await self._redis().exists(worker_key(model, worker_id)))

    async def _claimant(self, req: GenerateRequest, ticket: _Ticket) -> str | None:
        try:
            pending = await self._redis().xpending_range(
                request_stream(req.model), GROUP, min=ticket.entry_id, max=ticket.entry_id, count=1)
        except redis.ResponseError:  # no group yet: nobody has read the stream
            return None
        return pending[0]["consumer"] if pending else None

    async def _close(self, req: GenerateRequest, ticket: _Ticket, finished: bool) -> None:
        async with self._redis().pipeline(transaction=False) as pipe:
            pipe.unlink(req.reply_to)
            if not finished:  # still queued: withdraw it (a worker that took it hears the abort)
                pipe.xdel(request_stream(req.model), ticket.entry_id)
            await pipe.execute()


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
        self._pubsub.subscribe(abort_channel(self.model))

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
        aborted = []
        while (message := self._pubsub.get_message(timeout=0.0)) is not None:
            if message.get("type") == "message":
                aborted.append(message["data"])
        return aborted

    def close(self) -> None:
        try:
            self._pubsub.close()
        finally:
            self.r.close()
