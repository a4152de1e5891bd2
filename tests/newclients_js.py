"""JetStream and key-value through the newer Python clients, in strict mode.

Run by tests/test_new_clients.py under a Python 3.13 virtualenv with PyPI's
``nats-core``, ``nats-jetstream`` and ``nats-key-value`` (they need 3.13).  Their
``strict`` mode refuses any field of an API answer the client does not model, so it
checks natsjs's JSON against what the client was written for, field by field; the test
runs the same steps against nats-server.

Each step runs on its own and is reported as ``"ok"`` or the error it raised, in one
JSON line: ``{"steps": {name: "ok" | "error text"}, "facts": {...}}``.  Arguments: the
server URL, the replica count for the stream and the bucket, and ``strict`` or
``lenient``.
"""
import asyncio
import json
import sys
import traceback
from datetime import datetime, timedelta, timezone

from nats.client import connect
from nats.jetstream import new as jetstream
from nats.key_value import KeyValueConfig, create_key_value, key_value, key_value_buckets

STREAM = "NEWCLI"
BUCKET = "newcli"
COUNT = 20


async def main(url: str, replicas: int, strict: bool) -> dict:
    nc = await connect(url, timeout=5)
    js = jetstream(nc, strict=strict)
    steps: dict[str, str] = {}
    facts: dict = {}

    async def step(name, coro_fn):
        try:
            await coro_fn()
            steps[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - every step is reported, not raised
            steps[name] = "%s: %s" % (type(exc).__name__, exc)
            facts.setdefault("tracebacks", {})[name] = traceback.format_exc(limit=3)[-600:]

    async def account():
        info = await js.account_info()
        facts["streams_before"] = info.streams

    async def create():
        stream = await js.create_stream(name=STREAM, subjects=["newcli.>"], num_replicas=replicas)
        facts["replicas"] = stream.info.config.num_replicas

    async def publish():
        seqs = []
        for i in range(COUNT):
            ack = await js.publish("newcli.%d" % (i % 4), b"m%d" % i)
            assert ack.stream == STREAM, ack
            seqs.append(ack.sequence)
        assert seqs == list(range(1, COUNT + 1)), seqs

    async def info():
        si = await js.get_stream_info(STREAM)
        assert si.state.messages == COUNT, si.state
        if replicas > 1:
            cl = si.cluster
            assert cl is not None and cl.leader, cl
            facts["leader"] = cl.leader
            facts["replicas_seen"] = sorted(p.name for p in cl.replicas or [])
            assert len(cl.replicas or []) == replicas - 1, cl

    async def listing():
        names = [n async for n in js.stream_names()]
        assert STREAM in names, names
        infos = [s async for s in js.list_streams()]
        assert any(s.config.name == STREAM for s in infos)

    async def get():
        msg = await js.get_message(STREAM, 3)
        assert msg.data == b"m2" and msg.subject == "newcli.2", msg
        last = await js.get_last_message_for_subject(STREAM, "newcli.1")
        assert last.data == b"m%d" % (COUNT - 3), last

    async def consume():
        consumer = await js.create_consumer(STREAM, name="pull", durable_name="pull",
                                            ack_policy="explicit")
        got = []
        while len(got) < COUNT:
            batch = await consumer.fetch(max_messages=8, max_wait=2.0)
            n = 0
            async for m in batch:
                got.append(m.data)
                await m.ack()
                n += 1
            assert n, "an empty batch after %d messages" % len(got)
        assert got == [b"m%d" % i for i in range(COUNT)], got
        ci = await js.get_consumer_info(STREAM, "pull")
        assert ci.delivered["stream_seq"] == COUNT and ci.ack_floor["stream_seq"] == COUNT, ci
        names = [n async for n in js.consumer_names(STREAM)]
        assert names == ["pull"], names

    async def ordered():
        oc = await js.ordered_consumer(STREAM)
        got = []
        async with oc:
            while len(got) < COUNT:
                m = await oc.next(max_wait=2.0)
                got.append(m.data)
        assert got == [b"m%d" % i for i in range(COUNT)], got

    async def kv():
        bucket = await create_key_value(js, KeyValueConfig(bucket=BUCKET, history=5,
                                                           replicas=replicas))
        r1 = await bucket.put("k", b"v1")
        r2 = await bucket.put("k", b"v2")
        assert r2 > r1
        e = await bucket.get("k")
        assert e.value == b"v2" and e.revision == r2, e
        r3 = await bucket.update("k", b"v3", r2)
        hist = [x.value async for x in await bucket.history("k")]
        assert hist == [b"v1", b"v2", b"v3"], hist
        await bucket.create("other", b"o")
        keys = sorted([k async for k in await bucket.keys()])
        assert keys == ["k", "other"], keys
        await bucket.delete("other")
        st = await bucket.status()
        facts["kv_values"] = st.values
        again = await key_value(js, BUCKET)
        assert (await again.get("k")).revision == r3

    async def watch():
        bucket = await key_value(js, BUCKET)
        async with await bucket.watch("k") as w:
            initial = [e.value async for e in w.values()]
            assert initial == [b"v3"] and w.at_eod(), initial
            revision = await bucket.put("k", b"v4")
            update = await w.__anext__()
            assert (update.value, update.revision) == (b"v4", revision), update

    async def step_down():
        """Replicated only: the stream's leader steps down; publishing goes on through
        the client's retries, and another replica leads."""
        if replicas == 1:
            return
        before = (await js.get_stream_info(STREAM)).cluster.leader
        reply = json.loads((await nc.request("$JS.API.STREAM.LEADER.STEPDOWN." + STREAM, b"",
                                             timeout=5)).data)
        assert reply.get("success") is True, reply
        for i in range(COUNT, COUNT + 5):
            ack = await js.publish("newcli.%d" % (i % 4), b"m%d" % i, retry_attempts=20)
            assert ack.sequence == i + 1, ack
        after = (await js.get_stream_info(STREAM)).cluster.leader
        assert after and after != before, (before, after)
        facts["leader_after_step_down"] = after

    async def manage():
        si = await js.update_stream(name=STREAM, subjects=["newcli.>"], num_replicas=replicas,
                                    description="updated", max_msgs=1000)
        assert si.config.description == "updated" and si.config.max_msgs == 1000, si.config
        stream = await js.get_stream(STREAM)
        await stream.delete_message(5)
        await stream.purge(filter="newcli.3")
        si = await stream.get_info()
        # less the deleted seq 5 (newcli.0) and what newcli.3 had: five of the first
        # twenty, and one of the five published across the step-down
        kept = COUNT - 6 if replicas == 1 else COUNT + 5 - 7
        assert si.state.messages == kept, si.state
        infos = [c async for c in js.list_consumers(STREAM)]
        assert [c.name for c in infos] == ["pull"], infos
        assert await js.delete_consumer(STREAM, "pull")
        buckets = [b.bucket async for b in key_value_buckets(js)]
        assert buckets == [BUCKET], buckets
        bucket = await key_value(js, BUCKET)
        await bucket.purge("k")
        assert [k async for k in await bucket.keys()] == [], "keys after purge"

    async def priority():
        """Priority groups: an overflow consumer's min_pending, a pinned client's pin
        (Nats-Pin-Id on each message, pinned_client_id in consumer info)."""
        ovf = await js.create_consumer(STREAM, name="ovf", durable_name="ovf",
                                       ack_policy="explicit", priority_policy="overflow",
                                       priority_groups=["g"])
        got = [m async for m in await ovf.fetch(max_messages=2, max_wait=2.0,
                                                 priority_group="g", min_pending=1)]
        assert len(got) == 2, got
        got = [m async for m in await ovf.fetch(max_messages=1, max_wait=0.5,
                                                 priority_group="g", min_pending=1000)]
        assert got == [], "served below min_pending"
        pin = await js.create_consumer(STREAM, name="pin", durable_name="pin",
                                       ack_policy="explicit",
                                       priority_policy="pinned_client", priority_groups=["g"])
        got = [m async for m in await pin.fetch(max_messages=2, max_wait=2.0,
                                                 priority_group="g")]
        pins = {m.headers.get("Nats-Pin-Id") for m in got}
        assert len(got) == 2 and len(pins) == 1 and None not in pins, (got, pins)
        ci = await js.get_consumer_info(STREAM, "pin")
        assert ci.priority_groups[0]["pinned_client_id"] in pins, ci.priority_groups
        assert ci.config.priority_timeout == 120_000_000_000, ci.config
        for name in ("ovf", "pin"):
            assert await js.delete_consumer(STREAM, name)

    async def pause():
        """A consumer created paused, resumed and paused again through the client's
        API layer (it has no method of its own for it)."""
        until = datetime.now(timezone.utc) + timedelta(seconds=30)
        c = await js.create_consumer(STREAM, name="paused", durable_name="paused",
                                     ack_policy="explicit", pause_until=until)
        ci = await js.get_consumer_info(STREAM, "paused")
        assert ci.paused and ci.pause_remaining.total_seconds() > 20, ci
        assert [m async for m in await c.fetch(max_messages=1, max_wait=0.5)] == []
        resp = await js._api.consumer_pause(STREAM, "paused")
        assert resp["paused"] is False, resp
        for _ in range(50):
            # nats-server answers once proposed; its info follows a moment later
            if not (await js.get_consumer_info(STREAM, "paused")).paused:
                break
            await asyncio.sleep(0.1)
        got = [m async for m in await c.fetch(max_messages=1, max_wait=2.0)]
        assert len(got) == 1, got
        later = (until + timedelta(seconds=30)).isoformat().replace("+00:00", "Z")
        resp = await js._api.consumer_pause(STREAM, "paused", pause_until=later)
        assert resp["paused"] is True and resp["pause_remaining"] > 0, resp
        assert await js.delete_consumer(STREAM, "paused")

    async def cleanup():
        assert await js.delete_stream(STREAM)

    for name, fn in [("account_info", account), ("create_stream", create),
                     ("publish", publish), ("stream_info", info), ("list_streams", listing),
                     ("get_message", get), ("pull_consumer", consume),
                     ("ordered_consumer", ordered), ("key_value", kv), ("kv_watch", watch),
                     ("step_down", step_down), ("manage", manage),
                     ("priority_groups", priority), ("pause", pause),
                     ("delete_stream", cleanup)]:
        await asyncio.wait_for(step(name, fn), 30)
    await nc.close()
    return {"steps": steps, "facts": facts}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "strict"))))
