"""End to end: a real natsjs-server process and the official Python client (nats-py).

Each test also runs against the reference nats-server where that is cheap
(``any_server``), so a behaviour that differs shows up as a failure on one side.
"""
import asyncio
import collections

import nats
import pytest
from nats.errors import MaxPayloadError, NoRespondersError, TimeoutError as NatsTimeout

from conftest import settle
from helpers import connect, run

TIMEOUT = 10


async def collect(sub, n, timeout=TIMEOUT):
    out = []
    for _ in range(n):
        out.append(await sub.next_msg(timeout=timeout))
    return out


def test_wildcards(any_server):
    async def main():
        nc = await connect(any_server)
        star = await nc.subscribe("a.*")
        full = await nc.subscribe("a.>")
        exact = await nc.subscribe("a.b")
        for subj in ("a.b", "a.c", "a.b.c", "b.a"):
            await nc.publish(subj, subj.encode())
        await nc.flush()
        assert [m.subject for m in await collect(star, 2)] == ["a.b", "a.c"]
        assert [m.subject for m in await collect(full, 3)] == ["a.b", "a.c", "a.b.c"]
        assert [m.data for m in await collect(exact, 1)] == [b"a.b"]
        for sub in (star, full, exact):
            with pytest.raises(NatsTimeout):
                await sub.next_msg(timeout=0.2)
        await nc.close()
    run(main())


def test_queue_groups_spread_and_exactly_once(any_server):
    async def main():
        nc = await connect(any_server)
        counts = collections.Counter()
        seen = []
        done = asyncio.Event()
        total = 1000

        def handler(name):
            async def cb(msg):
                counts[name] += 1
                seen.append(int(msg.data))
                if len(seen) == total:
                    done.set()
            return cb

        for i in range(4):
            await nc.subscribe("work", queue="workers", cb=handler("w%d" % i))
        plain = await nc.subscribe("work")
        await nc.flush()
        for i in range(total):
            await nc.publish("work", b"%d" % i)
        await nc.flush()
        await asyncio.wait_for(done.wait(), TIMEOUT)
        assert sorted(seen) == list(range(total))           # each message once
        assert len(counts) == 4 and min(counts.values()) > total // 10   # spread
        assert len(await collect(plain, total)) == total      # plain subs see all
        await nc.close()
    run(main())


def test_request_reply(any_server):
    async def main():
        nc = await connect(any_server)

        async def echo(msg):
            await msg.respond(b"re:" + msg.data)
        await nc.subscribe("svc", cb=echo)
        for i in range(50):
            r = await nc.request("svc", b"%d" % i, timeout=TIMEOUT)
            assert r.data == b"re:%d" % i
        await nc.close()
    run(main())


def test_no_responders(any_server):
    async def main():
        nc = await connect(any_server)
        with pytest.raises(NoRespondersError):
            await nc.request("nobody.home", b"?", timeout=TIMEOUT)
        await nc.close()
    run(main())


def test_headers(any_server):
    async def main():
        nc = await connect(any_server)
        sub = await nc.subscribe("h")
        await nc.publish("h", b"body", headers={"X-One": "1", "X-Two": "two words"})
        msg = (await collect(sub, 1))[0]
        assert msg.data == b"body"
        assert msg.headers == {"X-One": "1", "X-Two": "two words"}
        await nc.close()
    run(main())


def test_auto_unsubscribe(any_server):
    async def main():
        nc = await connect(any_server)
        sub = await nc.subscribe("auto")
        await sub.unsubscribe(limit=3)
        watcher = await nc.subscribe("auto")
        for i in range(10):
            await nc.publish("auto", b"%d" % i)
        await nc.flush()
        got = await collect(watcher, 10)
        assert len(got) == 10
        assert [m.data for m in await collect(sub, 3)] == [b"0", b"1", b"2"]
        with pytest.raises(NatsTimeout):
            await sub.next_msg(timeout=0.2)
        await nc.close()
    run(main())


def test_max_payload(any_server):
    async def main():
        nc = await connect(any_server)
        limit = nc.max_payload
        assert limit == 1024 * 1024
        sub = await nc.subscribe("big")
        await nc.publish("big", b"x" * limit)              # exactly the limit is fine
        await nc.publish("big", b"y" * (limit - 1))
        got = await collect(sub, 2)
        assert [len(m.data) for m in got] == [limit, limit - 1]
        with pytest.raises(MaxPayloadError):
            await nc.publish("big", b"z" * (limit + 1))      # the client refuses it
        await nc.close()
    run(main())


def test_oversized_payload_closes_connection(natsjs_server):
    """A client that ignores max_payload is closed and told why.

    natsjs half-closes and drains after the -ERR, so the client reads the error
    instead of a connection reset (the reference resets here; raw-socket tests
    compare the bytes both servers send).
    """
    server = natsjs_server()

    async def main():
        closed = asyncio.Event()

        async def on_closed():
            closed.set()
        nc = await connect(server, closed_cb=on_closed)
        nc._max_payload = 8 * 1024 * 1024                     # bypass the client-side check
        await nc.publish("big", b"z" * (2 * 1024 * 1024))
        try:
            await nc.flush(timeout=TIMEOUT)
        except Exception:
            pass
        await asyncio.wait_for(closed.wait(), TIMEOUT)
        assert "maximum payload violation" in str(nc.last_error).lower()
        assert server.alive()
        nc2 = await connect(server)
        await nc2.flush()
        await nc2.close()
    run(main())


def test_no_echo(any_server):
    async def main():
        nc = await connect(any_server, no_echo=True)
        other = await connect(any_server)
        mine = await nc.subscribe("echo")
        theirs = await other.subscribe("echo")
        await settle(nc, other)
        await nc.publish("echo", b"from nc")
        await other.publish("echo", b"from other")
        await nc.flush()
        await other.flush()
        assert [m.data for m in await collect(mine, 1)] == [b"from other"]
        with pytest.raises(NatsTimeout):
            await mine.next_msg(timeout=0.2)
        assert sorted(m.data for m in await collect(theirs, 2)) == [b"from nc", b"from other"]
        await nc.close()
        await other.close()
    run(main())


def test_many_messages_in_order(shared_natsjs):
    async def main():
        pub = await connect(shared_natsjs)
        subc = await connect(shared_natsjs)
        n = 20000
        got = []
        done = asyncio.Event()

        async def cb(msg):
            got.append(int(msg.data))
            if len(got) == n:
                done.set()
        await subc.subscribe("order", cb=cb, pending_msgs_limit=n + 1)
        await settle(subc)
        for i in range(n):
            await pub.publish("order", b"%d" % i)
        await pub.flush()
        await asyncio.wait_for(done.wait(), 30)
        assert got == list(range(n))
        await pub.close()
        await subc.close()
    run(main())


def test_unsubscribe_stops_delivery(shared_natsjs):
    async def main():
        nc = await connect(shared_natsjs)
        sub = await nc.subscribe("u")
        keep = await nc.subscribe("u")
        await nc.publish("u", b"1")
        await nc.flush()
        await collect(sub, 1)
        await sub.unsubscribe()
        await nc.publish("u", b"2")
        await nc.flush()
        assert [m.data for m in await collect(keep, 2)] == [b"1", b"2"]
        await nc.close()
    run(main())


def test_server_info_and_reconnect_to_another_server(natsjs_server):
    """Clients see the INFO fields they rely on and move to another server when theirs dies."""
    a = natsjs_server()
    b = natsjs_server()

    async def main():
        reconnected = asyncio.Event()

        async def on_reconnect():
            reconnected.set()
        nc = await nats.connect(servers=[a.url, b.url], dont_randomize=True,
                                reconnect_time_wait=0.05, max_reconnect_attempts=50,
                                reconnected_cb=on_reconnect)
        info = nc._server_info
        for key in ("server_id", "server_name", "version", "proto", "headers", "max_payload",
                    "client_id", "client_ip"):
            assert key in info, key
        assert tuple(int(x) for x in info["version"].split(".")[:2]) >= (2, 10)
        assert nc.connected_url.port == a.port
        a.stop()
        await asyncio.wait_for(reconnected.wait(), TIMEOUT)
        assert nc.connected_url.port == b.port
        sub = await nc.subscribe("after")
        await nc.publish("after", b"ok")
        assert (await collect(sub, 1))[0].data == b"ok"
        await nc.close()
    run(main())
