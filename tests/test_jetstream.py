"""JetStream on one server, end to end: a real natsjs process and nats-py's JetStream API.

Each test starts a server with ``-js -sd <tmp>`` and uses the official client the way
an application would: streams, publishes with acknowledgements, consumers, KV and
object stores.  Where the reference's exact behaviour matters it is also run against
nats-server from PyPI (the same test, parametrized).
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import nats
import pytest
from nats.js.api import (AckPolicy, ConsumerConfig, DeliverPolicy, DiscardPolicy,
                         RetentionPolicy, StorageType, StreamConfig)
from nats.js.errors import APIError, BadRequestError, NotFoundError

from conftest import reference_server_binary, start_natsjs, start_reference
from helpers import run

TIMEOUT = 10


@pytest.fixture(params=["natsjs", "reference"])
def js_server(request, tmp_path):
    start = start_natsjs if request.param == "natsjs" else start_reference
    s = start("-js", "-sd", str(tmp_path / "js"))
    yield s
    s.stop()


@pytest.fixture
def natsjs_js(tmp_path):
    s = start_natsjs("-js", "-sd", str(tmp_path / "js"))
    yield s
    s.stop()


async def connect(server):
    nc = await nats.connect(server.url, allow_reconnect=False)
    return nc, nc.jetstream()


def test_info_announces_jetstream_and_account_info(js_server):
    async def main():
        nc, js = await connect(js_server)
        assert nc._server_info.get("jetstream") is True
        info = await js.account_info()
        assert info.streams == 0 and info.consumers == 0
        assert info.limits.max_streams == -1 and info.api.level >= 1
        await nc.close()
    run(main())


@pytest.mark.parametrize("start", [start_natsjs, start_reference], ids=["natsjs", "reference"])
def test_system_user_config_leaves_others_in_global_account(tmp_path, start):
    """The documentation's configuration: an accounts block that only gives the system
    account a user. Clients without credentials land in the global account, which has
    JetStream; the system user's account has none and every API request says so."""
    conf = tmp_path / "s.conf"
    conf.write_text('server_name: s1\njetstream { store_dir: "%s" }\n'
                    'accounts { $SYS { users = [ { user: "admin", pass: "s3cr3t" } ] } }\n'
                    % (tmp_path / "js"))
    s = start("-c", str(conf))

    async def main():
        nc = await nats.connect(s.url, allow_reconnect=False)
        assert (await nc.jetstream().account_info()).limits.max_streams == -1
        await nc.close()
        admin = await nats.connect(s.url.replace("nats://", "nats://admin:s3cr3t@"),
                                   allow_reconnect=False)
        for subject, rtype in [("$JS.API.INFO", "account_info_response"),
                               ("$JS.API.STREAM.NAMES", "system_response"),
                               ("$JS.API.STREAM.INFO.X", "system_response")]:
            reply = json.loads((await admin.request(subject, b"", timeout=TIMEOUT)).data)
            assert reply == {"type": "io.nats.jetstream.api.v1." + rtype,
                             "error": {"code": 503, "err_code": 10039,
                                       "description": "JetStream not enabled for account"}}
        await admin.close()
    try:
        run(main())
    finally:
        s.stop()


def test_stream_lifecycle(js_server):
    async def main():
        nc, js = await connect(js_server)
        si = await js.add_stream(name="ORDERS", subjects=["orders.*"])
        assert si.config.subjects == ["orders.*"] and si.state.messages == 0
        assert si.config.duplicate_window == 120.0 and si.config.max_msgs == -1
        # Same configuration again: the existing stream, no error.
        await js.add_stream(name="ORDERS", subjects=["orders.*"])
        with pytest.raises(BadRequestError) as e:
            await js.add_stream(name="ORDERS", subjects=["other"])
        assert e.value.err_code == 10058
        with pytest.raises(BadRequestError) as e:
            await js.add_stream(name="OTHER", subjects=["orders.new"])
        assert e.value.err_code == 10065     # subjects overlap
        await js.add_stream(name="DEFAULT")
        assert (await js.stream_info("DEFAULT")).config.subjects == ["DEFAULT"]
        names = await js.streams_info()
        assert sorted(s.config.name for s in names) == ["DEFAULT", "ORDERS"]
        si = await js.update_stream(name="ORDERS", subjects=["orders.*", "returns.*"],
                                    max_msgs=10)
        assert si.config.max_msgs == 10
        with pytest.raises(APIError) as e:
            await js.update_stream(name="ORDERS", subjects=["orders.*"], storage="memory")
        assert e.value.err_code == 10052
        assert await js.delete_stream("DEFAULT")
        with pytest.raises(NotFoundError):
            await js.stream_info("DEFAULT")
        await nc.close()
    run(main())


def test_publish_acks_duplicates_and_expectations(js_server):
    async def main():
        nc, js = await connect(js_server)
        await js.add_stream(name="S", subjects=["s.>"])
        ack = await js.publish("s.a", b"1", headers={"Nats-Msg-Id": "m1"})
        assert (ack.stream, ack.seq, ack.duplicate) == ("S", 1, None)
        ack = await js.publish("s.a", b"1", headers={"Nats-Msg-Id": "m1"})
        assert ack.seq == 1 and ack.duplicate is True
        await js.publish("s.b", b"2")
        with pytest.raises(APIError) as e:
            await js.publish("s.a", b"x", headers={"Nats-Expected-Last-Sequence": "1"})
        assert e.value.err_code == 10071 and "wrong last sequence: 2" in e.value.description
        ack = await js.publish("s.a", b"3", headers={"Nats-Expected-Last-Sequence": "2"})
        assert ack.seq == 3
        with pytest.raises(APIError) as e:
            await js.publish("s.a", b"x", headers={"Nats-Expected-Last-Subject-Sequence": "1"})
        assert e.value.err_code == 10071
        await js.publish("s.a", b"4", headers={"Nats-Expected-Last-Subject-Sequence": "3"})
        with pytest.raises(APIError) as e:
            await js.publish("s.a", b"x", headers={"Nats-Expected-Stream": "T"})
        assert e.value.err_code == 10060
        with pytest.raises(APIError) as e:
            await js.publish("s.a", b"x", headers={"Nats-Expected-Last-Msg-Id": "nope"})
        assert e.value.err_code == 10070
        si = await js.stream_info("S")
        assert si.state.messages == 4 and si.state.last_seq == 4
        await nc.close()
    run(main())


def test_limits_discard_old_and_new(js_server):
    async def main():
        nc, js = await connect(js_server)
        await js.add_stream(name="OLD", subjects=["old"], max_msgs=3)
        for i in range(5):
            await js.publish("old", b"%d" % i)
        si = await js.stream_info("OLD")
        assert (si.state.messages, si.state.first_seq, si.state.last_seq) == (3, 3, 5)
        await js.add_stream(name="NEW", subjects=["new"], max_msgs=2, discard=DiscardPolicy.NEW)
        await js.publish("new", b"1")
        await js.publish("new", b"2")
        with pytest.raises(APIError) as e:
            await js.publish("new", b"3")
        assert e.value.description == "maximum messages exceeded"
        await js.add_stream(name="PER", subjects=["per.*"], max_msgs_per_subject=1)
        for i in range(3):
            await js.publish("per.a", b"%d" % i)
        await js.publish("per.b", b"b")
        si = await js.stream_info("PER")
        assert si.state.messages == 2
        msg = await js.get_last_msg("PER", "per.a")
        assert msg.data == b"2"
        await js.add_stream(name="SIZE", subjects=["size"], max_msg_size=10)
        with pytest.raises(APIError) as e:
            await js.publish("size", b"x" * 11)
        assert e.value.err_code == 10054
        await nc.close()
    run(main())


def test_pull_consumer_ack_nak_redelivery_and_max_deliver(js_server):
    async def main():
        nc, js = await connect(js_server)
        await js.add_stream(name="Q", subjects=["q.*"])
        for i in range(3):
            await js.publish("q.x", b"m%d" % i)
        sub = await js.pull_subscribe("q.*", "worker", config=ConsumerConfig(
            ack_wait=0.5, max_deliver=2))
        msgs = await sub.fetch(3, timeout=TIMEOUT)
        assert [m.data for m in msgs] == [b"m0", b"m1", b"m2"]
        assert msgs[0].subject == "q.x"
        assert msgs[0].metadata.sequence.stream == 1 and msgs[2].metadata.num_pending == 0
        await msgs[0].ack_sync(timeout=TIMEOUT)
        await msgs[1].nak()
        again = await sub.fetch(1, timeout=TIMEOUT)
        assert again[0].data == b"m1" and again[0].metadata.num_delivered == 2
        await again[0].ack()
        # m2 is never acknowledged: redelivered once after ack_wait, then no more.
        redo = await sub.fetch(1, timeout=TIMEOUT)
        assert redo[0].data == b"m2" and redo[0].metadata.num_delivered == 2
        with pytest.raises(nats.errors.TimeoutError):
            await sub.fetch(1, timeout=1.5)
        info = await js.consumer_info("Q", "worker")
        # Past max_deliver the message stops being pending (server/consumer.go
        # hasMaxDeliveries) but still counts as redelivered.
        assert info.delivered.stream_seq == 3 and info.num_ack_pending == 0
        assert info.num_redelivered == 1
        await nc.close()
    run(main())


def test_pull_request_statuses(js_server):
    async def main():
        nc, js = await connect(js_server)
        await js.add_stream(name="P", subjects=["p"])
        await js.add_consumer("P", durable_name="c", ack_policy=AckPolicy.EXPLICIT)
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.P.c",
                         json.dumps({"batch": 1, "no_wait": True}).encode(), reply=inbox)
        m = await sub.next_msg(TIMEOUT)
        assert m.headers.get("Status") == "404" and m.data == b""
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.P.c",
                         json.dumps({"batch": 2, "expires": 200_000_000}).encode(), reply=inbox)
        m = await sub.next_msg(TIMEOUT)
        assert m.headers.get("Status") == "408"
        assert m.headers.get("Nats-Pending-Messages") == "2"
        await nc.close()
    run(main())


def test_push_consumer_and_ephemeral(js_server):
    async def main():
        nc, js = await connect(js_server)
        await js.add_stream(name="PUSH", subjects=["push.>"])
        for i in range(5):
            await js.publish("push.%d" % i, b"%d" % i)
        got = []
        done = asyncio.Event()

        async def cb(msg):
            got.append((msg.subject, msg.data))
            await msg.ack_sync(timeout=TIMEOUT)
            if len(got) == 5:
                done.set()
        sub = await js.subscribe("push.>", cb=cb)
        await asyncio.wait_for(done.wait(), TIMEOUT)
        assert got == [("push.%d" % i, b"%d" % i) for i in range(5)]
        info = await sub.consumer_info()
        assert info.num_ack_pending == 0 and info.delivered.stream_seq == 5
        await sub.unsubscribe()
        await nc.close()
    run(main())


def test_push_consumer_of_large_messages_is_not_a_slow_consumer(natsjs_js):
    """A push consumer without flow control, over a stream of 512 KB messages: 80 MB
    ready at once.  What the server writes to the client in one go must stay under its
    pending limit (64 MB), or the client is cut off as a slow consumer although it
    reads as fast as it can.  (natsjs only: nats-server writes such a consumer flat out
    and did cut this client off in one loaded CI run.)"""
    body = b"x" * (512 * 1024)
    n = 160

    async def main():
        nc, js = await connect(natsjs_js)
        await js.add_stream(name="BIG", subjects=["big"])
        for _ in range(n):
            await js.publish("big", body, timeout=TIMEOUT)
        sub = await nc.subscribe("deliver.big", pending_bytes_limit=256 * 1024 * 1024,
                                 pending_msgs_limit=n * 2)
        await js.add_consumer("BIG", deliver_subject="deliver.big", ack_policy="none")
        got = 0
        while got < n:
            msg = await sub.next_msg(timeout=TIMEOUT)
            assert len(msg.data) == len(body)
            got += 1
        assert nc.is_connected
        await nc.close()
    run(main())


def test_deliver_policies(js_server):
    async def main():
        nc, js = await connect(js_server)
        await js.add_stream(name="D", subjects=["d.*"])
        for subj in ["d.a", "d.b", "d.a", "d.c"]:
            await js.publish(subj, subj.encode())
        cases = [(DeliverPolicy.ALL, None, 1), (DeliverPolicy.LAST, None, 4),
                 (DeliverPolicy.BY_START_SEQUENCE, 2, 2)]
        for dp, start, first in cases:
            sub = await js.pull_subscribe("d.*", None, config=ConsumerConfig(
                deliver_policy=dp, opt_start_seq=start))
            msgs = await sub.fetch(1, timeout=TIMEOUT)
            assert msgs[0].metadata.sequence.stream == first, dp
            await sub.unsubscribe()
        sub = await js.pull_subscribe("d.*", None, config=ConsumerConfig(
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT))
        msgs = await sub.fetch(3, timeout=TIMEOUT)
        assert [m.metadata.sequence.stream for m in msgs] == [2, 3, 4]
        await nc.close()
    run(main())


def test_workqueue_and_interest_retention(js_server):
    async def main():
        nc, js = await connect(js_server)
        await js.add_stream(name="WQ", subjects=["wq"], retention=RetentionPolicy.WORK_QUEUE)
        sub = await js.pull_subscribe("wq", "w")
        with pytest.raises(BadRequestError) as e:
            await js.add_consumer("WQ", durable_name="w2", ack_policy=AckPolicy.EXPLICIT)
        assert e.value.err_code == 10099
        for i in range(3):
            await js.publish("wq", b"%d" % i)
        for m in await sub.fetch(3, timeout=TIMEOUT):
            await m.ack_sync(timeout=TIMEOUT)
        assert (await js.stream_info("WQ")).state.messages == 0
        await js.add_stream(name="INT", subjects=["int"], retention=RetentionPolicy.INTEREST)
        await js.publish("int", b"nobody")       # no consumer: not kept
        assert (await js.stream_info("INT")).state.messages == 0
        a = await js.pull_subscribe("int", "a")
        b = await js.pull_subscribe("int", "b")
        await js.publish("int", b"both")
        (ma,) = await a.fetch(1, timeout=TIMEOUT)
        await ma.ack_sync(timeout=TIMEOUT)
        assert (await js.stream_info("INT")).state.messages == 1
        (mb,) = await b.fetch(1, timeout=TIMEOUT)
        await mb.ack_sync(timeout=TIMEOUT)
        assert (await js.stream_info("INT")).state.messages == 0
        await nc.close()
    run(main())


def test_purge_get_delete_and_direct_get(js_server):
    async def main():
        nc, js = await connect(js_server)
        await js.add_stream(name="M", subjects=["m.*"], allow_direct=True)
        for subj in ["m.a", "m.b", "m.a", "m.b", "m.c"]:
            await js.publish(subj, subj.encode(), headers={"X-Test": "1"})
        msg = await js.get_msg("M", 2)
        assert msg.subject == "m.b" and msg.data == b"m.b" and msg.headers["X-Test"] == "1"
        last = await js.get_last_msg("M", "m.a")
        assert last.seq == 3
        direct = await js.get_msg("M", 4, direct=True)
        assert direct.subject == "m.b" and direct.seq == 4
        with pytest.raises(NotFoundError):
            await js.get_msg("M", 99, direct=True)
        assert await js.delete_msg("M", 1)
        with pytest.raises(NotFoundError):
            await js.get_msg("M", 1)
        await js.purge_stream("M", subject="m.b")
        si = await js.stream_info("M")
        assert si.state.messages == 2
        await js.purge_stream("M", keep=1)
        si = await js.stream_info("M")
        assert si.state.messages == 1 and si.state.last_seq == 5
        await js.purge_stream("M")
        si = await js.stream_info("M")
        assert si.state.messages == 0 and si.state.first_seq == 6
        await nc.close()
    run(main())


def test_rollup(js_server):
    async def main():
        nc, js = await connect(js_server)
        await js.add_stream(name="R", subjects=["r.*"], allow_rollup_hdrs=True)
        for subj in ["r.a", "r.a", "r.b"]:
            await js.publish(subj, b"x")
        await js.publish("r.a", b"roll", headers={"Nats-Rollup": "sub"})
        si = await js.stream_info("R", subjects_filter=">")
        assert si.state.subjects == {"r.a": 1, "r.b": 1}
        await js.publish("r.c", b"all", headers={"Nats-Rollup": "all"})
        assert (await js.stream_info("R")).state.messages == 1
        await js.add_stream(name="NR", subjects=["nr"])
        with pytest.raises(APIError) as e:
            await js.publish("nr", b"x", headers={"Nats-Rollup": "sub"})
        assert e.value.description == "rollup not permitted"
        await nc.close()
    run(main())


def test_kv_bucket(js_server):
    async def main():
        nc, js = await connect(js_server)
        kv = await js.create_key_value(bucket="cfg", history=3)
        assert await kv.put("a", b"1") == 1
        assert await kv.put("a", b"2") == 2
        assert await kv.create("b", b"x") == 3
        with pytest.raises(Exception):
            await kv.create("b", b"y")
        assert await kv.update("b", b"z", last=3) == 4
        assert (await kv.get("a")).value == b"2"
        assert [e.value for e in await kv.history("a")] == [b"1", b"2"]
        await kv.delete("a")
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await kv.get("a")
        assert await kv.keys() == ["b"]
        await kv.purge("b")
        with pytest.raises(nats.js.errors.NoKeysError):
            await kv.keys()
        await nc.close()
    run(main())


def test_kv_watch_sees_updates(js_server):
    async def main():
        nc, js = await connect(js_server)
        kv = await js.create_key_value(bucket="w")
        await kv.put("k1", b"v1")
        watcher = await kv.watchall()
        first = await watcher.updates(timeout=TIMEOUT)
        assert (first.key, first.value) == ("k1", b"v1")
        marker = await watcher.updates(timeout=TIMEOUT)
        assert marker is None             # end of the initial values
        await kv.put("k2", b"v2")
        nxt = await watcher.updates(timeout=TIMEOUT)
        assert (nxt.key, nxt.value) == ("k2", b"v2")
        await watcher.stop()
        await nc.close()
    run(main())


def test_object_store(js_server):
    async def main():
        nc, js = await connect(js_server)
        obs = await js.create_object_store("files")
        data = os.urandom(300_000)
        info = await obs.put("blob", data)
        assert info.size == len(data)
        res = await obs.get("blob")
        assert res.data == data
        assert [o.name for o in await obs.list()] == ["blob"]
        await obs.delete("blob")
        with pytest.raises(Exception):
            await obs.get("blob")
        await nc.close()
    run(main())


def test_memory_storage_and_ttl(js_server):
    async def main():
        nc, js = await connect(js_server)
        await js.add_stream(name="MEM", subjects=["mem"], storage=StorageType.MEMORY,
                            max_age=0.3)
        await js.publish("mem", b"x")
        assert (await js.stream_info("MEM")).state.messages == 1
        for _ in range(100):
            if (await js.stream_info("MEM")).state.messages == 0:
                break
            await asyncio.sleep(0.05)
        assert (await js.stream_info("MEM")).state.messages == 0
        await nc.close()
    run(main())


def test_store_dir_that_is_a_file_stops_the_server(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    for binary in ([sys.executable, "-m", "natsjs"], [reference_server_binary()]):
        p = subprocess.run(binary + ["-js", "-sd", str(f), "-p", "-1", "-a", "127.0.0.1"],
                           capture_output=True, text=True, timeout=30)
        out = p.stdout + p.stderr
        assert "Can't start JetStream: storage directory is not a directory" in out, out


def test_varz_and_jsz_report_jetstream(natsjs_js):
    import urllib.request
    s = start_natsjs("-js", "-sd", os.path.join(os.path.dirname(natsjs_js.args[-1]), "js2"),
                     "-m", "-1")
    try:
        async def main():
            nc, js = await connect(s)
            await js.add_stream(name="V", subjects=["v"])
            await js.publish("v", b"x")
            await nc.close()
        run(main())
        base = "http://127.0.0.1:%d" % s.http_port
        varz = json.load(urllib.request.urlopen(base + "/varz"))
        assert varz["jetstream"]["config"]["store_dir"].endswith("jetstream")
        assert varz["jetstream"]["stats"]["api"]["level"] >= 1
        jsz = json.load(urllib.request.urlopen(base + "/jsz?streams=true"))
        assert jsz["streams"] == 1 and jsz["messages"] == 1
        assert jsz["account_details"][0]["stream_detail"][0]["name"] == "V"
    finally:
        s.stop()


@pytest.mark.parametrize("missing, text", [
    ("server_name", "jetstream cluster requires `server_name` to be set"),
    ("cluster_name", "jetstream cluster requires `cluster.name` to be set")])
def test_jetstream_cluster_needs_names(tmp_path, missing, text):
    lines = ["listen: 127.0.0.1:-1", "jetstream { store_dir: %s }" % (tmp_path / "js")]
    if missing != "server_name":
        lines.append("server_name: n1")
    lines.append("cluster { listen: 127.0.0.1:-1%s }" % (
        "" if missing == "cluster_name" else ", name: C1"))
    conf = tmp_path / "c.conf"
    conf.write_text("\n".join(lines) + "\n")
    for binary in ([sys.executable, "-m", "natsjs"], [reference_server_binary()]):
        p = subprocess.run(binary + ["-c", str(conf)], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode != 0 and text in p.stdout + p.stderr, p.stdout + p.stderr
