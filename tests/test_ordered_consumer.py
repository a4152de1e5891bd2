"""An ordered consumer keeps its place when the server it reads from restarts.

nats-py's ordered consumer (a push consumer the client recreates whenever it sees a
gap, a missed heartbeat or a lost connection, starting after the last stream sequence it
delivered) reads half a stream; the server stops and starts again on the same port and
store; more messages come; the consumer must deliver every stream sequence once, in
order. Against natsjs and the reference alike.
"""
from __future__ import annotations

import asyncio
import socket
from functools import partial

import nats
import pytest

from conftest import start_natsjs, start_reference
import helpers

run = partial(helpers.run, timeout=90)
STARTS = {"natsjs": start_natsjs, "reference": start_reference}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kind", sorted(STARTS))
def test_an_ordered_consumer_keeps_its_place_across_a_server_restart(kind, tmp_path):
    start = STARTS[kind]
    port = str(_free_port())
    args = ("-p", port, "-js", "-sd", str(tmp_path / "store"))
    server = start(*args)
    try:
        run(_read_across_restart(server, lambda: start(*args)))
    finally:
        server.stop()


async def _read_across_restart(server, restart):
    reconnected = asyncio.Event()

    async def on_reconnect():
        reconnected.set()

    nc = await nats.connect(server.url, reconnect_time_wait=0.1, max_reconnect_attempts=-1,
                            reconnected_cb=on_reconnect)
    js = nc.jetstream(timeout=5)
    await js.add_stream(name="ORDERED", subjects=["ord.>"])
    for i in range(1, 101):
        await js.publish("ord.%d" % (i % 7), b"m%d" % i)

    got = []
    sub = await js.subscribe("ord.>", ordered_consumer=True, idle_heartbeat=0.5)

    async def take(count):
        while len(got) < count:
            msg = await sub.next_msg(timeout=20)
            got.append(msg.metadata.sequence.stream)

    await take(50)
    server.stop()
    restarted = restart()
    try:
        await asyncio.wait_for(reconnected.wait(), 20)
        for i in range(101, 151):
            await js.publish("ord.%d" % (i % 7), b"m%d" % i)
        await take(150)
        assert got == list(range(1, 151))
        info = await js.stream_info("ORDERED")
        assert info.state.messages == 150
    finally:
        await nc.close()
        restarted.stop()
