"""Behaviours nats.py's own JetStream tests (nats/tests/test_js.py) rely on, natsjs
against the reference nats-server: each test runs the same steps on both.

- A no_wait pull request that got some messages and is then held back by
  max_ack_pending ends with ``404 No Messages`` when its first heartbeat is due
  (nats-server's waiting-request timer runs processWaiting as at the end of the
  stream): acknowledging later frees nothing for it. nats.py's fetch relies on this; a
  lingering request would receive messages meant for the next fetch.
- A push consumer's delivery of a published message reaches the publishing client in
  the same write as the message's PubAck (nats-server queues both on the stream's one
  outq). nats.py counts a subscription's pending messages per read: a delivery that
  lags behind its PubAck can come in one read with the next PubAck and the next
  delivery, two at once for a queue subscriber whose limit is one
  (test_subscribe_custom_limits). natsjs only: see the test.
- With a JetStream domain, ``$JS.<domain>.API.>`` reaches the API as ``$JS.API.>`` does,
  and ``$JS.<domain>.API.$KV.>`` / ``$OBJ.>`` reach ``$KV.>`` / ``$OBJ.>``
  (nats.py's ``nc.jetstream(domain=...)``, test_account_limits).
"""
from __future__ import annotations

import asyncio
import json
import re

import nats
import pytest

from conftest import start_natsjs, start_reference

KINDS = ["natsjs", "reference"]


def _server(kind: str, store):
    start = start_natsjs if kind == "natsjs" else start_reference
    return start("-js", "-sd", str(store))


def _status(msg) -> str | None:
    return (msg.headers or {}).get("Status")


@pytest.mark.parametrize("kind", KINDS)
def test_no_wait_pull_held_by_max_ack_pending_ends_at_its_heartbeat(kind, tmp_path):
    async def run(url):
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="E", subjects=["e.>"])
            await js.add_consumer("E", durable_name="a", max_ack_pending=2, ack_wait=30)
            for i in range(5):
                await js.publish("e.%d" % i, b"%d" % i)
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            req = {"batch": 10, "expires": 10_000_000_000, "idle_heartbeat": 200_000_000,
                   "no_wait": True}
            await nc.publish("$JS.API.CONSUMER.MSG.NEXT.E.a", json.dumps(req).encode(), inbox)
            got = [await sub.next_msg(timeout=5) for _ in range(2)]
            assert [m.data for m in got] == [b"0", b"1"]
            # Well before the request's 10s expiry: its first heartbeat's turn ends it.
            end = await sub.next_msg(timeout=3)
            assert (_status(end), end.headers.get("Description")) == ("404", "No Messages")
            for m in got:
                await m.ack_sync()
            # The room the acks made goes to nobody: the request is gone.
            with pytest.raises(nats.errors.TimeoutError):
                extra = await sub.next_msg(timeout=1)
                pytest.fail("after the end: %r %r" % (extra.data, extra.headers))
            info = await js.consumer_info("E", "a")
            assert (info.num_ack_pending, info.num_pending) == (0, 3)
        finally:
            await nc.close()

    s = _server(kind, tmp_path)
    try:
        asyncio.run(asyncio.wait_for(run(s.url), 30))
    finally:
        s.stop()


PUBLISHES = 40


def test_push_delivery_comes_with_its_pub_ack(tmp_path):
    """natsjs writes a PubAck and its deliveries at once. nats-server only nearly does
    (both wait on one queue, but its writer may flush between them when the machine is
    busy), so the reference is not held to this."""
    async def run(url, port):
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="Q", subjects=["q"])
            await js.add_consumer("Q", durable_name="d", deliver_subject="dlv",
                                  deliver_group="wg", ack_policy="none")
        finally:
            await nc.close()
        r, w = await asyncio.open_connection("127.0.0.1", port)
        await r.readline()
        w.write(b'CONNECT {"verbose":false,"headers":true,"protocol":1}\r\n'
                b"SUB dlv wg 1\r\nSUB ack.* 2\r\nPING\r\n")
        buf = b""
        while b"PONG" not in buf:
            buf += await asyncio.wait_for(r.read(65536), 10)
        apart = []
        for i in range(PUBLISHES):
            w.write(b"PUB q ack.%d 1\r\nx\r\n" % i)
            await w.drain()
            seen = []
            while ("ack.%d" % i) not in seen:
                chunk = await asyncio.wait_for(r.read(65536), 10)
                seen += [s.decode() for s in re.findall(rb"MSG (\S+) ", chunk)]
            if seen.count("q") != 1:
                apart.append((i, seen))
        w.close()
        return apart

    s = _server("natsjs", tmp_path)
    try:
        host, port = s.url.rsplit(":", 1)
        apart = asyncio.run(asyncio.wait_for(run(s.url, int(port)), 60))
    finally:
        s.stop()
    # Every read that brought a PubAck brought its delivery too, and no other.
    assert apart == []


@pytest.mark.parametrize("kind", KINDS)
def test_domain_prefixed_api(kind, tmp_path):
    async def run(url):
        nc = await nats.connect(url)
        try:
            async def api(subject, body=b""):
                msg = await nc.request("$JS.D.API." + subject, body, timeout=5)
                return json.loads(msg.data)
            info = await api("INFO")
            assert (info["type"], info["domain"]) == (
                "io.nats.jetstream.api.v1.account_info_response", "D")
            cfg = {"name": "KV_B", "subjects": ["$KV.B.>"], "allow_direct": True}
            made = await api("STREAM.CREATE.KV_B", json.dumps(cfg).encode())
            assert made["config"]["name"] == "KV_B", made
            ack = json.loads((await nc.request("$JS.D.API.$KV.B.k", b"v", timeout=5)).data)
            assert ack == {"stream": "KV_B", "domain": "D", "seq": 1}
            got = await nc.request("$JS.D.API.DIRECT.GET.KV_B",
                                   b'{"last_by_subj": "$KV.B.k"}', timeout=5)
            assert (got.data, got.headers["Nats-Subject"]) == (b"v", "$KV.B.k")
            names = await api("STREAM.NAMES")
            assert names["streams"] == ["KV_B"]
            # No mapping covers other suffixes: nobody answers.
            with pytest.raises(nats.errors.NoRespondersError):
                await nc.request("$JS.D.API.NOPE.X", b"", timeout=5)
        finally:
            await nc.close()

    conf = tmp_path / "server.conf"
    conf.write_text("jetstream { domain: D, store_dir: %s }\n" % json.dumps(str(tmp_path / "js")))
    start = start_natsjs if kind == "natsjs" else start_reference
    s = start("-c", str(conf))
    try:
        asyncio.run(asyncio.wait_for(run(s.url), 30))
    finally:
        s.stop()
