"""Mirrors and sources (natsjs/jetstream/sourcing.py), on natsjs and on the reference.

The same scenarios run against both servers: a mirror keeps its origin's sequence
numbers (gaps included), sources tag what they take with ``Nats-Stream-Source``,
filters and transforms apply, stream info reports each mirror and source, the
consumers behind them are invisible to the origin's listings and limits, both resume
where they stopped after a restart, an origin created later is picked up, and an
origin in another account is reached through ``external``.
"""
from __future__ import annotations

import json
import re
from functools import partial

import nats
import pytest

from conftest import start_natsjs, start_reference
from test_jetstream import TIMEOUT, connect, js_server, run  # noqa: F401  (fixture)
import helpers

until = partial(helpers.until, timeout=40.0)

SOURCE_HDR = re.compile(r"^(\S+) (\d+) (\S+) (\S+) (\S+) ([0-9A-Za-z]{8})$")


async def api(nc, subject: str, body=None) -> dict:
    data = b"" if body is None else json.dumps(body).encode()
    return json.loads((await nc.request(subject, data, timeout=TIMEOUT)).data)


async def info(nc, name: str) -> dict:
    return await api(nc, "$JS.API.STREAM.INFO." + name)


async def wait_state(nc, name: str, **want) -> dict:
    """The stream's state once it shows ``want`` and its last message can be read (state
    counts a message as soon as it is stored, reads wait until it is durable)."""
    async def check():
        st = (await info(nc, name))["state"]
        if not all(st.get(k) == v for k, v in want.items()):
            return None
        if st["messages"]:
            r = await api(nc, "$JS.API.STREAM.MSG.GET." + name,
                          {"last_by_subj": ">"})
            if "error" in r:
                return None
        return st
    return await until(check, what="%s state %r" % (name, want))


def test_mirror_keeps_sequences_and_gaps(js_server):
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.O", {"name": "O", "subjects": ["o.>"]})
        for i in range(5):
            await js.publish("o.%d" % i, b"m%d" % i, headers={"Nats-Msg-Id": "id%d" % i})
        await js.delete_msg("O", 3)
        r = await api(nc, "$JS.API.STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"}})
        assert r["mirror"] == {"name": "O", "lag": 0, "active": -1}
        st = await wait_state(nc, "M", last_seq=5)
        assert (st["messages"], st["first_seq"], st.get("num_deleted")) == (4, 1, 1)
        for seq in (1, 2, 4, 5):
            orig, copy = await js.get_msg("O", seq), await js.get_msg("M", seq)
            assert (copy.subject, copy.data, copy.headers) == \
                (orig.subject, orig.data, orig.headers)
        assert (await js.get_msg("M", 1)).headers == {"Nats-Msg-Id": "id0"}
        # It follows what comes later, keeping the origin's sequences.
        await js.publish("o.9", b"late")
        await wait_state(nc, "M", last_seq=6, messages=5)
        i = await info(nc, "M")
        assert set(i["mirror"]) == {"name", "lag", "active"}
        assert i["mirror"]["lag"] == 0 and 0 <= i["mirror"]["active"] < 5e9
        # Its consumer on the origin is nobody's business.
        assert (await api(nc, "$JS.API.CONSUMER.NAMES.O", {}))["consumers"] == []
        assert (await info(nc, "O"))["state"]["consumer_count"] == 0
        # A mirror takes no publishes of its own.
        with pytest.raises(Exception):
            await js.publish("M", b"x", timeout=0.5)
        await nc.close()
    run(main())


def test_sources_tag_filter_and_transform(js_server):
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.O", {"name": "O", "subjects": ["o.>"]})
        await api(nc, "$JS.API.STREAM.CREATE.P", {"name": "P", "subjects": ["p.>"]})
        for i in range(3):
            await js.publish("o.%d" % i, b"o%d" % i, headers={"Nats-Expected-Stream": "O"})
        await js.publish("p.1", b"p1", headers={"Nats-Msg-Id": "dup"})
        await js.publish("p.2", b"p2")
        srcs = [{"name": "O", "filter_subject": "o.1"},
                {"name": "O", "subject_transforms": [{"src": "o.2", "dest": "t.2"}]},
                {"name": "P"}]
        await api(nc, "$JS.API.STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"],
                                                  "sources": srcs, "duplicate_window": 120_000_000_000})
        await js.publish("s.own", b"own", headers={"Nats-Msg-Id": "dup"})
        st = await wait_state(nc, "S", messages=4)
        got = {}
        for seq in range(1, st["last_seq"] + 1):
            m = await js.get_msg("S", seq)
            got[m.subject] = m
        assert sorted(got) == ["o.1", "p.2", "s.own", "t.2"]
        # p.1 carried the same Nats-Msg-Id as s.own: sourced messages are deduplicated
        # like any other.
        hdr = SOURCE_HDR.match(got["o.1"].headers["Nats-Stream-Source"])
        assert hdr.groups()[:5] == ("O", "2", "o.1", ">", "o.1")
        assert "Nats-Expected-Stream" not in got["o.1"].headers
        hdr = SOURCE_HDR.match(got["t.2"].headers["Nats-Stream-Source"])
        assert hdr.groups()[:5] == ("O", "3", "o.2", "t.2", "o.2")
        hdr = SOURCE_HDR.match(got["p.2"].headers["Nats-Stream-Source"])
        assert hdr.groups()[:5] == ("P", "2", ">", ">", "p.2")
        # (nats-server lists sources in no particular order.)
        by_key = {(s["name"], s.get("filter_subject"), json.dumps(s.get("subject_transforms"))):
                  s for s in (await info(nc, "S"))["sources"]}
        o1 = by_key[("O", "o.1", "null")]
        assert o1["seq"] == 2 and o1["lag"] == 0 and "error" not in o1
        o2 = by_key[("O", None, json.dumps([{"src": "o.2", "dest": "t.2"}]))]
        assert o2["seq"] == 3
        assert by_key[("P", None, "null")]["seq"] == 2
        # Clients may not forge the header.
        with pytest.raises(nats.js.errors.APIError) as e:
            await js.publish("s.x", b"x", headers={"Nats-Stream-Source": "P 1 > > p.1"})
        assert e.value.err_code == 10227
        await nc.close()
    run(main())


def test_missing_origin_reports_error_then_is_picked_up(js_server):
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.S", {"name": "S", "subjects": ["s"],
                                                  "sources": [{"name": "LATER"}]})

        async def errored():
            src = (await info(nc, "S"))["sources"][0]
            return src.get("error")
        err = await until(errored, what="source error")
        assert err == {"code": 404, "err_code": 10059, "description": "stream not found"}
        await api(nc, "$JS.API.STREAM.CREATE.LATER", {"name": "LATER", "subjects": ["later"]})
        await js.publish("later", b"hello")
        # nats-server retries after its backoff (10 s after one failure); natsjs
        # notices the new stream at once.
        await until(lambda: _messages(nc, "S", 1), timeout=40, what="sourced message")
        src = (await info(nc, "S"))["sources"][0]
        assert "error" not in src
        await nc.close()
    run(main())


async def _messages(nc, name, n):
    return (await info(nc, name))["state"]["messages"] >= n


def test_mirror_filter_and_transforms(js_server):
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.O", {"name": "O", "subjects": ["o.*.*"]})
        for subj in ("o.a.1", "o.b.2", "o.a.3", "o.c.4"):
            await js.publish(subj, subj.encode())
        await api(nc, "$JS.API.STREAM.CREATE.MF", {"name": "MF", "mirror": {
            "name": "O", "filter_subject": "o.a.*"}})
        await api(nc, "$JS.API.STREAM.CREATE.MT", {"name": "MT", "mirror": {
            "name": "O", "subject_transforms": [{"src": "o.a.*", "dest": "a.$1"},
                                                {"src": "o.b.*", "dest": "b.{{wildcard(1)}}"}]}})
        st = await wait_state(nc, "MF", messages=2)
        assert (st["first_seq"], st["last_seq"]) == (1, 3)
        st = await wait_state(nc, "MT", messages=3)
        assert [(await js.get_msg("MT", q)).subject for q in (1, 2, 3)] == ["a.1", "b.2", "a.3"]
        m = (await info(nc, "MT"))["mirror"]
        assert m["subject_transforms"] == [{"src": "o.a.*", "dest": "a.$1"},
                                           {"src": "o.b.*", "dest": "b.{{wildcard(1)}}"}]
        assert (await info(nc, "MF"))["mirror"]["filter_subject"] == "o.a.*"
        await nc.close()
    run(main())


def test_source_of_recreated_origin_starts_over(js_server):
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.O", {"name": "O", "subjects": ["o"]})
        await api(nc, "$JS.API.STREAM.CREATE.S", {"name": "S", "subjects": ["s"],
                                                  "sources": [{"name": "O"}]})
        for i in range(3):
            await js.publish("o", b"old%d" % i)
        await wait_state(nc, "S", messages=3)
        await js.delete_stream("O")
        await api(nc, "$JS.API.STREAM.CREATE.O", {"name": "O", "subjects": ["o"]})
        await js.publish("o", b"new")
        # The new O's first message has sequence 1, below what S took from the old O:
        # the changed stream identity makes the source start over (nats-server finds
        # out when the old consumer falls silent; natsjs when the stream is created).
        st = await wait_state(nc, "S", messages=4)
        m = await js.get_msg("S", st["last_seq"])
        assert m.data == b"new"
        assert m.headers["Nats-Stream-Source"].split(" ")[1] == "1"
        await nc.close()
    run(main())


def test_start_options_and_consumer_limits(js_server):
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.O", {"name": "O", "subjects": ["o"],
                                                  "max_consumers": 1})
        for i in range(6):
            await js.publish("o", b"%d" % i)
        await api(nc, "$JS.API.STREAM.CREATE.M", {"name": "M",
                                                  "mirror": {"name": "O", "opt_start_seq": 4}})
        await api(nc, "$JS.API.STREAM.CREATE.S", {"name": "S", "subjects": ["s"],
                                                  "sources": [{"name": "O",
                                                               "opt_start_seq": 5}]})
        st = await wait_state(nc, "M", last_seq=6, messages=3)
        assert st["first_seq"] == 4
        await wait_state(nc, "S", messages=2)
        assert (await js.get_msg("S", 1)).data == b"4"
        # By time: from the stored time of the fifth message on.
        t5 = (await api(nc, "$JS.API.STREAM.MSG.GET.O", {"seq": 5}))["message"]["time"]
        await api(nc, "$JS.API.STREAM.CREATE.MT", {"name": "MT", "mirror": {
            "name": "O", "opt_start_time": t5}})
        await api(nc, "$JS.API.STREAM.CREATE.ST", {"name": "ST", "subjects": ["st"],
                                                   "sources": [{"name": "O",
                                                                "opt_start_time": t5}]})
        st = await wait_state(nc, "MT", last_seq=6, messages=2)
        assert st["first_seq"] == 5
        await wait_state(nc, "ST", messages=2)
        assert (await js.get_msg("ST", 1)).data == b"4"
        # Two sourcing consumers exist on O, yet max_consumers 1 leaves room for one.
        await js.add_consumer("O", durable_name="mine")
        with pytest.raises(nats.js.errors.APIError) as e:
            await js.add_consumer("O", durable_name="another")
        assert e.value.err_code == 10026
        acc = await api(nc, "$JS.API.INFO")
        assert acc["consumers"] == 5       # the account still counts them all
        await nc.close()
    run(main())


def test_mirror_direct_answers_for_the_origin(js_server):
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.O", {"name": "O", "subjects": ["o.*"],
                                                  "allow_direct": True})
        await js.publish("o.a", b"A")
        r = await api(nc, "$JS.API.STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"}})
        assert r["config"]["mirror_direct"] is True
        await wait_state(nc, "M", messages=1)
        # With the origin gone, the mirror still answers direct gets for it.
        await js.delete_stream("O")
        r = await nc.request("$JS.API.DIRECT.GET.O.o.a", b"", timeout=TIMEOUT)
        assert r.data == b"A" and r.headers["Nats-Stream"] == "M"
        await nc.close()
    run(main())


@pytest.mark.parametrize("retention", ["interest", "workqueue"])
def test_source_of_interest_stream_acknowledges_what_it_took(js_server, retention):
    """On an interest or work queue origin the source's consumer is a durable that the
    flow control replies acknowledge: the origin keeps messages until they are taken."""
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.W", {"name": "W", "subjects": ["w"],
                                                  "retention": retention})
        await api(nc, "$JS.API.STREAM.CREATE.S", {"name": "S", "subjects": ["s"],
                                                  "sources": [{"name": "W"}]})

        async def bound():
            names = (await api(nc, "$JS.API.CONSUMER.NAMES.W", {}))["consumers"] or []
            return names
        names = await until(bound, what="sourcing consumer on W")
        assert len(names) == 1 and names[0].startswith("JS_SRC_")
        ci = await api(nc, "$JS.API.CONSUMER.INFO.W." + names[0])
        assert ci["config"]["ack_policy"] == "flow_control"
        assert ci["config"]["durable_name"] == names[0]
        for i in range(3):
            await js.publish("w", b"%d" % i)
        await wait_state(nc, "S", messages=3)
        # Acknowledged through flow control (sent with the next heartbeat at the latest).
        await wait_state(nc, "W", messages=0)
        await nc.close()
    run(main())


def _restart(server, start):
    server.stop()
    return start(*server.args[4:])


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_restart_resumes_mirror_and_sources(tmp_path, kind):
    start = start_natsjs if kind == "natsjs" else start_reference
    s = start("-js", "-sd", str(tmp_path / "js"))
    try:
        async def first():
            nc, js = await connect(s)
            await api(nc, "$JS.API.STREAM.CREATE.O", {"name": "O", "subjects": ["o.*"]})
            await api(nc, "$JS.API.STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"}})
            await api(nc, "$JS.API.STREAM.CREATE.S", {
                "name": "S", "subjects": ["s"],
                "sources": [{"name": "O", "filter_subject": "o.a"},
                            {"name": "O", "filter_subject": "o.b"}]})
            for subj in ("o.a", "o.b", "o.a"):
                await js.publish(subj, subj.encode())
            await wait_state(nc, "M", last_seq=3)
            await wait_state(nc, "S", messages=3)
            await nc.close()
        run(first())
        s = _restart(s, start)

        async def second():
            nc, js = await connect(s)
            for subj in ("o.b", "o.a"):
                await js.publish(subj, subj.encode())
            await wait_state(nc, "M", last_seq=5, messages=5)
            st = await wait_state(nc, "S", messages=5)
            assert st["last_seq"] == 5        # nothing taken twice
            seqs = []
            for seq in range(1, 6):
                m = await js.get_msg("S", seq)
                seqs.append(int(m.headers["Nats-Stream-Source"].split(" ")[1]))
            assert sorted(seqs) == [1, 2, 3, 4, 5]
            await nc.close()
        run(second())
    finally:
        s.stop()


def test_source_added_again_resumes_after_its_last_message(js_server):
    """A source removed and added back starts after the newest message it left in the
    stream (its Nats-Stream-Source header), as after a restart."""
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.O", {"name": "O", "subjects": ["o.*"]})
        src = {"name": "O", "filter_subject": "o.a"}
        cfg = {"name": "S", "subjects": ["s"], "sources": [src]}
        await api(nc, "$JS.API.STREAM.CREATE.S", cfg)
        for subj in ("o.a", "o.b", "o.a"):
            await js.publish(subj, subj.encode())
        await wait_state(nc, "S", messages=2)
        r = await api(nc, "$JS.API.STREAM.UPDATE.S", dict(cfg, sources=[]))
        assert "sources" not in r
        await js.publish("o.a", b"while away")
        await js.publish("s", b"own")
        await api(nc, "$JS.API.STREAM.UPDATE.S", cfg)
        st = await wait_state(nc, "S", messages=4)
        m = await js.get_msg("S", st["last_seq"])
        assert m.data == b"while away"
        assert m.headers["Nats-Stream-Source"].split(" ")[:2] == ["O", "4"]
        await js.publish("o.a", b"after")
        await wait_state(nc, "S", messages=5)
        await nc.close()
    run(main())


def test_starting_sequences_from_source_headers():
    """The newest message carrying each source's index name gives its position; old
    headers without one match by stream name."""
    from natsjs._core.filelog import MemLog
    from natsjs.jetstream.sourcing import SourceInfo, Sourcing, index_name

    log = MemLog()
    a = {"name": "A", "filter_subject": "x"}
    b = {"name": "B"}
    c = {"name": "C", "subject_transforms": [{"src": "c.*", "dest": "d.$1"}]}
    for subj, hdr in [(b"x", b"A 5 x > x HASHHASH"), (b"y", b"B 7 > > y"),
                      (b"z", None), (b"x", b"A 9 x > x HASHHASH"),
                      (b"d.1", b"$JS.ACK.C.cons.1.12.3.1700000000000000000.0")]:
        h = b"NATS/1.0\r\nNats-Stream-Source: " + hdr + b"\r\n\r\n" if hdr else None
        log.append(subj, h, b"", 1)

    class FakeStream:
        store = log
    sis = [SourceInfo(x, False) for x in (a, b, c)]
    Sourcing._starting_sequences(type("S", (), {"stream": FakeStream})(), sis)
    assert [(si.sseq, si.ident) for si in sis] == [(9, "HASHHASH"), (7, ""), (12, "")]
    assert index_name(c) == "C c.* d.$1"


def test_gap_detection_from_delivery_sequences():
    """server/stream.go processInbound{Mirror,Source}Msg: a mirror accepts a gap in the
    stream sequence when the delivery sequence has none (the origin lost messages);
    a gap in the delivery sequence means a lost delivery and a new consumer; a
    heartbeat reporting a delivery not seen does the same."""
    from natsjs.jetstream.sourcing import SourceInfo, Sourcing

    retried = []
    sg = Sourcing.__new__(Sourcing)
    sg.retry = lambda si, seq=0: retried.append(seq)
    m = SourceInfo({"name": "O"}, True)
    m.cname = "c"
    assert sg._track_mirror(m, 1, 1, "c") is True
    assert sg._track_mirror(m, 5, 2, "c") is True and (m.sseq, m.dseq) == (5, 2)
    assert sg._track_mirror(m, 5, 3, "c") is False and m.dseq == 3   # seen already
    assert sg._track_mirror(m, 9, 7, "c") is False and retried == [0]
    s = SourceInfo({"name": "O"}, False)
    s.cname = "c"
    assert sg._track_source(s, 3, 1, "c") is True and (s.sseq, s.dseq) == (3, 1)
    assert sg._track_source(s, 10, 2, "c") is True
    assert sg._track_source(s, 12, 5, "c") is False and retried == [0, 11]
    sg._control(s, None, b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 9\r\n\r\n")
    assert retried == [0, 11, 11]


EXTERNAL_CONF = """
jetstream {{ store_dir: "{sd}" }}
accounts {{
  A: {{
    jetstream: enabled
    users: [{{user: a, password: a}}]
    exports: [
      {{service: "$JS.API.>"}}
      {{service: "$JS.FC.>"}}
      {{stream: "deliver.B.>"}}
    ]
  }}
  B: {{
    jetstream: enabled
    users: [{{user: b, password: b}}]
    imports: [
      {{service: {{account: A, subject: "$JS.API.>"}}, to: "JS.A.API.>"}}
      {{service: {{account: A, subject: "$JS.FC.>"}}}}
      {{stream: {{account: A, subject: "deliver.B.>"}}}}
    ]
  }}
}}
"""


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_external_origin_in_another_account(tmp_path, kind):
    conf = tmp_path / "x.conf"
    conf.write_text(EXTERNAL_CONF.format(sd=tmp_path / "js"))
    start = start_natsjs if kind == "natsjs" else start_reference
    s = start("-c", str(conf))
    try:
        async def main():
            na = await nats.connect(s.url, user="a", password="a")
            nb = await nats.connect(s.url, user="b", password="b")
            ja = na.jetstream()
            await api(na, "$JS.API.STREAM.CREATE.ORIG", {"name": "ORIG", "subjects": ["e.>"]})
            for i in range(3):
                await ja.publish("e.%d" % i, b"%d" % i)
            ext = {"api": "JS.A.API", "deliver": "deliver.B"}
            await api(nb, "$JS.API.STREAM.CREATE.MB", {"name": "MB", "mirror": {
                "name": "ORIG", "external": ext}})
            await api(nb, "$JS.API.STREAM.CREATE.SB", {"name": "SB", "subjects": ["sb"],
                                                       "sources": [{"name": "ORIG",
                                                                    "external": ext}]})
            await wait_state(nb, "MB", last_seq=3, messages=3)
            await wait_state(nb, "SB", messages=3)
            i = await info(nb, "SB")
            assert i["sources"][0]["external"] == ext
            m = await nb.jetstream().get_msg("SB", 1)
            name = m.headers["Nats-Stream-Source"].split(" ")[0]
            assert re.fullmatch(r"ORIG:[0-9A-Za-z]{8}", name)
            await ja.publish("e.9", b"9")
            await wait_state(nb, "MB", last_seq=4)
            await na.close()
            await nb.close()
        run(main())
    finally:
        s.stop()
