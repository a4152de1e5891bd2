"""Issue 20, item 3: a server that says it is ready can act on JetStream requests.

A single server recovers its streams before it logs "Server is ready", so a request
sent the moment that line appears finds every stream, however many it has; the same
for ``natsjs-server -js`` started fresh (what ``make run`` starts).  Clusters are in
tests/test_jetstream_cluster.py (the documentation's flow, a whole-cluster restart).
"""
from __future__ import annotations

import asyncio
import json

import nats

from conftest import start_natsjs

STREAMS = 1500


async def _requests(port: int, reqs: list) -> list:
    nc = await nats.connect("nats://127.0.0.1:%d" % port)
    try:
        out = []
        for subject, body in reqs:
            msg = await nc.request(subject, json.dumps(body).encode() if body else b"",
                                   timeout=5)
            out.append(json.loads(msg.data))
        return out
    finally:
        await nc.close()


async def _fill(port: int) -> None:
    nc = await nats.connect("nats://127.0.0.1:%d" % port)
    try:
        # Many creates in flight at once: the server answers them in order.
        futs = [nc.request("$JS.API.STREAM.CREATE.S%d" % i, json.dumps(
            {"name": "S%d" % i, "subjects": ["s.%d" % i]}).encode(), timeout=60)
            for i in range(STREAMS)]
        for msg in await asyncio.gather(*futs):
            assert b'"error"' not in msg.data, msg.data
        js = nc.jetstream()
        await js.publish("s.%d" % (STREAMS - 1), b"last")
    finally:
        await nc.close()


def _ready_answers(port: int) -> list:
    return asyncio.run(_requests(port, [
        ("$JS.API.INFO", None),
        ("$JS.API.STREAM.INFO.S%d" % (STREAMS - 1), None),
        ("$JS.API.STREAM.CREATE.NEW", {"name": "NEW", "subjects": ["new"]}),
    ]))


def test_a_fresh_server_acts_on_jetstream_requests_once_ready(tmp_path):
    server = start_natsjs("-js", "-sd", str(tmp_path))
    try:
        answers = asyncio.run(_requests(server.port, [
            ("$JS.API.INFO", None),
            ("$JS.API.STREAM.CREATE.NEW", {"name": "NEW", "subjects": ["new"]})]))
        assert all("error" not in a for a in answers), answers
    finally:
        server.stop()


def test_a_server_restarted_with_thousands_of_streams_acts_once_ready(tmp_path):
    server = start_natsjs("-js", "-sd", str(tmp_path))
    try:
        asyncio.run(_fill(server.port))
    finally:
        server.stop()
    # start_natsjs returns when the server logged that it is ready: ask at once.
    server = start_natsjs("-js", "-sd", str(tmp_path))
    try:
        info, stream, created = _ready_answers(server.port)
        assert "error" not in info and info["streams"] == STREAMS, info
        assert stream["state"]["messages"] == 1, stream
        assert "error" not in created, created
    finally:
        server.stop()
