"""The embedded broker's delivery (workers/memory_transport.py): one exchange's replies reach each
address's queue in order, with one wake-up of the client loop for all of them."""

from __future__ import annotations

import asyncio

from workers.memory_transport import MemoryBroker, MemoryWorkerTransport
from workers.protocol import Reply


def test_an_exchange_wakes_the_client_loop_once_for_every_address():
    broker, loop = MemoryBroker(), asyncio.new_event_loop()
    try:
        queues = {a: broker.open_sink(a, loop) for a in ("memory:a", "memory:b", "memory:c")}
        wakeups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *args: wakeups.append(args) or real(*args)
        first, second, third, lost = (Reply("chunk", "w") for _ in range(4))
        worker = MemoryWorkerTransport(broker, "m", "w")
        worker.exchange([("memory:a", first), ("memory:b", second), ("memory:a", third),
                         ("memory:gone", lost)], 0, 0.0)  # an address whose client has left
        loop.run_until_complete(asyncio.sleep(0))
        assert len(wakeups) == 1
        a = queues["memory:a"].get_nowait()
        assert len(a) == 2 and a[0] is first and a[1] is third
        assert queues["memory:b"].get_nowait()[0] is second
        assert queues["memory:c"].empty()
    finally:
        loop.close()


def test_the_sinks_of_a_closed_loop_are_dropped():
    broker, loop = MemoryBroker(), asyncio.new_event_loop()
    broker.open_sink("memory:a", loop)
    broker.open_sink("memory:b", loop)
    loop.close()
    MemoryWorkerTransport(broker, "m", "w").exchange([("memory:a", Reply("chunk", "w"))], 0, 0.0)
    assert "memory:a" not in broker._sinks and "memory:b" not in broker._sinks
