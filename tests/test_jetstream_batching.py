"""Atomic batch publish (``allow_atomic``, ``Nats-Batch-*``), natsjs against nats-server.

Each scenario sends the same requests to a fresh natsjs and a fresh nats-server (the
reference binary) through tests/jsdiff.py and compares the normalized transcripts: the
configurations refused and accepted, the empty answers while a batch is staged, the
commit's PubAck (``"batch"``, ``"count"``), what is stored (and that nothing is when a
batch fails), every refusal and the limits (open batches, size, inactivity).

The replicated tests run an R3 stream on three natsjs servers and on three nats-servers:
the same answers, and each natsjs replica's own store holds whole batches only.  The
restart test leaves a half-written batch at the end of a stream's files, as a process
killed while writing it would, and checks that natsjs starts without any of it.
"""
from __future__ import annotations

import asyncio
import glob
import json
import os
import sys
import tempfile

import nats
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jscluster import JSCluster, answers_on_both  # noqa: E402
from jsdiff import Scenario, add_stream, api, compare, registry  # noqa: E402
from test_jetstream_counters import _create, assert_matches_reference  # noqa: E402

SCENARIOS: dict[str, Scenario] = {}
scenario = registry(SCENARIOS)

# Small limits for the limits scenario (both servers read the same file).
_LIMITS = os.path.join(tempfile.mkdtemp(prefix="batch-limits-"), "limits.conf")
with open(_LIMITS, "w") as _f:
    _f.write("jetstream { limits { batch { max_inflight_per_stream: 2, "
             "max_inflight_total: 3, max_msgs: 4, timeout: \"1s\" } } }\n")


def bmsg(s, subject: str, bid: str, seq, data=b"x", commit=None, note=None, **headers):
    hdrs = {"Nats-Batch-Id": bid}
    if seq is not None:
        hdrs["Nats-Batch-Sequence"] = str(seq)
    if commit is not None:
        hdrs["Nats-Batch-Commit"] = commit
    hdrs.update(headers)
    return s.request(subject, data, headers=hdrs, note=note)


async def batch(s, subject: str, bid: str, n: int, commit="1", note=None, **last_headers):
    for i in range(1, n):
        await bmsg(s, subject, bid, i, b"m%d" % i)
    await bmsg(s, subject, bid, n, b"m%d" % n, commit=commit, note=note, **last_headers)


async def get(s, stream: str, seq: int, note=None):
    return await api(s, "STREAM.MSG.GET." + stream, {"seq": seq}, note=note)


# -- scenarios -----------------------------------------------------------------------------

@scenario()
async def atomic_config(s):
    """Which configurations may allow atomic publish, and updates turning it on and off."""
    await add_stream(s, "B", subjects=["b.>"], allow_atomic=True, note="allowed")
    await api(s, "STREAM.INFO.B")
    await add_stream(s, "M", mirror={"name": "B"}, allow_atomic=True, note="a mirror")
    await add_stream(s, "A", subjects=["a"], allow_atomic=True, persist_mode="async",
                     note="async persist mode")
    await add_stream(s, "MEM", subjects=["mem"], allow_atomic=True, storage="memory",
                     allow_msg_counter=True, note="memory storage, counters")
    await api(s, "STREAM.UPDATE.B", {"name": "B", "subjects": ["b.>"]}, note="turned off")
    await bmsg(s, "b.1", "x", 1, commit="1", note="then refused")
    await api(s, "STREAM.UPDATE.B", {"name": "B", "subjects": ["b.>"], "allow_atomic": True},
              note="turned on again")
    await bmsg(s, "b.1", "x", 1, commit="1", note="then taken")


@scenario()
async def atomic_commits(s):
    """Batches committed with ``1`` and with ``eob``, a batch of one, the longest id: the
    PubAcks and the messages stored with their headers."""
    await add_stream(s, "B", subjects=["b.>"], allow_atomic=True)
    await batch(s, "b.a", "one", 3, note="commit 1")
    await batch(s, "b.b", "two", 4, commit="eob", note="commit eob: the marker not stored")
    await bmsg(s, "b.c", "single", 1, commit="1", note="a batch of one")
    await bmsg(s, "b.c", "i" * 64, 1, commit="1", note="an id of 64 bytes")
    await bmsg(s, "b.c", "one", 1, commit="1", X_Other="v", note="an id used before")
    await bmsg(s, "b.c", "", 1, commit="1", note="an empty id: a plain publish")
    for seq in range(1, 10):
        await get(s, "B", seq)
    await api(s, "STREAM.INFO.B")


@scenario()
async def atomic_refusals(s):
    """Each way a batch is refused, and that nothing of a refused batch is stored."""
    adv = await s.subscribe("$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED.>")
    await add_stream(s, "B", subjects=["b.>"], allow_atomic=True, allow_rollup_hdrs=True)
    await add_stream(s, "N", subjects=["n.>"])
    await bmsg(s, "n.1", "a", 1, note="disabled")
    await bmsg(s, "b.1", "x" * 65, 1, note="an id too long")
    await bmsg(s, "b.1", "m", None, note="no sequence")
    await bmsg(s, "b.1", "m", "abc", note="a sequence that is not a number")
    await bmsg(s, "b.1", "m", "-1", note="a negative sequence")
    await bmsg(s, "b.1", "m", 0, note="sequence 0")
    await bmsg(s, "b.1", "g", 2, note="starting at 2")
    await bmsg(s, "b.1", "g", 1001, note="starting beyond the largest batch")
    await bmsg(s, "b.1", "g", 1001, commit="eob", note="the same, an eob")
    await bmsg(s, "b.1", "g", 1)
    await bmsg(s, "b.1", "g", 3, note="a gap")
    await bmsg(s, "b.1", "g", 2, note="after the gap: the batch is gone")
    await bmsg(s, "b.1", "c", 1, commit="yes", note="an invalid commit")
    await bmsg(s, "b.1", "c", 1, commit="", note="an empty commit")
    await bmsg(s, "b.1", "c", 1, commit="EOB", note="commit values are case sensitive")
    await bmsg(s, "b.1", "c", 1, commit="eob", note="eob at 1")
    await bmsg(s, "b.1", "d", 1, **{"Nats-Msg-Id": "m1"})
    await bmsg(s, "b.1", "d", 2, commit="1", note="a message id twice",
               **{"Nats-Msg-Id": "m1"})
    await bmsg(s, "b.1", "f", 1)
    await bmsg(s, "b.1", "f", 2, commit="1", note="Nats-Expected-Last-Msg-Id",
               **{"Nats-Expected-Last-Msg-Id": "m1"})
    await bmsg(s, "b.1", "h", 1, **{"Nats-Expected-Last-Sequence": "7"})
    await bmsg(s, "b.1", "h", 2, commit="1", note="a wrong expected last sequence")
    await bmsg(s, "b.1", "s", 1, **{"Nats-Expected-Stream": "OTHER"})
    await bmsg(s, "b.1", "s", 2, commit="1", note="another stream expected")
    await bmsg(s, "b.1", "t", 1, **{"Nats-TTL": "1h"})
    await bmsg(s, "b.1", "t", 2, commit="1", note="a TTL without TTLs")
    await bmsg(s, "b.1", "r", 1)
    await bmsg(s, "b.2", "r", 2, commit="1", note="rollup all not first",
               **{"Nats-Rollup": "all"})
    await bmsg(s, "b.1", "r", 1)
    await bmsg(s, "b.1", "r", 2, commit="1", note="rollup sub of a subject in the batch",
               **{"Nats-Rollup": "sub"})
    await bmsg(s, "b.1", "r", 1, commit="1", note="an invalid rollup",
               **{"Nats-Rollup": "some"})
    await bmsg(s, "b.1", "q", 1, **{"Nats-Required-Api-Level": "99"},
               note="a required API level above ours")
    await api(s, "STREAM.INFO.B", note="nothing stored")
    await s.collect(adv, 3, note="the batches abandoned: a gap, eob at 1, the API level")


@scenario()
async def atomic_checks(s):
    """Expected sequences, message ids, rollups and counters evaluated for the batch."""
    await add_stream(s, "B", subjects=["b.>"], allow_atomic=True, allow_rollup_hdrs=True)
    await s.request("b.x", b"before", headers={"Nats-Msg-Id": "old"})
    await s.request("b.x", b"plain", note="no headers (natsjs: stored by the C capture)")
    await bmsg(s, "b.1", "e", 1, **{"Nats-Expected-Last-Sequence": "2"})
    await bmsg(s, "b.2", "e", 2, commit="1", note="expected last sequence on the first")
    await bmsg(s, "b.1", "e2", 1, **{"Nats-Expected-Last-Sequence": "4"})
    await bmsg(s, "b.2", "e2", 2, commit="1", note="and again on the second",
               **{"Nats-Expected-Last-Sequence": "5"})
    await bmsg(s, "b.1", "ps", 1, **{"Nats-Expected-Last-Subject-Sequence": "3"})
    await bmsg(s, "b.3", "ps", 2, commit="1", note="expected last subject sequence",
               **{"Nats-Expected-Last-Subject-Sequence": "0"})
    await bmsg(s, "b.1", "ps2", 1)
    await bmsg(s, "b.1", "ps2", 2, commit="1", note="on a subject the batch wrote",
               **{"Nats-Expected-Last-Subject-Sequence": "4"})
    await bmsg(s, "b.9", "ps3", 1, **{"Nats-Expected-Last-Subject-Sequence": "0",
                                      "Nats-Expected-Last-Subject-Sequence-Subject": "b.8"})
    await bmsg(s, "b.7", "ps3", 2, commit="1", note="twice for the same other subject",
               **{"Nats-Expected-Last-Subject-Sequence": "0",
                  "Nats-Expected-Last-Subject-Sequence-Subject": "b.8"})
    await bmsg(s, "b.1", "id", 1, commit="1", note="a message id stored before",
               **{"Nats-Msg-Id": "old"})
    await bmsg(s, "b.1", "id2", 1, **{"Nats-Msg-Id": "n1"})
    await bmsg(s, "b.2", "id2", 2, commit="1", note="new message ids",
               **{"Nats-Msg-Id": "n2"})
    await s.request("b.1", b"", headers={"Nats-Msg-Id": "n2"}, note="then a duplicate")
    await bmsg(s, "b.r", "ru", 1, **{"Nats-Rollup": "sub"})
    await bmsg(s, "b.s", "ru", 2, commit="1", note="a rollup on the first of a subject",
               **{"Nats-Rollup": "sub"})
    await bmsg(s, "b.1", "ra", 1, **{"Nats-Rollup": "all"})
    await bmsg(s, "b.2", "ra", 2, commit="1", note="rollup all first: the stream rolled up")
    await api(s, "STREAM.INFO.B")
    await add_stream(s, "C", subjects=["c.>"], allow_atomic=True, allow_msg_counter=True)
    await s.request("c.a", b"", headers={"Nats-Incr": "5"})
    await bmsg(s, "c.a", "k", 1, data=b"", **{"Nats-Incr": "1"})
    await bmsg(s, "c.b", "k", 2, data=b"", **{"Nats-Incr": "2"})
    await bmsg(s, "c.a", "k", 3, data=b"", commit="1", note="counter increments",
               **{"Nats-Incr": "10"})
    await bmsg(s, "c.a", "k2", 1, data=b"", **{"Nats-Incr": "1"})
    await bmsg(s, "c.a", "k2", 2, data=b"", commit="1", note="one without an increment")
    for seq in range(1, 6):
        await get(s, "C", seq)
    await add_stream(s, "DN", subjects=["dn.>"], allow_atomic=True, discard="new",
                     max_msgs=3)
    await batch(s, "dn.a", "big", 4, note="over max_msgs with discard new")
    await batch(s, "dn.a", "fits", 3, note="within it")
    await add_stream(s, "DP", subjects=["dp.>"], allow_atomic=True, discard="new",
                     max_msgs_per_subject=2, discard_new_per_subject=True)
    await batch(s, "dp.a", "big", 3, note="over the per-subject limit")
    await api(s, "STREAM.INFO.DN")
    await api(s, "STREAM.INFO.DP")


@scenario("-c", _LIMITS)
async def atomic_limits(s):
    """The server's batch limits: open batches per stream and per server, the largest
    batch, and a batch abandoned after its timeout."""
    adv = await s.subscribe("$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED.>")
    await add_stream(s, "B", subjects=["b.>"], allow_atomic=True)
    await add_stream(s, "B2", subjects=["c.>"], allow_atomic=True)
    await bmsg(s, "b.1", "a", 1)
    await bmsg(s, "b.1", "b", 1)
    await bmsg(s, "b.1", "c", 1, note="a third open batch on the stream")
    await bmsg(s, "c.1", "a", 1, note="a third on the server")
    await bmsg(s, "c.1", "b", 1, note="a fourth on the server")
    await bmsg(s, "b.1", "a", 2, commit="1", note="one ends")
    await bmsg(s, "b.1", "c", 1, note="then another may start")
    await bmsg(s, "b.1", "c", 2)
    await bmsg(s, "b.1", "c", 3)
    await bmsg(s, "b.1", "c", 4)
    await bmsg(s, "b.1", "c", 5, commit="eob", note="four and an eob: allowed")
    await batch(s, "b.1", "d", 5, note="five: too large")
    await bmsg(s, "b.1", "d", 5, note="starting at 5")
    await bmsg(s, "b.1", "e", 1)
    await asyncio.sleep(1.5)     # the batch's inactivity timeout (1s) runs out
    await bmsg(s, "b.1", "e", 2, commit="1", note="after the timeout")
    await bmsg(s, "b.1", "b", 2, commit="1", note="an older batch after the timeout")
    await api(s, "STREAM.INFO.B")
    await s.collect(adv, 4, sort=True, note="abandoned: one too large, three timed out")


# -- the tests -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SCENARIOS))
def test_natsjs_matches_reference(name):
    assert_matches_reference(SCENARIOS[name])


async def _send(nc, subject, bid, seq, commit=None, data=b"x", **headers):
    hdrs = {"Nats-Batch-Id": bid, "Nats-Batch-Sequence": str(seq), **headers}
    if commit:
        hdrs["Nats-Batch-Commit"] = commit
    msg = await nc.request(subject, data, headers=hdrs, timeout=10)
    return json.loads(msg.data) if msg.data else ""


async def _r3_answers(cluster: JSCluster) -> list:
    nc = await nats.connect([cluster.url(j) for j in range(3)])
    js = nc.jetstream(timeout=10)
    await _create(nc, name="B", subjects=["b.>"], num_replicas=3, allow_atomic=True)
    out = []
    for i in range(1, 4):
        out.append(await _send(nc, "b.a", "one", i, "1" if i == 3 else None))
    for i in range(1, 5):
        out.append(await _send(nc, "b.b", "two", i, "eob" if i == 4 else None))
    out.append(await _send(nc, "b.c", "gap", 1))
    out.append(await _send(nc, "b.c", "gap", 3))
    out.append(await _send(nc, "b.c", "els", 1, **{"Nats-Expected-Last-Sequence": "6"}))
    out.append(await _send(nc, "b.c", "els", 2, "1"))
    out.append(await _send(nc, "b.c", "els2", 1, **{"Nats-Expected-Last-Sequence": "9"}))
    out.append(await _send(nc, "b.c", "els2", 2, "1"))
    out.append(await _send(nc, "b.c", "dup", 1, **{"Nats-Msg-Id": "m"}))
    out.append(await _send(nc, "b.c", "dup", 2, "1", **{"Nats-Msg-Id": "m"}))
    out.append(await _send(nc, "b.c", "bad", 1, "nope"))
    out.append(await _send(nc, "b.c", "x" * 65, 1, "1"))
    out.append(await _send(nc, "b.c", "lm", 1, "1", **{"Nats-Expected-Last-Msg-Id": "m"}))
    for seq in range(1, 10):
        try:
            m = await js.get_msg("B", seq)
        except nats.js.errors.NotFoundError:
            out.append(None)
            continue
        out.append({"subject": m.subject, "data": m.data.decode(),
                    "headers": dict(m.headers or {})})
    info = await js.stream_info("B")
    out.append({"messages": info.state.messages, "last_seq": info.state.last_seq})
    await nc.close()
    return out


def test_r3_answers_match_reference(tmp_path):
    answers = answers_on_both(tmp_path, _r3_answers)
    assert sum(isinstance(a, dict) and "batch" in a for a in answers["natsjs"]) == 3
    diffs = compare(answers["reference"], answers["natsjs"])
    assert not diffs, "\n".join(diffs)


def _replica_messages(cluster: JSCluster, i: int, stream: str) -> list:
    """Server ``i``'s own copy of the stream, read from its disk (the server stopped):
    ``(seq, batch id, batch sequence, commit)`` of each message."""
    from natsjs._core.filelog import FileLog
    from natsjs.jetstream import headers as H
    found = glob.glob(os.path.join(cluster.dir, "n%d" % (i + 1), "**", stream, "msgs"),
                      recursive=True)
    assert len(found) == 1, found
    log = FileLog(found[0])
    try:
        out = []
        seq = log.first_seq
        while True:
            rec = log.load_next(seq)
            if rec is None:
                return out
            seq, _, hdr, _, _ = rec
            out.append((seq, H.get(hdr, b"Nats-Batch-Id"), H.get(hdr, b"Nats-Batch-Sequence"),
                        H.get(hdr, b"Nats-Batch-Commit")))
            seq += 1
    finally:
        log.close()


def test_r3_concurrent_batches_whole_on_every_replica(tmp_path):
    """Many clients publish batches at once, some failing halfway (a gap, a wrong expected
    sequence): each replica's store holds exactly the committed batches, each whole and
    in one piece, in the same order on every replica."""
    async def main(cluster):
        nc = await nats.connect([cluster.url(j) for j in range(3)])
        await _create(nc, name="B", subjects=["b.>"], num_replicas=3, allow_atomic=True)

        async def one(k):
            bid = "batch-%d" % k
            size = 2 + k % 5
            for i in range(1, size):
                assert await _send(nc, "b.%d" % k, bid, i) == ""
            if k % 4 == 3:
                extra = {"Nats-Expected-Last-Sequence": "999999"}
            else:
                extra = {}
            if k % 7 == 6:
                ack = await _send(nc, "b.%d" % k, bid, size + 1, "1")   # a gap
            else:
                ack = await _send(nc, "b.%d" % k, bid, size, "1", **extra)
            return k, size, ack
        results = await asyncio.gather(*(one(k) for k in range(40)))
        await nc.close()
        return results

    cluster = JSCluster(tmp_path, 3).start()
    try:
        results = asyncio.run(asyncio.wait_for(main(cluster), 120))
    finally:
        cluster.close()
    committed = {}
    for k, size, ack in results:
        if k % 7 == 6:
            assert ack["error"]["err_code"] == 10176, ack
        elif k % 4 == 3:
            assert ack["error"]["err_code"] == 10071, ack
        else:
            assert ack["batch"] == "batch-%d" % k and ack["count"] == size, ack
            committed[b"batch-%d" % k] = (ack["seq"], size)
    stores = [_replica_messages(cluster, i, "B") for i in range(3)]
    assert stores[0] == stores[1] == stores[2]
    by_batch: dict = {}
    for seq, bid, bseq, commit in stores[0]:
        by_batch.setdefault(bid, []).append((seq, int(bseq), commit))
    assert set(by_batch) == set(committed)
    for bid, msgs in by_batch.items():
        last, size = committed[bid]
        assert [m[0] for m in msgs] == list(range(last - size + 1, last + 1)), bid
        assert [m[1] for m in msgs] == list(range(1, size + 1))
        assert [m[2] for m in msgs] == [None] * (size - 1) + [b"1"]


def test_restart_drops_a_half_written_batch(tmp_path):
    """A batch whose writing stopped before its commit message (a process killed while
    writing it leaves its first messages in the files) is not there after a restart;
    the committed batch before it is."""
    import conftest
    from natsjs._core.filelog import FileLog

    async def publish(url):
        nc = await nats.connect(url)
        await _create(nc, name="B", subjects=["b.>"], allow_atomic=True)
        acks = [await _send(nc, "b.1", "whole", i, "1" if i == 3 else None)
                for i in range(1, 4)]
        await nc.close()
        return acks[-1]

    async def state(url):
        nc = await nats.connect(url)
        js = nc.jetstream(timeout=10)
        info = await js.stream_info("B")
        last = await js.get_msg("B", info.state.last_seq)
        ack = await _send(nc, "b.1", "next", 1, "1")
        await nc.close()
        return info.state.messages, info.state.last_seq, dict(last.headers), ack

    sd = str(tmp_path / "sd")
    server = conftest.start_natsjs("-js", "-sd", sd)
    try:
        ack = asyncio.run(asyncio.wait_for(publish(server.url), 30))
    finally:
        server.stop()
    assert ack["count"] == 3 and ack["seq"] == 3
    found = glob.glob(os.path.join(sd, "**", "B", "msgs"), recursive=True)
    assert len(found) == 1
    log = FileLog(found[0])
    for i in range(1, 3):       # the first two of a batch of three: no commit
        log.append(b"b.2", b"NATS/1.0\r\nNats-Batch-Id: half\r\nNats-Batch-Sequence: %d\r\n\r\n"
                   % i, b"y", 1)
    s = log.begin_sync()
    s.run()
    log.mark_synced(s)
    assert log.last_seq == 5
    log.close()
    server = conftest.start_natsjs("-js", "-sd", sd)
    try:
        msgs, last, headers, ack = asyncio.run(asyncio.wait_for(state(server.url), 30))
    finally:
        server.stop()
    assert (msgs, last) == (3, 3)
    assert headers["Nats-Batch-Id"] == "whole" and headers["Nats-Batch-Commit"] == "1"
    assert ack["seq"] == 4 and ack["count"] == 1


@pytest.mark.parametrize("hdr,only", [
    (b"NATS/1.0\r\nNats-Batch-Id: b\r\nNats-Batch-Sequence: 1\r\n\r\n", True),
    (b"NATS/1.0\r\nNats-Batch-Id: b\r\nNats-Batch-Commit: 1\r\nX: Nats-Msg-Id\r\n\r\n", True),
    (b"NATS/1.0\r\nNats-Batch-Id: b\r\nNats-Msg-Id: 1\r\n\r\n", False),
    (b"NATS/1.0\r\nNats-Expected-Last-Sequence: 3\r\nNats-Batch-Id: b\r\n\r\n", False),
    (b"NATS/1.0\r\nNats-Batch-Id: b\r\nNats-TTL: 1s\r\n\r\n", False),
    (b"NATS/1.0\r\nNats-Incr: 1\r\nNats-Batch-Id: b\r\n\r\n", False)])
def test_batch_messages_with_only_batch_headers_skip_the_other_checks(hdr, only):
    """Stream._process skips the per-message header checks for a message whose Nats-
    keys are all batch keys; any other Nats- key (which those checks read) keeps them."""
    from natsjs.jetstream import batching
    from natsjs.jetstream import headers as H
    assert H.nats_keys_all_of(hdr, batching.BATCH_KEYS) is only
