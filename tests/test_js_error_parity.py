"""JetStream API error replies: a single server and a cluster answer alike, and as
nats-server does.

The same requests (streams and consumers that are not there, bad configurations, an
account's limits, paging past the end) go to a single natsjs server, a 3-server natsjs
cluster, a single nats-server and a 3-server nats-server cluster, each with the same
accounts; every reply must be the same JSON, field for field (the error's code, err_code
and description, and the fields Go writes beside it: the paging of a list response, a
purge response's count, a pause response's time).
"""
from __future__ import annotations

import asyncio
import json
import os

import nats
import pytest

from conftest import ServerProcess, natsjs_command, reference_server_binary
from jscluster import SYS_USER, JSCluster

# A second account whose JetStream allows one stream and two consumers, a third whose
# streams must have a max_bytes, of at most 2048 in memory and 4096 in files.
LIMITED = """  LIM { jetstream: { max_streams: 1, max_consumers: 2 },
        users = [ { user: lim, pass: lim } ] }
  BYTES { jetstream: { max_stream_bytes: true, memory_max_stream_bytes: 2048,
                       store_max_stream_bytes: 4096 },
          users = [ { user: bytes, pass: bytes } ] }"""

API = "$JS.API."

# (account, subject, body): each is sent after SETUP, its reply compared.
CASES = [
    ("app", "STREAM.INFO.NOPE", b""),
    ("app", "STREAM.INFO.NOPE", b'{"deleted_details": true}'),
    ("app", "STREAM.INFO.S", b"{bad"),
    ("app", "STREAM.DELETE.NOPE", b""),
    ("app", "STREAM.DELETE.S", b'{"x": 1}'),
    ("app", "STREAM.PURGE.NOPE", b""),
    ("app", "STREAM.PURGE.S", b"{bad"),
    ("app", "STREAM.UPDATE.NOPE", b'{"name": "NOPE", "subjects": ["nope"]}'),
    ("app", "STREAM.UPDATE.S", b'{"name": "OTHER"}'),
    ("app", "STREAM.MSG.GET.NOPE", b'{"seq": 1}'),
    ("app", "STREAM.MSG.GET.S", b'{"seq": 99}'),
    ("app", "STREAM.MSG.DELETE.NOPE", b'{"seq": 1}'),
    ("app", "STREAM.MSG.DELETE.S", b""),
    ("app", "STREAM.NAMES", b"{bad"),
    ("app", "STREAM.NAMES", b'{"offset": 1000}'),
    ("app", "STREAM.NAMES", b'{"offset": -3}'),
    ("app", "STREAM.NAMES", b'{"subject": "nomatch.>"}'),
    ("app", "STREAM.LIST", b"{bad"),
    ("app", "STREAM.LIST", b'{"offset": 1000}'),
    ("app", "STREAM.CREATE.X", b'{"name": "Y"}'),
    ("app", "STREAM.CREATE.X", b'{"name": "X", "retention": "bogus"}'),
    ("app", "STREAM.CREATE.X", b'{"name": "X", "subjects": ["s.1"]}'),
    ("app", "STREAM.CREATE.X", b'{"name": "X", "max_msgs_per_subject": -5, "sealed": true}'),
    ("app", "STREAM.CREATE.X", b"{bad"),
    ("app", "STREAM.CREATE.S", b'{"name": "S", "subjects": ["other"]}'),
    ("app", "CONSUMER.INFO.S.NOPE", b""),
    ("app", "CONSUMER.INFO.NOPE.C", b""),
    ("app", "CONSUMER.DELETE.S.NOPE", b""),
    ("app", "CONSUMER.DELETE.NOPE.C", b""),
    ("app", "CONSUMER.NAMES.NOPE", b""),
    ("app", "CONSUMER.NAMES.S", b"{bad"),
    ("app", "CONSUMER.NAMES.S", b'{"offset": 1000}'),
    ("app", "CONSUMER.LIST.NOPE", b""),
    ("app", "CONSUMER.LIST.S", b"{bad"),
    ("app", "CONSUMER.PAUSE.S.NOPE", b'{}'),
    ("app", "CONSUMER.PAUSE.NOPE.C", b'{}'),
    ("app", "CONSUMER.CREATE.NOPE.D",
     b'{"stream_name": "NOPE", "config": {"durable_name": "D"}}'),
    ("app", "CONSUMER.CREATE.S.D", b'{"stream_name": "OTHER", "config": {"durable_name": "D"}}'),
    ("app", "CONSUMER.CREATE.S.D", b'{"stream_name": "S", "config": {"durable_name": "E"}}'),
    ("app", "CONSUMER.CREATE.S.D",
     b'{"stream_name": "S", "config": {"durable_name": "D", '
     b'"deliver_policy": "by_start_sequence"}}'),
    ("app", "CONSUMER.CREATE.S.D",
     b'{"stream_name": "S", "config": {"durable_name": "D", "ack_policy": "bogus"}}'),
    ("app", "CONSUMER.CREATE.S.D",
     b'{"stream_name": "S", "action": "update", "config": {"durable_name": "D"}}'),
    ("app", "CONSUMER.CREATE.S.C",
     b'{"stream_name": "S", "action": "create", '
     b'"config": {"durable_name": "C", "ack_policy": "none"}}'),
    ("app", "CONSUMER.CREATE.S",
     b'{"stream_name": "S", "config": {"durable_name": "D"}}'),
    ("app", "CONSUMER.DURABLE.CREATE.S.D", b'{"stream_name": "S", "config": {}}'),
    ("app", "CONSUMER.CREATE.S.D.s.1",
     b'{"stream_name": "S", "config": {"durable_name": "D", "filter_subject": "s.2"}}'),
    ("app", "CONSUMER.CREATE.S.D", b"{bad"),
    ("lim", "STREAM.CREATE.L2", b'{"name": "L2", "subjects": ["l2"]}'),
    ("lim", "CONSUMER.CREATE.L.C3",
     b'{"stream_name": "L", "config": {"durable_name": "C3"}}'),
    ("app", "CONSUMER.CREATE.ONE.C2",
     b'{"stream_name": "ONE", "config": {"durable_name": "C2"}}'),
    # a failed snapshot request's reply has no config or state (omitempty in Go)
    ("app", "STREAM.SNAPSHOT.S", b""),
    ("app", "STREAM.SNAPSHOT.S", b"{}"),
    ("app", "STREAM.SNAPSHOT.S", b"{bad"),
    ("app", "STREAM.SNAPSHOT.S", b'{"deliver_subject": "d.*"}'),
    ("app", "STREAM.SNAPSHOT.S", b'{"deliver_subject": "d", "bogus": 1}'),
    ("app", "STREAM.PEER.REMOVE.S", b""),
    ("app", "STREAM.PEER.REMOVE.S", b"{bad"),
    ("app", "STREAM.PEER.REMOVE.S", b'{"peer": ""}'),
    ("app", "STREAM.PEER.REMOVE.S", b'{"peer": "x", "bogus": 1}'),
    ("app", "STREAM.PEER.REMOVE.NOPE", b'{"peer": "x"}'),
    ("app", "STREAM.LEADER.STEPDOWN.S", b'{"placement": {"preferred": "nope"}}'),
    ("app", "STREAM.LEADER.STEPDOWN.S", b"{bad"),
    ("app", "CONSUMER.LEADER.STEPDOWN.S.C", b'{"placement": {"preferred": "nope"}}'),
    ("bytes", "STREAM.CREATE.B", b'{"name": "B", "subjects": ["b"]}'),
    ("bytes", "STREAM.CREATE.B", b'{"name": "B", "subjects": ["b"], "max_bytes": 4097}'),
    ("bytes", "STREAM.CREATE.B",
     b'{"name": "B", "subjects": ["b"], "storage": "memory", "max_bytes": 2049}'),
]

# Sent in the system account to a cluster only (the meta leader answers).
SYS_CASES = [
    ("SERVER.REMOVE", b""),
    ("SERVER.REMOVE", b"{}"),
    ("SERVER.REMOVE", b"{bad"),
    ("SERVER.REMOVE", b'{"peer": "x", "bogus": 1}'),
    ("META.LEADER.STEPDOWN", b"{bad"),
    ("META.LEADER.STEPDOWN", b'{"placement": {"preferred": "nope"}}'),
    ("META.LEADER.STEPDOWN", b'{"placement": {"cluster": "nope"}}'),
]

# Made before the cases: their replies must be successes.
SETUP = [
    ("app", "STREAM.CREATE.S", b'{"name": "S", "subjects": ["s.>"]}'),
    ("app", "CONSUMER.CREATE.S.C",
     b'{"stream_name": "S", "config": {"durable_name": "C", "ack_policy": "explicit"}}'),
    ("app", "STREAM.CREATE.ONE", b'{"name": "ONE", "subjects": ["one"], "max_consumers": 1}'),
    ("app", "CONSUMER.CREATE.ONE.C1",
     b'{"stream_name": "ONE", "config": {"durable_name": "C1"}}'),
    ("lim", "STREAM.CREATE.L", b'{"name": "L", "subjects": ["l"]}'),
    ("lim", "CONSUMER.CREATE.L.C1", b'{"stream_name": "L", "config": {"durable_name": "C1"}}'),
    ("lim", "CONSUMER.CREATE.L.C2", b'{"stream_name": "L", "config": {"durable_name": "C2"}}'),
]


def _single_conf(tmp, name: str) -> str:
    d = os.path.join(str(tmp), name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "server.conf")
    with open(path, "w") as f:
        f.write("""server_name: %s
listen: 127.0.0.1:-1
jetstream { store_dir: %s }
accounts {
  APP { jetstream: enabled, users = [ { user: app, pass: app } ] }
%s
}
no_auth_user: app
""" % (name, json.dumps(os.path.join(d, "js")), LIMITED))
    return path


def _single(tmp, name: str, argv0: list[str]) -> ServerProcess:
    conf = _single_conf(tmp, name)
    return ServerProcess(argv0 + ["-c", conf], args=["-c", conf]).start()


async def _transcript(url: str, cluster: bool, sys_login=None) -> list:
    conns = {"app": await nats.connect(url, user="app", password="app"),
             "lim": await nats.connect(url, user="lim", password="lim"),
             "bytes": await nats.connect(url, user="bytes", password="bytes")}
    if sys_login:
        conns["sys"] = await nats.connect(url, user=sys_login[0], password=sys_login[1])
    try:
        async def ask(acc, subject, body):
            msg = await conns[acc].request(API + subject, body, timeout=10)
            return json.loads(msg.data)
        for acc, subject, body in SETUP:
            if cluster and subject.startswith("STREAM.CREATE."):
                cfg = json.loads(body)
                cfg["num_replicas"] = 3
                body = json.dumps(cfg).encode()
            reply = await ask(acc, subject, body)
            assert "error" not in reply, (subject, reply)
        out = [await ask(*case) for case in CASES]
        if sys_login:
            out += [await ask("sys", *case) for case in SYS_CASES]
        return out
    finally:
        for nc in conns.values():
            await nc.close()


def _run(url: str, cluster: bool, sys_login=None) -> list:
    return asyncio.run(_transcript(url, cluster, sys_login))


@pytest.fixture(scope="module")
def replies(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parity")
    out = {}
    for name, argv0 in (("natsjs", natsjs_command()), ("reference", [reference_server_binary()])):
        s = _single(tmp, name, argv0)
        try:
            out[name] = _run(s.url, False)
        finally:
            s.stop()
        cdir = tmp / (name + "-cluster")
        cdir.mkdir()
        with JSCluster(cdir, 3, reference=name == "reference",
                       accounts=LIMITED).start() as c:
            replies = _run(c.url(0), True, (SYS_USER, c.sys_pass))
            out[name + "-cluster"] = replies[:len(CASES)]
            out[name + "-cluster-sys"] = replies[len(CASES):]
    return out


def _differences(a: list, b: list) -> list:
    return ["%s %s: %s != %s" % (CASES[i][0], CASES[i][1] + " " + CASES[i][2].decode(), x, y)
            for i, (x, y) in enumerate(zip(a, b)) if x != y]


def test_every_case_is_an_error_or_a_page(replies):
    """The cases are errors (or a page past the end): no setup slipped into success."""
    for reply, (_, subject, _) in zip(replies["reference"], CASES):
        assert "error" in reply or "total" in reply, (subject, reply)


def test_single_server_matches_reference(replies):
    diff = _differences(replies["natsjs"], replies["reference"])
    assert not diff, "\n".join(diff)


def test_cluster_matches_reference_cluster(replies):
    diff = _differences(replies["natsjs-cluster"], replies["reference-cluster"])
    assert not diff, "\n".join(diff)


def test_cluster_matches_single_server(replies):
    """Where nats-server's single server and cluster agree, natsjs's agree too."""
    same = [i for i, (a, b) in enumerate(zip(replies["reference"], replies["reference-cluster"]))
            if a == b]
    assert [i for i in same if replies["natsjs"][i] != replies["natsjs-cluster"][i]] == []


def test_cluster_system_requests_match_reference_cluster(replies):
    """The meta leader's requests in the system account read their bodies as every
    other request does: no body is a bad request, bad JSON is JSInvalidJSONErr."""
    pairs = zip(SYS_CASES, replies["natsjs-cluster-sys"], replies["reference-cluster-sys"])
    diff = ["%s %s: %s != %s" % (subj, body.decode(), a, b)
            for (subj, body), a, b in pairs if a != b]
    assert not diff, "\n".join(diff)
