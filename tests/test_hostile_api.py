"""JetStream API requests from an attacker: what used to forge messages into another
account or take servers down, and what nats-server answers instead (issue 19,
findings 1, 3 and 8; the class fix in natsjs/jetstream/names.py and the second wall in
natsjs/_core/fanout.pyx).

Each request is sent to natsjs and to the reference nats-server and the answers are
compared (error code and description, or success); then natsjs must still answer, and
must start again from its store.
"""
from __future__ import annotations

import json
import os

import nats
import pytest

from conftest import start_natsjs, start_reference
from hostile import ask, both, frames, outcome, raw_subscriber, read_until_pong, restarted, run
from jscluster import JSCluster

# The forging filter of the issue: once inside a protocol line, the bytes after the
# first CR/LF become an HMSG of account B's, an RMSG into account A and more.
FORGE = ("x 12 12\r\nNATS/1.0\r\n\r\n\r\nRMSG A victim.forged 20\r\n"
         "FORGED-BY-ACCOUNT-B!\r\nHMSG B y")




# ---- finding 1: CR/LF in the fields that reach protocol lines --------------------------

FORGING_CREATES = [
    ("$JS.API.STREAM.CREATE.S1", {"name": "S1", "subjects": ["s1"],
                                  "sources": [{"name": "ORIGIN", "filter_subject": FORGE}]}),
    ("$JS.API.STREAM.CREATE.S2", {"name": "S2", "subjects": ["s2"],
                                  "sources": [{"name": "ORIGIN", "external": {
                                      "api": "$JS.A\r\nPUB x 1\r\n.API", "deliver": "d"}}]}),
    ("$JS.API.STREAM.CREATE.S3", {"name": "S3", "subjects": ["s3"],
                                  "sources": [{"name": "ORIGIN", "external": {
                                      "api": "$JS.A.API", "deliver": "d\r\nPUB x 1\r\n"}}]}),
    ("$JS.API.STREAM.CREATE.S4", {"name": "S4", "mirror": {"name": "ORIGIN",
                                                           "filter_subject": FORGE}}),
    ("$JS.API.STREAM.CREATE.S5", {"name": "S5", "mirror": {"name": "ORIGIN", "external": {
        "api": "$JS.A.API", "deliver": "d e"}}}),
    ("$JS.API.STREAM.CREATE.S6", {"name": "S6", "subjects": ["s6"],
                                  "sources": [{"name": "ORIGIN", "filter_subject": "a..b"}]}),
    ("$JS.API.STREAM.CREATE.S7", {"name": "S7", "subjects": ["s7"], "sources": [
        {"name": "ORIGIN", "consumer": {"name": "c", "deliver_subject": "d\r\ne"}}]}),
]


def test_crlf_in_source_and_mirror_fields_is_refused_as_nats_server_refuses_it(tmp_path):
    got, expected, js = both(FORGING_CREATES, str(tmp_path / "s"))
    try:
        assert [outcome(a) for a in got] == [outcome(a) for a in expected]
        assert all("error" in a for a in got), got
        js = restarted(js)
        names = run(ask("nats://127.0.0.1:%d" % js.port, [("$JS.API.STREAM.NAMES", b"")]))
        assert names[0]["streams"] is None
    finally:
        js.stop()




ACCOUNTS = """
  A { jetstream: enabled, users = [ { user: a, pass: a } ] }
  B { jetstream: enabled, users = [ { user: b, pass: b } ] }
"""


def test_account_b_can_not_forge_into_account_a_across_the_cluster(tmp_path):
    """The issue's attack, on a three-server cluster: B's stream with the forging
    source filter is refused, and neither A's subscriber on another server nor B's own
    ``>`` subscriber sees a forged line."""
    with JSCluster(tmp_path, 3, accounts=ACCOUNTS).start() as cluster:
        victim = raw_subscriber(cluster.ports[1], "a")
        watcher = raw_subscriber(cluster.ports[0], "b")
        answers = run(ask(cluster.url(0), [
            ("$JS.API.STREAM.CREATE.EVIL", {"name": "EVIL", "subjects": ["evil"],
                                            "sources": [{"name": "ORIGIN",
                                                         "filter_subject": FORGE}]})],
            user="b"))
        assert outcome(answers[0])[:2] == (500, 10049), answers
        # A legitimate source in B goes through the same machinery end to end: its
        # consumer create is published and answered, so had the forging one been let
        # in, its bytes would have been written by now.
        ok = run(ask(cluster.url(0), [
            ("$JS.API.STREAM.CREATE.GOOD", {"name": "GOOD", "subjects": ["good"],
                                            "sources": [{"name": "ORIGIN",
                                                         "filter_subject": "o.x"}]}),
            ("$JS.API.STREAM.INFO.GOOD", b"")], user="b"))
        assert "error" not in ok[0], ok
        seen_a = read_until_pong(victim)
        assert b"FORGED" not in seen_a and b"victim.forged" not in seen_a
        # B sees its own requests (the forging text inside their payloads), each a
        # whole frame: nothing it sent became a line of its own.
        assert b"victim.forged" not in frames(read_until_pong(watcher))
        assert sorted(cluster.alive()) == [0, 1, 2]


def test_server_code_never_writes_a_line_breaking_subject():
    """The second wall: whatever a check upstream missed, the fan-out refuses to put
    CR, LF or a space into a MSG or RMSG line."""
    from natsjs._core.fanout import ClientCore, UnsafeSubject
    from natsjs._core.sublist import Sublist
    core = ClientCore(lambda *a: None, None, Sublist())
    for bad in (b"a\r\nMSG x 1 2", b"a b", b"a\tb", b"a\nb"):
        with pytest.raises(UnsafeSubject):
            core.publish(bad, None, -1, b"x")
        with pytest.raises(UnsafeSubject):
            core.publish(b"ok", bad, -1, b"x")
        with pytest.raises(UnsafeSubject):
            core.publish_deliver(b"ok", bad, None, -1, b"x")
    core.publish(b"fine.subject", b"_INBOX.x", -1, b"x")


# ---- finding 3: lone surrogates (and CR/LF) that used to crash the server for good ------

SURROGATES = [
    ("$JS.API.STREAM.CREATE.S1", b'{"name":"S1","subjects":["a\\udc80"]}'),
    ("$JS.API.STREAM.CREATE.S2", b'{"name":"S2","mirror":{"name":"M\\udc80"}}'),
    ("$JS.API.STREAM.CREATE.S3", b'{"name":"S3","subjects":["c"],'
                                 b'"sources":[{"name":"\\udc80x"}]}'),
    ("$JS.API.STREAM.CREATE.S4", {"name": "S4", "subjects": ["d.>"]}),
    ("$JS.API.CONSUMER.CREATE.S4", b'{"stream_name":"S4","config":{'
                                   b'"deliver_subject":"x\\udc80","deliver_group":"q\\udc80"}}'),
    ("$JS.API.CONSUMER.CREATE.S4", b'{"stream_name":"S4","config":{'
                                   b'"filter_subjects":["d.\\udc80"]}}'),
    ("$JS.API.CONSUMER.CREATE.S4", b'{"stream_name":"S4","config":{'
                                   b'"filter_subject":"d.\\ud800x"}}'),
    ("$JS.API.CONSUMER.CREATE.S4", b'{"stream_name":"S4","config":{'
                                   b'"deliver_subject":"y\\r\\nMSG z 1 1"}}'),
    ("$JS.API.CONSUMER.DURABLE.CREATE.S4.D1", b'{"stream_name":"S4","config":{'
                                              b'"durable_name":"D1","filter_subject":"d.\\udfff"}}'),
    ("$JS.API.STREAM.CREATE.S5", b'{"name":"S5","subjects":["e"],"sources":[{"name":"O",'
                                 b'"external":{"api":"$JS.X.API","deliver":"p\\r\\nq"}}]}'),
]


def test_lone_surrogates_are_read_as_go_reads_them_and_nothing_crashes(tmp_path):
    got, expected, js = both(SURROGATES, str(tmp_path / "s"))
    try:
        assert [outcome(a) for a in got] == [outcome(a) for a in expected]
        # Accepted where nats-server accepts them, each surrogate a U+FFFD.
        assert got[0]["config"]["subjects"] == ["a\ufffd"]
        assert got[4]["config"]["deliver_subject"] == "x\ufffd"
        js = restarted(js)
        again = run(ask("nats://127.0.0.1:%d" % js.port, [
            ("$JS.API.STREAM.NAMES", b""), ("$JS.API.CONSUMER.NAMES.S4", b"")]))
        created = sorted(a["config"]["name"] for a in got
                         if a.get("type", "").endswith("stream_create_response") and
                         "error" not in a)
        assert "S4" in created and sorted(again[0]["streams"]) == created
        assert len(again[1]["consumers"]) == len(
            [a for a in got[4:9] if "error" not in a])
    finally:
        js.stop()


def test_a_surrogate_request_leaves_every_server_of_a_cluster_up_after_a_restart(tmp_path):
    """The crash-and-stay-down class on three servers: R3 stream and consumers with the
    hostile fields, then every server restarted; all three come back and serve."""
    with JSCluster(tmp_path, 3).start() as cluster:
        answers = run(ask(cluster.url(0), [
            ("$JS.API.STREAM.CREATE.R3", b'{"name":"R3","subjects":["r.>","s\\udc80"],'
                                         b'"num_replicas":3}'),
            ("$JS.API.CONSUMER.CREATE.R3", b'{"stream_name":"R3","config":{'
                                           b'"deliver_subject":"x\\udc80","deliver_group":"g\\ud800"}}'),
            ("$JS.API.CONSUMER.DURABLE.CREATE.R3.D", b'{"stream_name":"R3","config":{'
                                                     b'"durable_name":"D","filter_subjects":["r.\\udc80"]}}'),
            ("$JS.API.CONSUMER.CREATE.R3", b'{"stream_name":"R3","config":{'
                                           b'"deliver_subject":"y\\r\\nMSG z 1 1"}}'),
        ]))
        assert "error" not in answers[0], answers
        assert outcome(answers[3])[:2] == (400, 10112), answers    # invalid deliver subject
        for i in range(3):
            cluster.stop(i)
        for i in range(3):
            cluster.start_one(i).start()
        cluster.wait_meta_leader()
        assert sorted(cluster.alive()) == [0, 1, 2]
        info = run(ask(cluster.url(2), [("$JS.API.STREAM.INFO.R3", b"")]))
        assert info[0]["config"]["subjects"] == ["r.>", "s\ufffd"], info


# ---- finding 8: the smaller ones -------------------------------------------------------

def test_names_are_measured_in_bytes_as_nats_server_measures_them(tmp_path):
    long_stream = "é" * 150          # 150 characters, 300 bytes
    long_consumer = "ü" * 200
    requests = [
        ("$JS.API.STREAM.CREATE." + long_stream, {"name": long_stream, "subjects": ["l"]}),
        ("$JS.API.STREAM.CREATE.OK", {"name": "OK", "subjects": ["ok"]}),
        ("$JS.API.CONSUMER.DURABLE.CREATE.OK." + long_consumer,
         {"stream_name": "OK", "config": {"durable_name": long_consumer}}),
        ("$JS.API.STREAM.CREATE." + "ß" * 127, {"name": "ß" * 127, "subjects": ["m"]}),
    ]
    got, expected, js = both(requests, str(tmp_path / "s"))
    try:
        assert [outcome(a) for a in got] == [outcome(a) for a in expected]
        assert outcome(got[0])[1] == 10052 and outcome(got[2])[1] == 10102
        assert "error" not in got[3]            # 254 bytes: a file name still
    finally:
        js.stop()


def test_stream_delete_takes_an_empty_object_as_nats_server_does(tmp_path):
    requests = [("$JS.API.STREAM.CREATE.D", {"name": "D", "subjects": ["d"]}),
                ("$JS.API.STREAM.DELETE.D", b"{}"),
                ("$JS.API.STREAM.CREATE.E", {"name": "E", "subjects": ["e"]}),
                ("$JS.API.STREAM.DELETE.E", b" "),
                ("$JS.API.STREAM.DELETE.E", b'{"x":1}')]
    got, expected, js = both(requests, str(tmp_path / "s"))
    js.stop()
    assert [outcome(a) for a in got] == [outcome(a) for a in expected]
    assert got[1] == {"type": "io.nats.jetstream.api.v1.stream_delete_response",
                      "success": True}


def test_an_os_error_does_not_show_where_the_store_is(tmp_path):
    store = tmp_path / "store"
    js = start_natsjs("-js", "-sd", str(store))
    try:
        # Something that is not a directory where the stream's would go.
        streams = store / "jetstream" / "$G" / "streams"
        os.makedirs(streams, exist_ok=True)
        (streams / "BLOCKED").write_text("")
        answers = run(ask("nats://127.0.0.1:%d" % js.port, [
            ("$JS.API.STREAM.CREATE.BLOCKED", {"name": "BLOCKED", "subjects": ["b"]}),
            ("$JS.API.STREAM.CREATE.FREE", {"name": "FREE", "subjects": ["f"]})]))
        assert "error" in answers[0], answers
        assert str(tmp_path) not in json.dumps(answers[0]), answers[0]
        assert "error" not in answers[1]
    finally:
        js.stop()


# ---- finding 8: thousands of consumers ------------------------------------------------

def test_a_subscription_wakes_only_the_push_consumers_delivering_to_it(tmp_path, monkeypatch):
    """18,000 ephemeral consumers held the loop for seconds: every subscription that
    came or went made every push consumer look for interest again (and a consumer's
    create subscribes three times).  Now only those delivering to its subject look."""
    import trio

    from natsjs.jetstream.config import JetStreamOptions
    from natsjs.jetstream.consumer import Consumer
    from test_server import Conn, new_server, serving

    server, _ = new_server(jetstream=JetStreamOptions(store_dir=str(tmp_path)))
    looked = []
    check = Consumer.check_interest

    def counted(self):
        looked.append(self.cfg["deliver_subject"])
        return check(self)
    monkeypatch.setattr(Consumer, "check_interest", counted)
    n = 200

    async def request(c: Conn, subject: str, body: dict) -> dict:
        c.buf = b""
        await c.send(b"SUB _R 99\r\nPUB %s _R %d\r\n%s\r\n" % (
            subject.encode(), len(json.dumps(body)), json.dumps(body).encode()))
        await c.until(b"}\r\n")
        return json.loads(c.buf.split(b"\r\n")[1])

    async def test():
        c = await Conn.open(server)
        assert "error" not in await request(c, "$JS.API.STREAM.CREATE.P",
                                            {"name": "P", "subjects": ["p"]})
        for i in range(n):
            r = await request(c, "$JS.API.CONSUMER.CREATE.P", {
                "stream_name": "P", "config": {"deliver_subject": "d.%d" % i}})
            assert "error" not in r, r
        looked.clear()
        await c.send(b"SUB d.7 1\r\nSUB other 2\r\nUNSUB 2\r\n")
        await c.ping()
        assert looked == ["d.7"]
        info = await request(c, "$JS.API.CONSUMER.LIST.P", {})
        assert sum(1 for ci in info["consumers"] if ci.get("push_bound")) == 1

    trio.run(serving, server, test)


def test_a_stream_that_sources_itself_is_a_cycle_as_nats_server_says(tmp_path):
    requests = [
        ("$JS.API.STREAM.CREATE.SELF", {"name": "SELF", "subjects": ["self"],
                                        "sources": [{"name": "SELF"}]}),
        ("$JS.API.STREAM.CREATE.X", {"name": "X", "subjects": ["x.>"]}),
        ("$JS.API.STREAM.CREATE.Y", {"name": "Y", "subjects": ["y.>"],
                                     "sources": [{"name": "X"}]}),
        ("$JS.API.STREAM.UPDATE.X", {"name": "X", "subjects": ["x.>"],
                                     "sources": [{"name": "Y"}]}),
        ("$JS.API.STREAM.UPDATE.X", {"name": "X", "subjects": ["x.>"],
                                     "sources": [{"name": "Y", "filter_subject": "z"}]}),
    ]
    got, expected, js = both(requests, str(tmp_path / "s"))
    js.stop()
    assert [outcome(a) for a in got] == [outcome(a) for a in expected]
    assert outcome(got[0]) == (500, 10052, "detected cycle")


@pytest.mark.parametrize("start", [start_natsjs, start_reference], ids=["natsjs", "reference"])
def test_a_forged_request_info_header_does_not_act_for_another_account(tmp_path, start):
    """The JetStream import names the requesting account in ``Nats-Request-Info``; a
    client that writes that header itself, naming another account, has it replaced:
    B's request creates B's stream, and A sees none (as with nats-server)."""
    conf = tmp_path / "s.conf"
    conf.write_text("jetstream { store_dir: %s }\naccounts {%s}\n"
                    % (json.dumps(str(tmp_path / "js")), ACCOUNTS))
    server = start("-c", str(conf))
    try:
        url = "nats://127.0.0.1:%d" % server.port

        async def create():
            nc = await nats.connect(url, user="b", password="b")
            try:
                msg = await nc.request("$JS.API.STREAM.CREATE.F", json.dumps(
                    {"name": "F", "subjects": ["f"]}).encode(), timeout=5,
                    headers={"Nats-Request-Info": '{"acc":"A","svc":"A"}'})
                return json.loads(msg.data)
            finally:
                await nc.close()
        created = run(create())
        assert "error" not in created, created
        in_a = run(ask(url, [("$JS.API.STREAM.NAMES", b"")], user="a"))
        in_b = run(ask(url, [("$JS.API.STREAM.NAMES", b"")], user="b"))
        assert in_a[0]["streams"] is None, in_a
        assert in_b[0]["streams"] == ["F"], in_b
    finally:
        server.stop()
