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

This module holds the names every side agrees on and the web side's client; the worker side is
workers/redis_worker_transport.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from dataclasses import dataclass

import redis
import redis.asyncio

from workers.protocol import (WATCH_INTERVAL_S, GenerateRequest, ProtocolError, Reply, UsageReport,
                              WorkerInfo)
from workers.transport import EngineClient, is_serving

logger = logging.getLogger(__name__)

GROUP = "engine-workers"
WORKERS_SET = "pagoda:workers"
REPLY_TTL_S = 60
CONNECT_TIMEOUT_S = 2.0
# Above the longest BLOCK any caller uses (a client's WATCH_INTERVAL_S, a worker's IDLE_POLL_S).
READ_TIMEOUT_S = 5.0
assert WATCH_INTERVAL_S < READ_TIMEOUT_S
REDIS_OPTIONS = dict(decode_responses=True, socket_connect_timeout=CONNECT_TIMEOUT_S,
                     socket_timeout=READ_TIMEOUT_S, health_check_interval=30)
# Transient: the server is down, restarting or too slow; anything else is a bug and raises.
OUTAGE_ERRORS = (redis.ConnectionError, redis.TimeoutError)

# KEYS[1] the model's stream; ARGV: bound, the entry's JSON, the model's arrival channel. The new
# entry id, or false if full. The publish tells a worker in the middle of a step that there is
# something to read, without a round trip of its own (RedisWorkerTransport.arrived).
_SUBMIT = """
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return false end
local id = redis.call('XADD', KEYS[1], '*', 'data', ARGV[2])
redis.call('PUBLISH', ARGV[3], '1')
return id
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


def arrival_channel(model: str) -> str:
    return f"pagoda:arrival:{model}"


def reply_stream(request_id: str) -> str:
    return f"pagoda:reply:{request_id}"


def usage_key(request_id: str) -> str:
    return f"pagoda:usage:{request_id}"


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
            keys=[request_stream(req.model)],
            args=[max_queued, json.dumps(req.to_dict()), arrival_channel(req.model)])
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
