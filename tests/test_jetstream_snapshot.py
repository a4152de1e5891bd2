"""Stream snapshot and restore (natsjs/jetstream/snapshot.py) on natsjs and on the
reference, spoken the way nats-io/jsm.go (``nats stream backup/restore``) speaks it:
raw API requests, chunks acknowledged through their reply subjects, the archive sent
back in chunks as requests and an empty request to finish."""
from __future__ import annotations

import asyncio
import json
import os

import pytest

from test_jetstream import TIMEOUT, connect, js_server, run  # noqa: F401  (fixture)
from test_jetstream_sourcing import api, info


async def backup(nc, stream: str, chunk_size: int = 0, consumers: bool = True):
    """jsm.go createSnapshot: (snapshot response, archive bytes, chunk messages)."""
    inbox = nc.new_inbox()
    data = bytearray()
    msgs = []
    done = asyncio.get_running_loop().create_future()

    async def on_chunk(m):
        msgs.append((len(m.data), m.reply, dict(m.headers or {})))
        if not m.data:
            if not done.done():
                done.set_result(m.headers or {})
            return
        if m.reply:
            await m.respond(b"")
        data.extend(m.data)
    sub = await nc.subscribe(inbox, cb=on_chunk)
    req = {"deliver_subject": inbox, "no_consumers": not consumers}
    if chunk_size:
        req["chunk_size"] = chunk_size
    resp = await api(nc, "$JS.API.STREAM.SNAPSHOT." + stream, req)
    assert "error" not in resp, resp
    status = await asyncio.wait_for(done, TIMEOUT)
    await sub.unsubscribe()
    assert status.get("Status", "204") == "204"
    return resp, bytes(data), msgs


async def restore(nc, stream: str, meta: dict, data: bytes, chunk: int = 64 * 1024):
    """jsm.go restoreSnapshot: the final stream_create_response."""
    resp = await api(nc, "$JS.API.STREAM.RESTORE." + stream, meta)
    assert "error" not in resp, resp
    for i in range(0, len(data), chunk):
        r = await nc.request(resp["deliver_subject"], data[i:i + chunk], timeout=TIMEOUT)
        assert r.data == b""
    r = await nc.request(resp["deliver_subject"], b"", timeout=TIMEOUT)
    return json.loads(r.data)


def test_backup_delete_restore_round_trip(js_server):
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.S", {"name": "S", "subjects": ["s.*"],
                                                  "allow_direct": True})
        for i in range(40):
            await js.publish("s.%d" % (i % 4), b"%d-" % i + os.urandom(1000),
                             headers={"Nats-Msg-Id": "m%d" % i})
        await js.delete_msg("S", 7)
        await js.delete_msg("S", 40)
        await js.purge_stream("S", seq=3)        # first_seq becomes 3
        await js.add_consumer("S", durable_name="d", ack_policy="explicit")
        sub = await js.pull_subscribe("s.*", "d", stream="S")
        got = await sub.fetch(5, timeout=TIMEOUT)
        for m in got[:3]:
            await m.ack_sync(timeout=TIMEOUT)
        before = await info(nc, "S")
        cbefore = await api(nc, "$JS.API.CONSUMER.INFO.S.d")
        adv = await nc.subscribe("$JS.EVENT.ADVISORY.STREAM.*.S")

        resp, data, msgs = await backup(nc, "S", chunk_size=1024)
        assert resp["config"]["name"] == "S" and resp["state"]["messages"] == 36
        assert resp["state"]["consumer_count"] == 1
        # Full chunks carry ack replies; the short last one does not; then 204.
        assert msgs[0][0] == 1024 and msgs[0][1].startswith("$JS.SNAPSHOT.ACK.S.")
        assert msgs[0][1].endswith(".1024.1") and msgs[1][1].endswith(".1024.2")
        assert not msgs[-2][1] and msgs[-1][0] == 0 and not msgs[-1][1]
        assert msgs[-1][2] == {"Status": "204"}
        kinds = []
        for _ in range(2):
            kinds.append((await adv.next_msg(TIMEOUT)).subject)
        assert kinds == ["$JS.EVENT.ADVISORY.STREAM.SNAPSHOT_CREATE.S",
                         "$JS.EVENT.ADVISORY.STREAM.SNAPSHOT_COMPLETE.S"]

        meta = {"config": resp["config"], "state": resp["state"]}
        r = await api(nc, "$JS.API.STREAM.RESTORE.S", meta)
        assert r["error"]["err_code"] == 10130
        assert r["error"]["description"] == "stream name already in use, cannot restore"
        await js.delete_stream("S")

        done = await restore(nc, "S", meta, data)
        assert done["type"] == "io.nats.jetstream.api.v1.stream_create_response"
        assert "error" not in done, done
        after = await info(nc, "S")
        for k in ("messages", "first_seq", "last_seq", "num_deleted", "num_subjects",
                  "consumer_count", "first_ts"):
            assert after["state"].get(k) == before["state"].get(k), k
        # nats-server 2.15 gives the restored stream a new creation time (and so a new
        # identity for sources); natsjs does the same.
        assert after["created"] > before["created"]
        for seq in (3, 8, 39):
            a = await js.get_msg("S", seq)
            assert a.data.startswith(b"%d-" % (seq - 1))
            assert a.headers["Nats-Msg-Id"] == "m%d" % (seq - 1)
        with pytest.raises(Exception):
            await js.get_msg("S", 7)
        # The consumer comes back where it was: three acknowledged, two pending.
        c = await api(nc, "$JS.API.CONSUMER.INFO.S.d")
        for k in ("delivered", "ack_floor"):
            assert (c[k]["consumer_seq"], c[k]["stream_seq"]) == \
                (cbefore[k]["consumer_seq"], cbefore[k]["stream_seq"]), k
        assert c["num_ack_pending"] == cbefore["num_ack_pending"] == 2
        # (natsjs also rebuilds the duplicate window from the restored messages, which
        # nats-server 2.15.1 does not.)
        kinds = set()
        while True:
            try:
                kinds.add((await adv.next_msg(0.5)).subject)
            except Exception:
                break
        assert {"$JS.EVENT.ADVISORY.STREAM.RESTORE_CREATE.S",
                "$JS.EVENT.ADVISORY.STREAM.RESTORE_COMPLETE.S"} <= kinds
        await nc.close()
    run(main())


def test_restore_errors(js_server):
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.S", {"name": "S", "subjects": ["s"]})
        await js.publish("s", b"x")
        r = await api(nc, "$JS.API.STREAM.SNAPSHOT.S", {"deliver_subject": "a.*"})
        assert r["error"]["err_code"] == 10015
        r = await api(nc, "$JS.API.STREAM.SNAPSHOT.NOPE", {"deliver_subject": "x"})
        assert r["error"]["err_code"] == 10059
        r = await api(nc, "$JS.API.STREAM.RESTORE.S")
        assert r["error"]["err_code"] == 10003 and r["deliver_subject"] == ""
        r = await api(nc, "$JS.API.STREAM.RESTORE.X", {"config": {"name": "Y"}})
        assert r["error"]["err_code"] == 10056
        # Garbage is acknowledged chunk by chunk, refused at the end.
        r = await api(nc, "$JS.API.STREAM.RESTORE.G", {"config": {"name": "G",
                                                                  "subjects": ["g"]}})
        ack = await nc.request(r["deliver_subject"], b"garbage, not an archive", timeout=TIMEOUT)
        assert ack.data == b""
        fin = json.loads((await nc.request(r["deliver_subject"], b"", timeout=TIMEOUT)).data)
        assert fin["error"] == {"code": 500, "err_code": 10062,
                                "description": "restore failed: s2: corrupt input"}
        with pytest.raises(Exception):
            await js.stream_info("G")
        # A snapshot cut short is refused too.
        resp, data, _ = await backup(nc, "S")
        await js.delete_stream("S")
        fin = await restore(nc, "S", {"config": resp["config"]}, data[:len(data) // 2])
        assert fin["error"]["err_code"] == 10062
        fin = await restore(nc, "S", {"config": resp["config"]}, data)
        assert fin["state"]["messages"] == 1
        await nc.close()
    run(main())


def test_memory_stream_round_trip(js_server):
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.M", {"name": "M", "storage": "memory",
                                                  "subjects": ["m.*"]})
        for i in range(5):
            await js.publish("m.%d" % i, b"v%d" % i)
        await js.purge_stream("M", subject="m.0")
        resp, data, _ = await backup(nc, "M", consumers=False)
        await js.delete_stream("M")
        fin = await restore(nc, "M", {"config": resp["config"], "state": resp["state"]}, data)
        assert fin["config"]["storage"] == "memory"
        assert (fin["state"]["messages"], fin["state"]["first_seq"],
                fin["state"]["last_seq"]) == (4, 2, 5)
        assert (await js.get_msg("M", 5)).data == b"v4"
        await nc.close()
    run(main())


def test_archive_checksums_catch_damage():
    """Every record carries a CRC-32C and the end record a digest of all before it."""
    from natsjs._core.filelog import MemLog
    from natsjs.jetstream.snapshot import ArchiveError, ArchiveReader, archive_records

    log = MemLog()
    for i in range(3):
        log.append(b"a.%d" % i, b"NATS/1.0\r\nX: 1\r\n\r\n", b"payload-%d" % i, 1000 + i)

    class FakeStream:
        store = log
        cfg = {"name": "A"}
        created = 1
        consumers = {}
    raw = b"".join(archive_records(FakeStream, True, log.last_seq))
    got = []
    r = ArchiveReader()
    r.feed(raw, lambda *m: got.append(m))
    r.finish()
    assert [m[0] for m in got] == [1, 2, 3] and got[2][3] == b"payload-2"
    damaged = bytearray(raw)
    damaged[raw.index(b"payload-1")] ^= 1
    with pytest.raises(ArchiveError, match="checksum mismatch"):
        ArchiveReader().feed(bytes(damaged), lambda *m: None)
    with pytest.raises(ArchiveError, match="incomplete"):
        r = ArchiveReader()
        r.feed(raw[:-10], lambda *m: None)
        r.finish()
