"""Distributed counters (``allow_msg_counter``, ``Nats-Incr``), natsjs against nats-server.

Each scenario sends the same requests to a fresh natsjs and a fresh nats-server (the
reference binary) through tests/jsdiff.py and compares the normalized transcripts:
configurations refused and accepted, increments and their PubAcks (``"val"``), the
stored ``{"val":"<total>"}`` with its headers, every refusal (missing, invalid or
disabled increment, a payload, headers an increment cannot come with), and a counter
stream sourcing two others (``Nats-Counter-Sources``).

The replicated test runs an R3 counter stream on three natsjs servers, increments it
from many clients at once, and then reads each server's own copy of the stream from its
disk: every replica must hold the same totals, equal to the sums of the increments.
"""
from __future__ import annotations

import asyncio
import base64
import glob
import json
import os
import re
import sys

import nats
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jsdiff  # noqa: E402
from jscluster import JSCluster, answers_on_both  # noqa: E402
from jsdiff import API, Scenario, add_stream, api, compare, registry, run_scenario  # noqa: E402

SCENARIOS: dict[str, Scenario] = {}
scenario = registry(SCENARIOS)


async def incr(s, subject: str, value: str, note: str | None = None, data=b"", **headers):
    return await s.request(subject, data, headers={"Nats-Incr": value, **headers}, note=note)


async def last(s, stream: str, subject: str, note: str | None = None):
    return await api(s, "STREAM.MSG.GET." + stream, {"last_by_subj": subject}, note=note)


# -- scenarios -----------------------------------------------------------------------------

@scenario
async def counter_config(s):
    """Which configurations a counter stream may have, and that the setting cannot
    change on update (either way)."""
    await add_stream(s, "C", subjects=["c.>"], allow_msg_counter=True, note="a counter stream")
    await api(s, "STREAM.INFO.C")
    await add_stream(s, "DN", subjects=["dn"], allow_msg_counter=True, discard="new",
                     note="discard new")
    await add_stream(s, "TTL", subjects=["ttl"], allow_msg_counter=True, allow_msg_ttl=True,
                     note="message TTLs")
    await add_stream(s, "SCH", subjects=["sch"], allow_msg_counter=True,
                     allow_msg_schedules=True, note="message schedules")
    await add_stream(s, "WQ", subjects=["wq"], allow_msg_counter=True, retention="workqueue",
                     note="work queue retention")
    await add_stream(s, "IN", subjects=["in"], allow_msg_counter=True, retention="interest",
                     note="interest retention")
    await add_stream(s, "MIR", mirror={"name": "C"}, allow_msg_counter=True,
                     note="a mirror")
    await add_stream(s, "SDM", subjects=["sdm"], allow_msg_counter=True,
                     subject_delete_marker_ttl=1_000_000_000, note="subject delete markers")
    await add_stream(s, "RU", subjects=["ru"], allow_msg_counter=True, allow_rollup_hdrs=True,
                     max_msgs_per_subject=1, storage="memory",
                     note="rollups, a per-subject limit, memory storage: allowed")
    await api(s, "STREAM.UPDATE.C", {"name": "C", "subjects": ["c.>"]},
              note="update turning counters off")
    await add_stream(s, "P", subjects=["p"])
    await api(s, "STREAM.UPDATE.P", {"name": "P", "subjects": ["p"], "allow_msg_counter": True},
              note="update turning counters on")
    await api(s, "STREAM.UPDATE.C", {"name": "C", "subjects": ["c.>", "d"],
                                     "allow_msg_counter": True},
              note="an update keeping counters on")


@scenario
async def counter_increments(s):
    """Increments of every shape a big integer has, on two subjects: the PubAck's val, the
    stored total and its headers (the Nats-Incr kept as sent)."""
    await add_stream(s, "C", subjects=["c.>"], allow_msg_counter=True, allow_direct=True)
    await incr(s, "c.a", "1", note="first")
    await incr(s, "c.a", "41")
    await incr(s, "c.a", "-50", note="below zero")
    await incr(s, "c.a", "+7", note="explicit plus sign")
    await incr(s, "c.a", "0007", note="leading zeros")
    await incr(s, "c.a", "-0")
    await incr(s, "c.a", "0", note="zero: still a message")
    await incr(s, "c.b", "123456789012345678901234567890123456789012345678901234567890",
               note="beyond 64 bits, another subject")
    await incr(s, "c.b", "-123456789012345678901234567890123456789012345678901234567891")
    await incr(s, "c.a", "5", note="with other headers", **{"X-Trace": "t1"})
    await last(s, "C", "c.a", note="the stored total, headers kept")
    await last(s, "C", "c.b")
    await api(s, "DIRECT.GET.C", {"last_by_subj": "c.a"}, note="direct get")
    await api(s, "STREAM.MSG.GET.C", {"seq": 1}, note="the first increment's message")
    await api(s, "STREAM.INFO.C")


@scenario
async def counter_refusals(s):
    """What a counter stream and a plain stream refuse, and what they answer."""
    await add_stream(s, "C", subjects=["c.>"], allow_msg_counter=True,
                     allow_rollup_hdrs=True)
    await add_stream(s, "P", subjects=["p.>"])
    await incr(s, "c.a", "10")
    await s.request("c.a", b"", note="no Nats-Incr, no headers")
    await s.request("c.a", b"x", note="a payload without Nats-Incr")
    await s.request("c.a", b"", headers={"X-Other": "1"}, note="headers but no Nats-Incr")
    await incr(s, "c.a", "", note="an empty Nats-Incr is none")
    await incr(s, "c.a", "1", data=b"payload", note="an increment with a payload")
    for bad in ["abc", "1.5", "1e3", "0x10", "1_000", "--1", "+", "-", "5 ", "１"]:
        await incr(s, "c.a", bad, note="invalid %r" % bad)
    for hdr, val in [("Nats-Rollup", "sub"), ("Nats-Expected-Stream", "C"),
                     ("Nats-Expected-Last-Sequence", "1"),
                     ("Nats-Expected-Last-Subject-Sequence", "1"),
                     ("Nats-Expected-Last-Msg-Id", "x"),
                     ("Nats-Expected-Last-Subject-Sequence-Subject", "c.a")]:
        await incr(s, "c.a", "1", note="with " + hdr, **{hdr: val})
    await incr(s, "c.a", "1", note="an empty Nats-Rollup is none", **{"Nats-Rollup": ""})
    await incr(s, "c.a", "1", note="a TTL on a stream without TTLs", **{"Nats-TTL": "1h"})
    await incr(s, "c.a", "2", note="with a message id", **{"Nats-Msg-Id": "m1"})
    await incr(s, "c.a", "2", note="the same id again: a duplicate", **{"Nats-Msg-Id": "m1"})
    await s.request("c.a", b"", headers={"Nats-Expected-Stream": "X"},
                    note="no increment, wrong expected stream")
    await s.request("c.a", b"", headers={"Nats-Msg-Id": "m1"},
                    note="no increment, a duplicate id")
    await incr(s, "p.a", "1", note="an increment on a plain stream")
    await incr(s, "p.a", "x", note="an invalid increment on a plain stream")
    await s.request("p.a", b"plain", note="a plain message on a plain stream")
    await last(s, "C", "c.a", note="only the accepted increments counted")
    await api(s, "STREAM.INFO.C")
    await add_stream(s, "R", subjects=["r"], allow_rollup_hdrs=True)
    for val in ["", "SUB", "All", "nope"]:
        await s.request("r", b"x", headers={"Nats-Rollup": val},
                        note="a rollup %r on a plain stream (empty: none; case ignored)" % val)


@scenario
async def counter_edges(s):
    """A client's own Nats-Counter-Sources is stored as sent (and an undecodable one breaks
    the counter), leading spaces of the value, a size limit the total outgrows."""
    await add_stream(s, "C", subjects=["c.>"], allow_msg_counter=True)
    await incr(s, "c.a", "  5", note="leading spaces are not part of the value")
    await incr(s, "c.a", "1", note="a client's sources header",
               **{"Nats-Counter-Sources": '{"X":{"x":"9"}}'})
    await last(s, "C", "c.a")
    await incr(s, "c.a", "1", note="the sources are carried on")
    await last(s, "C", "c.a")
    await incr(s, "c.b", "1", **{"Nats-Counter-Sources": "not json"})
    await incr(s, "c.b", "1", note="the last message's sources do not decode: broken")
    await incr(s, "c.c", "1", **{"Nats-Counter-Sources": "null"})
    await incr(s, "c.c", "1", note="null sources are none")
    await add_stream(s, "S", subjects=["s"], allow_msg_counter=True, max_msg_size=40)
    await incr(s, "s", "1")
    await incr(s, "s", "1" + "0" * 40, note="the total no longer fits")
    await last(s, "S", "s")


@scenario
async def counter_after_removals(s):
    """The total continues from the subject's last stored message: after deleting it,
    from the one before; after a purge of the subject, from zero; a limit of one message
    per subject keeps just the total."""
    await add_stream(s, "C", subjects=["c.>"], allow_msg_counter=True)
    await add_stream(s, "K", subjects=["k"], allow_msg_counter=True, max_msgs_per_subject=1)
    await incr(s, "c.a", "1")
    await incr(s, "c.a", "10")
    await incr(s, "c.a", "100")
    await api(s, "STREAM.MSG.DELETE.C", {"seq": 3}, note="delete the last total")
    await incr(s, "c.a", "1000", note="continues from 11")
    await api(s, "STREAM.PURGE.C", {"filter": "c.a"})
    await incr(s, "c.a", "5", note="after a purge: from zero")
    await incr(s, "c.b", "5", note="another subject")
    for v in ["3", "4", "-10"]:
        await incr(s, "k", v)
    await api(s, "STREAM.INFO.K", note="one message")
    await last(s, "K", "k")


@scenario
async def counter_published_without_ack_wait(s):
    """Many increments sent without waiting, then one that waits: the totals are exact."""
    await add_stream(s, "C", subjects=["c.>"], allow_msg_counter=True)
    for i in range(200):
        await s.nc.publish("c.%d" % (i % 3), b"", headers={"Nats-Incr": str(i)})
    await incr(s, "c.0", "0", note="after 200 increments: 0+3+..+198")
    await last(s, "C", "c.1")
    await last(s, "C", "c.2")


async def _poll_last(s, stream: str, subject: str, want: str, note: str):
    def done(r):
        return (r.json or {}).get("message", {}).get("data") == want
    return await s.poll(API + "STREAM.MSG.GET." + stream, {"last_by_subj": subject},
                        until=done, note=note)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@scenario
async def counter_sources_aggregate(s):
    """A counter stream sourcing two counter streams (both into one subject) adds up their
    totals, keeps each origin's last total in Nats-Counter-Sources and rewrites Nats-Incr
    to the difference; a direct increment of the aggregate adds on top; a plain stream
    sourcing a counter stream stores its messages as they are."""
    await add_stream(s, "A", subjects=["a.>"], allow_msg_counter=True)
    await add_stream(s, "B", subjects=["b.>"], allow_msg_counter=True)
    await add_stream(s, "AGG", subjects=["agg.>"], allow_msg_counter=True, sources=[
        {"name": "A", "subject_transforms": [{"src": "a.>", "dest": "agg.>"}]},
        {"name": "B", "subject_transforms": [{"src": "b.>", "dest": "agg.>"}]}])
    await add_stream(s, "PLAIN", subjects=["plain.>"], sources=[{"name": "A"}])
    await incr(s, "a.x", "5")
    await _poll_last(s, "AGG", "agg.x", _b64('{"val":"5"}'), "A's total")
    await incr(s, "b.x", "7")
    await _poll_last(s, "AGG", "agg.x", _b64('{"val":"12"}'), "plus B's")
    await incr(s, "a.x", "-2")
    await _poll_last(s, "AGG", "agg.x", _b64('{"val":"10"}'), "A went down by 2")
    await incr(s, "agg.x", "100", note="a direct increment of the aggregate")
    await incr(s, "b.x", "1")
    await _poll_last(s, "AGG", "agg.x", _b64('{"val":"111"}'), "B's next total")
    await incr(s, "a.y", "3")
    await _poll_last(s, "AGG", "agg.y", _b64('{"val":"3"}'), "another subject")
    await _poll_last(s, "PLAIN", "a.x", _b64('{"val":"3"}'), "the plain copy of A")
    await api(s, "STREAM.MSG.GET.PLAIN", {"seq": 1}, note="stored verbatim")


@scenario
async def counter_aggregate_of_aggregates(s):
    """An aggregate sourced by another aggregate: the origin's Nats-Counter-Sources comes
    along and is replaced by the outer one's."""
    await add_stream(s, "A", subjects=["a.>"], allow_msg_counter=True)
    await add_stream(s, "MID", subjects=["mid.>"], allow_msg_counter=True, sources=[
        {"name": "A", "subject_transforms": [{"src": "a.>", "dest": "mid.>"}]}])
    await add_stream(s, "TOP", subjects=["top.>"], allow_msg_counter=True, sources=[
        {"name": "MID", "subject_transforms": [{"src": "mid.>", "dest": "top.>"}]}])
    await incr(s, "a.x", "4")
    await _poll_last(s, "MID", "mid.x", _b64('{"val":"4"}'), "the middle")
    await _poll_last(s, "TOP", "top.x", _b64('{"val":"4"}'), "the top")
    await incr(s, "mid.x", "6")
    await incr(s, "a.x", "1")
    await _poll_last(s, "TOP", "top.x", _b64('{"val":"11"}'), "the top again")


# -- the tests -----------------------------------------------------------------------------

_SOURCE_IDENT = re.compile(r"(Nats-Stream-Source: (?:\S+ ){4}\S+) \S+\r\n")


def readable_headers(obj):
    """Stored messages' ``hdrs`` (base64) as text, with the random identity that ends a
    Nats-Stream-Source header (the origin stream's, made when it was created) left out;
    a stream's ``sources`` by name (nats-server answers a create with them in any order)."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k == "hdrs" and isinstance(v, str):
                text = base64.b64decode(v).decode("utf-8", "replace")
                v = _SOURCE_IDENT.sub(r"\1 <ident>\r\n", text)
            elif k == "sources" and isinstance(v, list):
                v = sorted(v, key=lambda src: json.dumps(src, sort_keys=True))
            out[k] = readable_headers(v)
        return out
    if isinstance(obj, list):
        return [readable_headers(v) for v in obj]
    return obj


def assert_matches_reference(sc: Scenario) -> None:
    """The scenario's transcripts from nats-server and from natsjs agree."""
    expected = readable_headers(run_scenario(sc, "reference"))
    actual = readable_headers(run_scenario(sc, "natsjs"))
    assert any(step.get("reply") for step in expected["steps"])
    diffs = compare(jsdiff.checked(expected), jsdiff.checked(actual))
    assert not diffs, "%d differences (reference != natsjs):\n%s" % (len(diffs),
                                                                    "\n".join(diffs[:60]))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_natsjs_matches_reference(name):
    assert_matches_reference(SCENARIOS[name])


def _replica_totals(cluster: JSCluster, i: int, stream: str, subjects) -> dict:
    """Server ``i``'s own copy of the stream, read from its disk (the server stopped)."""
    from natsjs._core.filelog import FileLog
    found = glob.glob(os.path.join(cluster.dir, "n%d" % (i + 1), "**", stream, "msgs"),
                      recursive=True)
    assert len(found) == 1, found
    log = FileLog(found[0])
    try:
        out = {}
        for subj in subjects:
            rec = log.load_last(subj.encode())
            out[subj] = (rec[0], json.loads(rec[3])["val"]) if rec else None
        return out
    finally:
        log.close()


async def _create(nc, **cfg):
    """A stream create, asked again while unanswered: a cluster that just elected its meta
    leader (nats-server's too) may drop the first one."""
    for _ in range(5):
        try:
            msg = await nc.request(API + "STREAM.CREATE." + cfg["name"],
                                   json.dumps(cfg).encode(), timeout=10)
        except nats.errors.TimeoutError:
            continue
        reply = json.loads(msg.data)
        assert "error" not in reply, reply
        return reply
    raise TimeoutError("stream create never answered")


def test_r3_counter_totals_agree_on_every_replica(tmp_path):
    """Concurrent increments of an R3 counter stream: every PubAck's val is the running
    total in sequence order, the last one the exact sum; an R3 aggregate sourcing it
    reaches the same sums; each replica's own store ends with the same totals."""
    subjects = ["cnt.%d" % k for k in range(4)]
    aggregated = ["agg.%d" % k for k in range(4)]
    big = 10 ** 30

    def value(i):
        return big + i if i % 2 else -i

    async def main(cluster):
        nc = await nats.connect([cluster.url(j) for j in range(3)])
        js = nc.jetstream(timeout=10)
        await _create(nc, name="CNT", subjects=["cnt.>"], num_replicas=3,
                      allow_msg_counter=True)
        await _create(nc, name="AGG", subjects=["agg.>"], num_replicas=3,
                      allow_msg_counter=True, sources=[{
                          "name": "CNT",
                          "subject_transforms": [{"src": "cnt.>", "dest": "agg.>"}]}])

        async def one(i):
            msg = await nc.request(subjects[i % 4], b"", headers={"Nats-Incr": str(value(i))},
                                   timeout=10)
            return i, json.loads(msg.data)
        acks = await asyncio.gather(*(one(i) for i in range(400)))
        want = {subj: 0 for subj in subjects}
        for i in range(400):
            want[subjects[i % 4]] += value(i)
        by_subject: dict = {subj: [] for subj in subjects}
        for i, ack in acks:
            assert "error" not in ack, ack
            by_subject[subjects[i % 4]].append((ack["seq"], int(ack["val"]), value(i)))
        for subj, seen in by_subject.items():
            seen.sort()
            total = 0
            for _, val, inc in seen:
                total += inc
                assert val == total
            assert total == want[subj]
        # a missing increment is refused alike in a cluster
        msg = await nc.request("cnt.0", b"", timeout=10)
        assert json.loads(msg.data)["error"]["err_code"] == 10169

        async def aggregated_all():
            for subj, agg in zip(subjects, aggregated):
                try:
                    m = await js.get_last_msg("AGG", agg)
                except nats.js.errors.NotFoundError:
                    return False
                if json.loads(m.data)["val"] != str(want[subj]):
                    return False
            return True
        deadline = asyncio.get_running_loop().time() + 30
        while not await aggregated_all():
            assert asyncio.get_running_loop().time() < deadline, "AGG never caught up"
            await asyncio.sleep(0.1)    # polling the aggregate, not a synchronisation
        await nc.close()
        return {subj: (seen[-1][0], str(want[subj])) for subj, seen in by_subject.items()}

    cluster = JSCluster(tmp_path, 3).start()
    try:
        expected = asyncio.run(asyncio.wait_for(main(cluster), 120))
    finally:
        cluster.close()
    aggs = []
    for i in range(3):
        assert _replica_totals(cluster, i, "CNT", subjects) == expected, "replica %d" % i
        aggs.append(_replica_totals(cluster, i, "AGG", aggregated))
        assert [v for _, v in aggs[-1].values()] == [v for _, v in expected.values()]
    assert aggs[0] == aggs[1] == aggs[2]


# What an R3 counter stream answers, the same requests to three natsjs servers and to
# three nats-servers: (subject, Nats-Incr or None, other headers, payload).
R3_REQUESTS = [
    ("cnt.a", "5", {}, b""),
    ("cnt.a", "-7", {}, b""),
    ("cnt.a", "123456789012345678901234567890", {}, b""),
    ("cnt.b", "+1", {"X-Other": "v"}, b""),
    ("cnt.a", None, {}, b""),
    ("cnt.a", None, {"X-Other": "v"}, b"body"),
    ("cnt.a", "1", {}, b"body"),
    ("cnt.a", "1.5", {}, b""),
    ("cnt.a", "1", {"Nats-Expected-Last-Sequence": "3"}, b""),
    ("cnt.a", "1", {"Nats-Rollup": "sub"}, b""),
    ("cnt.a", "1", {"Nats-Msg-Id": "one"}, b""),
    ("cnt.a", "1", {"Nats-Msg-Id": "one"}, b""),
    ("cnt.a", "1", {"Nats-TTL": "5s"}, b""),
    ("cnt.a", None, {"Nats-Expected-Last-Sequence": "99"}, b""),
    ("cnt.a", None, {"Nats-Msg-Id": "one"}, b""),
    ("cnt.a", None, {"Nats-Expected-Stream": "OTHER"}, b""),
    ("cnt.a", None, {"Nats-Expected-Last-Subject-Sequence": "99"}, b""),
    ("cnt.a", None, {"Nats-Expected-Last-Msg-Id": "nope"}, b""),
    ("cnt.a", None, {"Nats-Rollup": "all"}, b""),
    ("cnt.a", None, {"Nats-TTL": "5s"}, b""),
    ("plain.a", "1", {}, b""),
    ("plain.a", "x", {}, b""),
    ("plain.a", None, {}, b"ok"),
]


async def _r3_answers(cluster: JSCluster) -> list:
    nc = await nats.connect([cluster.url(j) for j in range(3)])
    js = nc.jetstream(timeout=10)
    await _create(nc, name="CNT", subjects=["cnt.>"], num_replicas=3, allow_msg_counter=True)
    await _create(nc, name="PLAIN", subjects=["plain.>"], num_replicas=3)
    out = []
    for subject, value, headers, data in R3_REQUESTS:
        hdrs = dict(headers)
        if value is not None:
            hdrs["Nats-Incr"] = value
        msg = await nc.request(subject, data, headers=hdrs or None, timeout=10)
        out.append(json.loads(msg.data))
    for subject in ("cnt.a", "cnt.b"):
        m = await js.get_last_msg("CNT", subject)
        out.append({"seq": m.seq, "data": m.data.decode(), "headers": dict(m.headers or {})})
    await nc.close()
    return out


def test_r3_counter_answers_match_reference(tmp_path):
    answers = answers_on_both(tmp_path, _r3_answers)
    assert sum("val" in a for a in answers["natsjs"]) >= 5
    diffs = compare(answers["reference"], answers["natsjs"])
    assert not diffs, "\n".join(diffs)


@pytest.mark.parametrize("hdr", [
    b"NATS/1.0\r\nNats-Incr: +1\r\n\r\n", b"NATS/1.0\r\nNats-Incr:-25\r\n\r\n",
    b"NATS/1.0\r\nNats-Incr:   12345678901234567890123\r\n\r\n",
    b"NATS/1.0\r\nNats-Incr: 1_0\r\n\r\n", b"NATS/1.0\r\nNats-Incr: +\r\n\r\n",
    b"NATS/1.0\r\nNats-Incr: \r\n\r\n", b"NATS/1.0\r\nNats-Incr: 1 \r\n\r\n",
    b"NATS/1.0\r\nNats-Incr: \xd9\xa1\r\n\r\n", b"NATS/1.0\r\nNats-Incr: 1\r\nX: y\r\n\r\n",
    b"NATS/1.0\r\nNats-Incr: 1\r\nNats-Expected-Last-Sequence: 3\r\n\r\n",
    b"NATS/1.0\r\nX: y\r\nNats-Incr: 1\r\n\r\n", b"NATS/1.0 100\r\nNats-Incr: 1\r\n\r\n",
    b"NATS/1.0\r\nnats-incr: 1\r\n\r\n", b"NATS/1.0\r\nNats-Incr: 1\r\n"])
def test_the_increment_only_shortcut_agrees_with_the_full_check(hdr):
    """stream.py skips every other header check for a block holding just one valid
    Nats-Incr line (counters.only_incr); anything else must fall to the full checks,
    and where the shortcut answers it answers as they do."""
    from natsjs.jetstream import counters
    cfg = {"allow_msg_counter": True}
    fast = counters.only_incr(hdr)
    full = counters.check_incr(cfg, hdr, b"", False)
    lines = hdr.split(b"\r\n")
    single = hdr.startswith(b"NATS/1.0\r\n") and hdr.endswith(b"\r\n\r\n") and len(lines) == 4
    if fast is not None:
        assert single and fast == full
    else:
        assert not single or not isinstance(full, int)
