"""The shutdown drain returns only once every HTTP exchange has handed its last message to the
server (webapp/config/shutdown.py's ``count_http_exchanges``): Daphne's own trigger, which runs
next, cancels the application instances, and a response still inside Django would be dropped;
and only once the reactor has written those responses' bytes (``_writes_flushed``), since the
reactor's shutdown drops every connection with what it had not sent."""

import asyncio
import sys

import pytest

from webapp.config import shutdown

SCOPE = {"type": "http", "method": "GET", "path": "/v1/models"}


def _app(release: asyncio.Event, sent: list):
    async def app(scope, receive, send):  # a view whose generation has ended, response on its way
        await release.wait()
        await send({"type": "http.response.start", "status": 503, "headers": []})
        sent.append("start")
        await send({"type": "http.response.body", "body": b"{}"})
        sent.append("body")
    return app


async def _receive():
    return {"type": "http.request", "body": b"", "more_body": False}


async def _send(message):
    await asyncio.sleep(0)


@pytest.fixture
def not_embedded(monkeypatch):
    monkeypatch.delitem(sys.modules, "workers.embedded", raising=False)  # no workers to stop here
    monkeypatch.setattr(shutdown, "_shutting_down", False)  # drain() sets it; restored after


@pytest.mark.asyncio
async def test_the_drain_waits_for_a_response_still_inside_the_application(not_embedded):
    release, sent = asyncio.Event(), []
    exchange = asyncio.ensure_future(shutdown.count_http_exchanges(_app(release, sent))(SCOPE, _receive, _send))
    await asyncio.sleep(0)
    assert shutdown._http_exchanges == 1

    draining = asyncio.ensure_future(shutdown.drain(0.0))
    await asyncio.sleep(0.3)
    assert not draining.done(), "the drain ended with a response not yet sent"
    release.set()
    await asyncio.wait_for(draining, 2.0)
    assert sent == ["start", "body"] and exchange.done()
    assert shutdown._http_exchanges == 0 and shutdown.shutting_down()


@pytest.mark.asyncio
async def test_an_exchange_that_fails_or_is_cancelled_stops_counting(not_embedded):
    async def failing(scope, receive, send):
        raise RuntimeError("view crashed")

    with pytest.raises(RuntimeError):
        await shutdown.count_http_exchanges(failing)(SCOPE, _receive, _send)
    assert shutdown._http_exchanges == 0

    hanging = asyncio.ensure_future(
        shutdown.count_http_exchanges(_app(asyncio.Event(), []))(SCOPE, _receive, _send))
    await asyncio.sleep(0)
    assert shutdown._http_exchanges == 1
    hanging.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hanging
    assert shutdown._http_exchanges == 0


@pytest.mark.asyncio
async def test_a_response_that_never_finishes_holds_the_drain_for_flush_limit_s_only(not_embedded, monkeypatch):
    monkeypatch.setattr(shutdown, "FLUSH_LIMIT_S", 0.2)
    stuck = asyncio.ensure_future(
        shutdown.count_http_exchanges(_app(asyncio.Event(), []))(SCOPE, _receive, _send))
    await asyncio.sleep(0)
    await asyncio.wait_for(shutdown.drain(0.0), 2.0)
    stuck.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck
    assert shutdown._http_exchanges == 0


@pytest.mark.asyncio
async def test_the_drain_waits_until_the_reactor_has_written_the_last_bytes(not_embedded, monkeypatch):
    """A real Twisted reactor (Daphne's kind, on this event loop) with a response bigger than the
    socket buffers still in its write buffer: the drain ends only once a slow client has read it
    all, since the reactor's shutdown drops the connections and what they had not sent."""
    import socket

    from twisted.internet.asyncioreactor import AsyncioSelectorReactor
    from twisted.internet.protocol import Factory, Protocol

    payload = b"x" * (8 << 20)

    class Answer(Protocol):
        def connectionMade(self):
            self.transport.write(payload)

    reactor = AsyncioSelectorReactor(asyncio.get_running_loop())
    monkeypatch.setitem(sys.modules, "twisted.internet.reactor", reactor)
    port = reactor.listenTCP(0, Factory.forProtocol(Answer), interface="127.0.0.1")
    client = socket.create_connection(("127.0.0.1", port.getHost().port))
    try:
        await shutdown._wait_until(lambda: not shutdown._writes_flushed(), 2.0)
        assert not shutdown._writes_flushed(), "8 MiB unread should leave bytes in the reactor's buffer"
        draining = asyncio.ensure_future(shutdown.drain(0.0))
        await asyncio.sleep(0.3)
        assert not draining.done(), "the drain ended with bytes the reactor had not written"

        def read_all() -> int:
            received = 0
            while received < len(payload):
                received += len(client.recv(1 << 20))
            return received

        received = await asyncio.get_running_loop().run_in_executor(None, read_all)
        await asyncio.wait_for(draining, 2.0)
        assert received == len(payload) and shutdown._writes_flushed()
    finally:
        client.close()
        port.stopListening()
        reactor.disconnectAll()
