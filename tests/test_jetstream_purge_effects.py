"""What purges, deletes and stream removal do to consumers, as nats-server does it
(server/stream.go purgeLocked, storeUpdates; server/consumer.go purge,
decStreamPending, stopWithFlags); both servers."""
from __future__ import annotations

import json

import nats

from test_jetstream import TIMEOUT, connect, js_server, run  # noqa: F401  (fixture)
from test_jetstream_sourcing import api, until


def _ci(c):
    return (c["delivered"]["consumer_seq"], c["delivered"]["stream_seq"],
            c["ack_floor"]["consumer_seq"], c["ack_floor"]["stream_seq"],
            c["num_ack_pending"], c["num_pending"])


async def _setup(nc, js):
    await api(nc, "$JS.API.STREAM.CREATE.P", {"name": "P", "subjects": ["p.>"]})
    for i in range(12):
        await js.publish("p.%s.%d" % ("ab"[i % 2], i), b"x")
    subs = {}
    for name, filt in (("all", None), ("a", "p.a.>"), ("b", "p.b.>"), ("star", "p.*.*")):
        cfg = {"durable_name": name, "ack_policy": "explicit"}
        if filt:
            cfg["filter_subject"] = filt
        await api(nc, "$JS.API.CONSUMER.CREATE.P." + name, {"stream_name": "P", "config": cfg})
        subs[name] = await js.pull_subscribe(filt or "p.>", name, stream="P")
        msgs = await subs[name].fetch(4, timeout=TIMEOUT)
        await msgs[0].ack_sync(timeout=TIMEOUT)
    return subs


def test_filtered_purge_moves_the_consumers_it_covers(js_server):
    async def main():
        nc, js = await connect(js_server)
        await _setup(nc, js)
        r = await api(nc, "$JS.API.STREAM.PURGE.P", {"filter": "p.a.>"})
        assert r["purged"] == 6
        got = {n: _ci(await api(nc, "$JS.API.CONSUMER.INFO.P." + n))
               for n in ("all", "a", "b", "star")}
        # Within the purge: past the end, nothing pending, floors reset.
        assert got["a"] == (4, 12, 4, 12, 0, 0)
        # Wider than the purge: the purged pending message no longer waits.
        assert got["all"] == (4, 4, 3, 1, 2, 4)
        # Untouched by it.
        assert got["b"] == (4, 8, 1, 3, 3, 2)
        assert got["star"][:5] == (4, 4, 1, 1, 3) and got["star"][5] == 4
        await nc.close()
    run(main())


def test_removed_pending_message_is_terminated_at_once(js_server):
    async def main():
        nc, js = await connect(js_server)
        await _setup(nc, js)
        adv = await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.P.b")
        # Sequence 4 is pending for b (and all, star): deleting it terminates it.
        assert await js.delete_msg("P", 4)
        ev = json.loads((await adv.next_msg(TIMEOUT)).data)
        assert (ev["stream_seq"], ev["consumer_seq"], ev["deliveries"]) == (4, 2, 1)
        assert ev["reason"] == "Unacknowledged message was deleted"
        b = _ci(await api(nc, "$JS.API.CONSUMER.INFO.P.b"))
        assert b == (4, 8, 2, 5, 2, 2)
        # A purge that takes one message is a removal too.
        await api(nc, "$JS.API.STREAM.PURGE.P", {"filter": "p.b.5"})
        ev = json.loads((await adv.next_msg(TIMEOUT)).data)
        assert ev["stream_seq"] == 6
        await nc.close()
    run(main())


def test_stream_delete_deletes_consumers_with_advisories(js_server, request):
    # nats-server loses its STREAM.DELETED advisory now and then (about one delete in
    # ten here): server/stream.go stop queues it on the stream's send queue and then
    # closes the loop that drains that queue, and the loop may take the close first.
    # natsjs must send it every time.
    reference = request.node.callspec.params["js_server"] == "reference"

    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.P", {"name": "P", "subjects": ["p"]})
        await api(nc, "$JS.API.CONSUMER.CREATE.P.c1", {"stream_name": "P", "config": {
            "durable_name": "c1", "ack_policy": "explicit"}})
        adv = await nc.subscribe("$JS.EVENT.ADVISORY.*.DELETED.>")
        inbox = nc.new_inbox()
        waiting = await nc.subscribe(inbox)
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.P.c1",
                         json.dumps({"batch": 1, "expires": 5_000_000_000}).encode(),
                         reply=inbox)

        async def queued():
            return (await api(nc, "$JS.API.CONSUMER.INFO.P.c1"))["num_waiting"] == 1
        await until(queued, what="the pull request to be queued")
        await js.delete_stream("P")
        m = await waiting.next_msg(TIMEOUT)
        assert m.headers["Status"] == "409"
        first = await adv.next_msg(TIMEOUT)
        assert first.subject == "$JS.EVENT.ADVISORY.CONSUMER.DELETED.P.c1"
        try:
            second = await adv.next_msg(2 if reference else TIMEOUT)
        except nats.errors.TimeoutError:
            if not reference:
                raise
        else:
            assert second.subject == "$JS.EVENT.ADVISORY.STREAM.DELETED.P"
        await nc.close()
    run(main())


def test_deleting_a_sourcing_stream_deletes_its_durable_on_the_origin(js_server):
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.W", {"name": "W", "subjects": ["w"],
                                                  "retention": "interest"})
        await api(nc, "$JS.API.STREAM.CREATE.S", {"name": "S", "subjects": ["s"],
                                                  "sources": [{"name": "W"}]})

        async def names():
            return (await api(nc, "$JS.API.CONSUMER.NAMES.W", {}))["consumers"] or []
        await until(names, what="the sourcing durable")
        await js.delete_stream("S")

        async def gone():
            return not await names()
        await until(gone, what="the durable to be deleted")
        await nc.close()
    run(main())
