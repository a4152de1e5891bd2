"""Clusters of real server processes: natsjs alone, and mixed with nats-server.

The topologies are the ones of the NATS clustering documentation: a seed started with
only ``--cluster``, and servers started with ``--routes`` to the seed, which must then
find each other by gossip.  Waiting is always for a condition (routes registered in
/varz, a message that arrives), with a deadline.
"""
import asyncio
import json
import re
import socket
import time
import urllib.request
from functools import partial

import nats
import pytest

from conftest import start_natsjs, start_reference
import helpers
from helpers import connect

TIMEOUT = 15
run = partial(helpers.run, timeout=90)
ROUTE_RE = re.compile(rb"Listening for route connections on [^\s:]+:(\d+)")


def wait_until(cond, what, timeout=TIMEOUT):
    return helpers.wait_until(cond, what, timeout)


async def await_until(cond, what, timeout=TIMEOUT):
    return await helpers.until(cond, what, timeout, step=0.02)


def start(kind, *args):
    if kind == "natsjs":
        s = start_natsjs("-m", "-1", *args)
    else:
        s = start_reference("-m", str(_free_port()), *args)
    s.cluster_port = int(s.wait_for(ROUTE_RE).group(1))
    return s


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_args(name="C1", routes=(), extra=()):
    args = ["--cluster", "nats://127.0.0.1:-1", "--cluster_name", name]
    if routes:
        args += ["--routes", ",".join("nats://127.0.0.1:%d" % p for p in routes)]
    return args + list(extra)


def http_json(server, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (server.http_port, path),
                                timeout=5) as r:
        return json.loads(r.read())


def remote_ids(server):
    return {r["remote_id"] for r in http_json(server, "/routez")["routes"]}


def server_id(server):
    return http_json(server, "/varz")["server_id"]


def wait_mesh(servers, timeout=TIMEOUT):
    ids = {s: server_id(s) for s in servers}
    for s in servers:
        want = {ids[o] for o in servers if o is not s}
        wait_until(lambda: want <= remote_ids(s), "full mesh at %s" % ids[s], timeout)


async def until_delivered(pub, sub, subject, data=b"ping", timeout=TIMEOUT):
    """Publish until the subscriber has one (interest takes a moment to cross routes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await pub.publish(subject, data)
        await pub.flush()
        try:
            return await sub.next_msg(timeout=0.2)
        except nats.errors.TimeoutError:
            continue
    raise AssertionError("no message on %s" % subject)


def flows(src, dst, subject, user=None):
    """Publish on ``src`` until a subscriber on ``dst`` has a message (``user``: the
    account user, whose password is its name)."""
    creds = "%s:%s@" % (user, user) if user else ""

    async def main():
        pub = await nats.connect("nats://%s127.0.0.1:%d" % (creds, src.port),
                                 allow_reconnect=False)
        sub = await nats.connect("nats://%s127.0.0.1:%d" % (creds, dst.port),
                                 allow_reconnect=False)
        s = await sub.subscribe(subject)
        await sub.flush()
        await until_delivered(pub, s, subject)
        await pub.close()
        await sub.close()
    run(main())


async def drain(sub):
    while True:
        try:
            await sub.next_msg(timeout=0.05)
        except nats.errors.TimeoutError:
            return


@pytest.fixture
def procs():
    started = []
    yield started
    for s in started:
        s.stop()


def three(procs, kinds=("natsjs", "natsjs", "natsjs"), extra=()):
    seed = start(kinds[0], *cluster_args(extra=extra))
    procs.append(seed)
    b = start(kinds[1], *cluster_args(routes=[seed.cluster_port], extra=extra))
    procs.append(b)
    c = start(kinds[2], *cluster_args(routes=[seed.cluster_port], extra=extra))
    procs.append(c)
    wait_mesh([seed, b, c])
    return seed, b, c


def test_documentation_example_full_mesh_and_seed_failure(procs):
    seed, b, c = three(procs)

    async def main():
        nb = await connect(b)
        nc = await connect(c)
        sub = await nc.subscribe("hello.>")
        await nc.flush()
        msg = await until_delivered(nb, sub, "hello.world")
        assert msg.subject == "hello.world"

        # The seed dies: B and C keep their direct route.
        seed.stop()
        await drain(sub)
        await nb.publish("hello.again", b"still")
        await nb.flush()
        assert (await sub.next_msg(timeout=TIMEOUT)).data == b"still"
        await nb.close()
        await nc.close()
    run(main())
    assert remote_ids(b) == {server_id(c)}


def test_seed_rejoins(procs):
    seed = start("natsjs", *cluster_args())
    procs.append(seed)
    b = start("natsjs", *cluster_args(routes=[seed.cluster_port]))
    procs.append(b)
    wait_mesh([seed, b])
    port = seed.cluster_port
    seed.stop()
    wait_until(lambda: not remote_ids(b), "B to notice the seed is gone")
    again = start("natsjs", "--cluster", "nats://127.0.0.1:%d" % port, "--cluster_name", "C1")
    procs.append(again)
    wait_mesh([again, b])    # B's explicit route reconnects by itself


def test_queue_groups_and_requests_across_the_cluster(procs):
    seed, b, c = three(procs)

    async def main():
        na, nb, nc = await connect(seed), await connect(b), await connect(c)
        counts = {"a": 0, "c": 0}

        def member(name):
            async def cb(msg):
                counts[name] += 1
            return cb
        await na.subscribe("jobs", queue="workers", cb=member("a"))
        await nc.subscribe("jobs", queue="workers", cb=member("c"))
        probe_a = await na.subscribe("jobs")
        probe_c = await nc.subscribe("jobs")
        await na.flush()
        await nc.flush()
        await until_delivered(nb, probe_a, "jobs")
        await until_delivered(nb, probe_c, "jobs")
        await drain(probe_a)
        await drain(probe_c)
        before = counts["a"] + counts["c"]
        total = 400
        for i in range(total):
            await nb.publish("jobs", b"%d" % i)
        await nb.flush()
        await await_until(lambda: counts["a"] + counts["c"] - before >= total,
                          "queue deliveries")
        await nb.flush()
        assert counts["a"] + counts["c"] - before == total        # each exactly once
        assert counts["a"] > total // 10 and counts["c"] > total // 10   # spread

        async def echo(msg):
            await msg.respond(b"re:" + msg.data)
        await nc.subscribe("svc", cb=echo)
        await nc.flush()
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                reply = await nb.request("svc", b"q", timeout=0.5)
                break
            except nats.errors.NoRespondersError:
                assert time.monotonic() < deadline
        assert reply.data == b"re:q"

        # A new connection whose first message goes to a queue group on another
        # server (as `nats reply` subscribes): its first route target is that queue.
        await nc.subscribe("qsvc", queue="NATS-RPLY-22", cb=echo)
        await nc.flush()
        await until_delivered(nb, await nc.subscribe("qsvc.probe"), "qsvc.probe")
        nd = await connect(b)
        reply = await nd.request("qsvc", b"q", timeout=TIMEOUT)
        assert reply.data == b"re:q"
        for n in (na, nb, nc, nd):
            await n.close()
    run(main())


def test_clients_learn_the_cluster_and_fail_over(procs):
    seed, b, c = three(procs)

    async def main():
        reconnected = asyncio.Event()

        async def on_reconnect():
            reconnected.set()
        nc = await nats.connect(b.url, reconnect_time_wait=0.05, max_reconnect_attempts=100,
                                reconnected_cb=on_reconnect)
        await await_until(lambda: len(nc._server_info.get("connect_urls") or []) >= 3,
                          "connect_urls with every member")
        urls = set(nc._server_info["connect_urls"])
        assert {"127.0.0.1:%d" % s.port for s in (seed, b, c)} <= urls
        b.stop()
        await asyncio.wait_for(reconnected.wait(), TIMEOUT)
        assert nc.connected_url.port in (seed.port, c.port)
        await nc.close()
    run(main())


def test_pooling_pinned_accounts_and_pool_index(procs):
    a = start("natsjs", *cluster_args())
    procs.append(a)
    b = start("natsjs", *cluster_args(routes=[a.cluster_port]))
    procs.append(b)
    wait_until(lambda: len(http_json(b, "/routez")["routes"]) == 4, "3 pooled + $SYS routes")
    routes = http_json(b, "/routez")["routes"]
    assert sorted(r.get("account", "") for r in routes) == ["", "", "", "$SYS"]
    assert sorted(r["pool_idx"] for r in routes if "pool_idx" in r) == [0, 1, 2]

    async def main():
        na, nb = await connect(a), await connect(b)
        sub = await na.subscribe("pooled")
        await na.flush()
        await until_delivered(nb, sub, "pooled")
        # $G hashes to one pool index (2 of 3, FNV-1a): one pooled route carries it.
        carried = [r for r in http_json(b, "/routez?subs=1")["routes"]
                   if "pooled" in (r.get("subscriptions_list") or [])]
        assert len(carried) == 1 and "account" not in carried[0]
        await na.close()
        await nb.close()
    run(main())


@pytest.mark.parametrize("mode", ["off", "accept", "s2_fast", "s2_better", "s2_best",
                                  "s2_auto"])
def test_mixed_cluster_with_the_reference(procs, mode, tmp_path):
    conf = tmp_path / "c.conf"
    conf.write_text("cluster { compression: %s }\n" % mode)
    seed = start("natsjs", "-c", str(conf), *cluster_args())
    procs.append(seed)
    ref = start("reference", *cluster_args(routes=[seed.cluster_port],
                                            extra=["-c", str(conf)]))
    procs.append(ref)
    ours = start("natsjs", "-c", str(conf), *cluster_args(routes=[ref.cluster_port]))
    procs.append(ours)
    wait_mesh([seed, ref, ours])
    # pooling with the reference: 3 pooled connections and the $SYS one, per peer
    wait_until(lambda: len(http_json(ref, "/routez")["routes"]) == 8, "pooled routes on ref")

    async def main():
        clients = [await connect(s) for s in (seed, ref, ours)]
        subs = [await n.subscribe("mix.>") for n in clients]
        for n in clients:
            await n.flush()
        for i, pub in enumerate(clients):
            for j, sub in enumerate(subs):
                if i != j:
                    m = await until_delivered(pub, sub, "mix.%d.%d" % (i, j), b"x" * 2000)
                    assert len(m.data) == 2000
                    await drain(sub)

        async def echo(msg):
            await msg.respond(msg.data[::-1])
        await clients[1].subscribe("rev", cb=echo, queue="q")
        await clients[1].flush()
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                r = await clients[2].request("rev", b"abc", timeout=0.5)
                break
            except nats.errors.NoRespondersError:
                assert time.monotonic() < deadline
        assert r.data == b"cba"
        for n in clients:
            await n.close()
    run(main())
    expected = {"off": "off", "accept": "off", "s2_fast": "s2_fast", "s2_better": "s2_better",
                "s2_best": "s2_best"}
    for s in (seed, ref, ours):
        modes = {r["compression"] for r in http_json(s, "/routez")["routes"]}
        if mode in expected:
            assert modes == {expected[mode]}, (mode, modes)
        else:   # s2_auto shows the level it picked, never s2_auto itself
            assert modes and "s2_auto" not in modes
            assert modes <= {"s2_uncompressed", "s2_fast", "s2_better", "s2_best"}


def test_pool_size_minus_one_peer_gets_a_single_route(procs, tmp_path):
    conf = tmp_path / "nopool.conf"
    conf.write_text("cluster { pool_size: -1 }\n")
    a = start("natsjs", *cluster_args())
    procs.append(a)
    ref = start("reference", *cluster_args(routes=[a.cluster_port], extra=["-c", str(conf)]))
    procs.append(ref)
    wait_mesh([a, ref])

    flows(ref, a, "one")
    assert len(http_json(a, "/routez")["routes"]) == 1


def test_bad_route_input_is_refused_without_harm(procs, tmp_path):
    conf = tmp_path / "auth.conf"
    conf.write_text("cluster { authorization { user: ruser, password: T0pS3cr3t } }\n")
    a = start("natsjs", "-c", str(conf), *cluster_args())
    procs.append(a)
    good = start("natsjs", *cluster_args(
        extra=["--routes", "nats-route://ruser:T0pS3cr3t@127.0.0.1:%d" % a.cluster_port]))
    procs.append(good)
    wait_mesh([a, good])

    def talk(payload):
        s = socket.create_connection(("127.0.0.1", a.cluster_port), timeout=5)
        s.recv(65536)
        s.sendall(payload)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk

    assert b"-ERR 'Authorization Violation'" in talk(
        b'CONNECT {"user":"ruser","pass":"wrong","name":"X","cluster":"C1"}\r\n')
    assert b"Rejecting connection, cluster name" in talk(
        b'CONNECT {"user":"ruser","pass":"T0pS3cr3t","name":"X","cluster":"OTHER"}\r\n')
    assert b"-ERR 'Authorization Violation'" in talk(b"PING\r\n")
    assert b"attempted to connect to route port" in talk(
        b'CONNECT {"lang":"python","user":"ruser","pass":"T0pS3cr3t"}\r\n')
    talk(bytes(range(256)) * 4 + b"\r\n")
    # wrong credentials from a whole server: refused, and it does not join
    bad = start("natsjs", *cluster_args(
        extra=["--routes", "nats-route://ruser:nope@127.0.0.1:%d" % a.cluster_port]))
    procs.append(bad)
    bad.wait_for(re.compile(rb"Authorization Violation"))
    assert a.alive() and good.alive()
    assert remote_ids(a) == {server_id(good)}

    flows(good, a, "after")


def test_self_route_is_ignored(procs):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    s = start("natsjs", "--cluster", "nats://127.0.0.1:%d" % port, "--cluster_name", "C1",
              "--routes", "nats://127.0.0.1:%d" % port)
    procs.append(s)
    s.wait_for(re.compile(rb"Route connection created"))
    assert http_json(s, "/routez")["num_routes"] == 0
    assert s.alive()


def test_reload_changes_compression_level_in_place_and_off_reconnects(procs, tmp_path):
    conf = tmp_path / "a.conf"
    pidfile = tmp_path / "a.pid"
    conf.write_text("cluster { compression: s2_fast }\n")
    a = start("natsjs", "-c", str(conf), "-P", str(pidfile), *cluster_args())
    procs.append(a)
    ref = start("reference", *cluster_args(routes=[a.cluster_port]))
    procs.append(ref)
    wait_mesh([a, ref])
    wait_until(lambda: len(http_json(a, "/routez")["routes"]) == 4, "pooled routes")

    def routes():
        return {r["rid"]: r["compression"] for r in http_json(a, "/routez")["routes"]}
    before = routes()
    assert set(before.values()) == {"s2_fast"}

    def reload(text):
        import subprocess
        import sys
        conf.write_text(text)
        n = a.text().count("Reloaded server configuration")
        subprocess.run([sys.executable, "-m", "natsjs", "--signal", "reload=%s" % pidfile],
                       check=True, timeout=10)
        wait_until(lambda: a.text().count("Reloaded server configuration") > n, "reload")

    reload("cluster { compression: s2_best }\n")
    after = routes()
    assert after == {rid: "s2_best" for rid in before}          # same connections
    reload("cluster { compression: off }\n")
    wait_until(lambda: len(routes()) == 4 and set(routes().values()) == {"off"}
               and not set(routes()) & set(before), "routes re-established uncompressed")

    flows(ref, a, "reloaded")


def test_compressed_route_bomb_is_refused_with_bounded_memory(procs):
    """A route peer cannot make the server expand a tiny S2 stream into gigabytes."""
    from natsjs._core.s2 import S2Writer
    a = start("natsjs", *cluster_args())
    procs.append(a)
    s = socket.create_connection(("127.0.0.1", a.cluster_port), timeout=TIMEOUT)
    s.recv(65536)
    s.sendall(b'CONNECT {"cluster":"C1","name":"NFAKE","headers":true}\r\n'
              b'INFO {"server_id":"NFAKE","server_name":"fake","cluster":"C1",'
              b'"compression":"s2_fast","headers":true}\r\n')
    s.recv(65536)                       # the compressed reply INFO
    zeros = S2Writer("fast").compress(b"\0" * (1 << 20))
    assert len(zeros) < 1 << 12          # 1 MiB of zeros costs a few dozen bytes
    try:
        for _ in range(3000):            # ~3 GiB once decoded
            s.sendall(zeros)
    except OSError:
        pass                             # closed on us, as it should be
    s.close()
    a.wait_for(re.compile(rb"maximum control line exceeded|S2"))
    assert a.alive()
    assert http_json(a, "/varz")["mem"] < 512 * 1024 * 1024


def test_reload_pins_a_new_account(procs, tmp_path):
    confs = [tmp_path / "a.conf", tmp_path / "b.conf"]
    for c in confs:
        c.write_text("accounts { X {} }\n")
    a = start("natsjs", "-c", str(confs[0]), "-P", str(tmp_path / "a.pid"), *cluster_args())
    procs.append(a)
    b = start("natsjs", "-c", str(confs[1]), "-P", str(tmp_path / "b.pid"),
              *cluster_args(routes=[a.cluster_port]))
    procs.append(b)
    wait_until(lambda: len(http_json(b, "/routez")["routes"]) == 4, "initial routes")
    import subprocess
    import sys
    for c, s, pid in ((confs[0], a, "a.pid"), (confs[1], b, "b.pid")):
        c.write_text("accounts { X {} }\ncluster { accounts: [X] }\n")
        subprocess.run([sys.executable, "-m", "natsjs", "--signal",
                        "reload=%s" % (tmp_path / pid)], check=True, timeout=10)
        s.wait_for(re.compile(rb"Reloaded server configuration"))
    wait_until(lambda: sorted(r.get("account", "") for r in http_json(b, "/routez")["routes"])
               == ["", "", "", "$SYS", "X"], "a dedicated route for X")


@pytest.mark.parametrize("kinds", [("natsjs", "reference", "natsjs"),
                                   ("reference", "natsjs", "reference")])
def test_every_server_routes_to_every_server_started_together(procs, kinds):
    """The JetStream clustering docs' style: each server lists all routes (itself too)
    and they start at once; dials cross and duplicates must resolve into one mesh."""
    def free():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    ports = [free() for _ in kinds]
    routes = ",".join("nats://127.0.0.1:%d" % p for p in ports)
    from conftest import ServerProcess, natsjs_command, reference_server_binary
    started = []
    for kind, port in zip(kinds, ports):
        http = free()
        args = ["-a", "127.0.0.1", "-p", "-1", "-m", str(http), "--cluster",
                "nats://127.0.0.1:%d" % port, "--cluster_name", "ALL", "--routes", routes]
        cmd = (natsjs_command() if kind == "natsjs" else [reference_server_binary()]) + args
        p = ServerProcess(cmd, args=args)
        procs.append(p)
        started.append(p)
    for p in started:
        p.start()
    wait_mesh(started)
    for p in started:
        wait_until(lambda: len(http_json(p, "/routez")["routes"]) == 8, "4 routes per peer")


def _read_until(sock, marker, timeout=TIMEOUT):
    """Bytes from ``sock`` up to and including the line holding ``marker``."""
    data = b""
    deadline = time.monotonic() + timeout
    while marker not in data or not data.endswith(b"\n"):
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError("connection closed before %r: %r" % (marker, data))
        data += chunk
    return data


def _closed_by_peer(sock, timeout=TIMEOUT):
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def _crossing_dials(procs, tmp_path, extra_info):
    """A natsjs server (no pooling) dialling a scripted peer that dials it back at the
    same time; the peer's own connection is registered first, natsjs's dial waits
    for the peer's INFO.  Returns the server, the peer's listening socket, both
    connections (natsjs's ``dialled``, the peer's ``mine``), the peer's INFO and the
    /routez entry of the peer's connection."""
    fake_id = "N" + "Z" * 55          # above any real id: an id order picks natsjs's
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    lsock.settimeout(TIMEOUT)
    fport = lsock.getsockname()[1]
    conf = tmp_path / "a.conf"
    conf.write_text("cluster { pool_size: -1, compression: off }\n")
    a = start("natsjs", "-c", str(conf), *cluster_args(routes=[fport]))
    procs.append(a)
    dialled, _ = lsock.accept()
    _read_until(dialled, b"CONNECT ")
    mine = socket.create_connection(("127.0.0.1", a.cluster_port), timeout=TIMEOUT)
    _read_until(mine, b"INFO ")
    info = json.dumps({"server_id": fake_id, "server_name": "fake", "cluster": "C1",
                       "headers": True, "host": "127.0.0.1", "port": fport,
                       **extra_info}).encode()
    mine.sendall(b'CONNECT {"name":"%s","cluster":"C1","headers":true}\r\nINFO %s\r\n'
                 % (fake_id.encode(), info))
    wait_until(lambda: remote_ids(a) == {fake_id}, "the scripted peer registered")
    [first] = http_json(a, "/routez")["routes"]
    assert not first["did_solicit"]
    return a, lsock, dialled, mine, info, first


def test_duplicate_route_keeps_the_connection_already_registered(procs, tmp_path):
    """Two servers that dial each other at once: nats-server keeps whichever
    connection it registered first and closes the newcomer (route.go
    handleDuplicateRoute).  A server that decided otherwise (say by comparing ids)
    would, next to a reference peer, close the one the peer kept: both go, and the
    pair churns.  A scripted peer registers on its own connection first, then
    answers natsjs's dial."""
    a, lsock, dialled, mine, info, kept = _crossing_dials(procs, tmp_path, {})
    dialled.sendall(b"INFO " + info + b"\r\n")        # natsjs's own dial now completes
    assert _closed_by_peer(dialled)                    # ... and is the duplicate
    [route] = http_json(a, "/routez")["routes"]
    assert route["rid"] == kept["rid"]
    assert route["did_solicit"]                        # it took over the dialled URL
    mine.sendall(b"PING\r\n")
    _read_until(mine, b"PONG")

    # The peer may have kept the other connection and closed this one: natsjs dials
    # again rather than stay apart.
    mine.close()
    again, _ = lsock.accept()
    assert _read_until(again, b"CONNECT ")
    for s in (dialled, again, lsock):
        s.close()


def test_natsjs_peers_dialling_at_once_keep_the_connection_of_the_lower_id(procs, tmp_path):
    """The same crossing dials with a natsjs peer (its INFO says so): both sides keep
    the connection dialled by the server whose id sorts first, whichever each
    registered first, so they never both close theirs (which left a pair of natsjs
    servers without a route for a second now and then when started together).  The
    scripted peer's id sorts after any real one: natsjs keeps its own dial and
    closes the peer's."""
    a, lsock, dialled, mine, info, first = _crossing_dials(procs, tmp_path,
                                                           {"natsjs": "0.1.0"})
    dialled.sendall(b"INFO " + info + b"\r\n")        # natsjs's own dial completes
    assert _closed_by_peer(mine)                       # ... and replaces the peer's
    wait_until(lambda: [r["rid"] for r in http_json(a, "/routez")["routes"]] not in
               ([], [first["rid"]]), "natsjs's own connection registered")
    [route] = http_json(a, "/routez")["routes"]
    assert route["did_solicit"] and route["remote_id"] == first["remote_id"]
    dialled.sendall(b"PING\r\n")
    _read_until(dialled, b"PONG")
    for s in (dialled, lsock):
        s.close()

RELOAD_ACCOUNTS = ("accounts { X { users: [{user: x, password: x}] }\n"
                   "           Y { users: [{user: y, password: y}] } }\n")
# FNV-1a puts Y on pool slot 0 of 3 and slot 3 of 5, so a resize moves it.
RELOAD_STEPS = [("pool_size: 3, accounts: [X]", 3, True),
                ("pool_size: 5, accounts: [X]", 5, True),
                ("pool_size: 5", 5, False),
                ("pool_size: 3", 3, False)]


@pytest.mark.parametrize("kinds", [("natsjs", "natsjs"), ("natsjs", "reference"),
                                   ("reference", "natsjs")])
def test_reload_pinning_and_pool_size_loses_no_message(procs, tmp_path, kinds):
    """A steady stream of numbered messages both ways in two accounts while the
    natsjs servers are reloaded to pin an account, grow the pool, unpin, shrink it.
    Every message arrives, once and in order.  (nats-server itself drops interest
    during such reloads; the nats-server peer here keeps its configuration.)"""
    import subprocess
    import sys

    def free():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    cports = [free(), free()]
    confs = [tmp_path / ("s%d.conf" % i) for i in range(2)]

    def write(i, cluster):
        routes = ", routes: [nats://127.0.0.1:%d]" % cports[0] if i else ""
        confs[i].write_text(RELOAD_ACCOUNTS + "cluster { name: C1, listen: 127.0.0.1:%d%s, %s }\n"
                            % (cports[i], routes, cluster))
    servers = []
    for i, kind in enumerate(kinds):
        write(i, "pool_size: 3")
        args = ["-c", str(confs[i]), "-P", str(tmp_path / ("s%d.pid" % i))]
        s = start(kind, *args)
        procs.append(s)
        servers.append(s)
    a, b = servers
    wait_until(lambda: all(len(http_json(s, "/routez")["routes"]) == 4 for s in servers),
               "3 pooled routes and the $SYS one")

    def layout(s):
        routes = http_json(s, "/routez")["routes"]
        return sum("account" not in r for r in routes), \
            sorted(r["account"] for r in routes if "account" in r)

    async def main():
        streams = []
        for acc in ("x", "y"):
            for src, dst in ((a, b), (b, a)):
                pub = await nats.connect("nats://%s:%s@127.0.0.1:%d" % (acc, acc, src.port))
                sub = await nats.connect("nats://%s:%s@127.0.0.1:%d" % (acc, acc, dst.port))
                got = []

                async def cb(msg, got=got):
                    got.append(int(msg.data))
                subject = "seq.%d" % len(streams)
                await sub.subscribe(subject, cb=cb)
                await sub.flush()
                streams.append({"pub": pub, "sub": sub, "subject": subject, "got": got,
                                "sent": 0, "what": "%s %d->%d" % (acc, src.port, dst.port)})
        running = asyncio.Event()
        running.set()

        async def publish(st):
            while running.is_set():
                st["sent"] += 1
                await st["pub"].publish(st["subject"], b"%d" % st["sent"])
                await asyncio.sleep(0.002)      # a steady rate, not synchronisation
            await st["pub"].flush()
        tasks = [asyncio.create_task(publish(st)) for st in streams]
        await await_until(lambda: all(st["got"] for st in streams), "every stream flowing")
        for cluster, pooled, pinned in RELOAD_STEPS:
            for i, s in enumerate(servers):
                if kinds[i] != "natsjs":
                    continue
                write(i, cluster)
                n = s.text().count("Reloaded server configuration")
                subprocess.run([sys.executable, "-m", "natsjs", "--signal",
                                "reload=%s" % (tmp_path / ("s%d.pid" % i))], check=True,
                               timeout=10)
                await await_until(lambda: s.text().count("Reloaded server configuration") > n,
                                  "reload")
            want = (pooled, ["$SYS", "X"] if pinned and "reference" not in kinds else ["$SYS"])
            await await_until(lambda: all(layout(s) == want for s in servers
                                          if s is a or kinds == ("natsjs", "natsjs")),
                              "routes after %r" % cluster)
        running.clear()
        await asyncio.gather(*tasks)
        await await_until(lambda: all(st["got"] and st["got"][-1] == st["sent"]
                                      for st in streams), "the last messages")
        for st in streams:
            got = st["got"]
            assert got == list(range(got[0], st["sent"] + 1)), (
                st["what"], sorted(set(range(got[0], st["sent"] + 1)) - set(got))[:20],
                len(got) - len(set(got)))
            await st["pub"].close()
            await st["sub"].close()
    run(main())
    if "reference" in kinds:
        # The reference peer does not pin X, refused the dedicated connection once,
        # and natsjs carried X on the pool to it.
        assert "No route for account" in servers[kinds.index("reference")].text()


def test_reference_reload_pinning_an_account_is_answered(procs, tmp_path):
    """nats-server pins an account on reload by asking its peers first (an INFO with
    route_acc_add_reqid, answered with route_account cleared; reload.go) and waits up
    to 2 s for the answers.  natsjs answers, and dials the dedicated connection
    itself since here nats-server has no route to it configured."""
    import signal
    port = _free_port()
    conf = tmp_path / "ref.conf"

    def write(extra):
        conf.write_text(RELOAD_ACCOUNTS + "cluster { name: C1, listen: 127.0.0.1:%d%s }\n"
                        % (port, extra))
    write("")
    ref = start("reference", "-c", str(conf))
    procs.append(ref)
    ours_conf = tmp_path / "ours.conf"
    ours_conf.write_text(RELOAD_ACCOUNTS)
    ours = start("natsjs", "-c", str(ours_conf), *cluster_args(routes=[port]))
    procs.append(ours)
    wait_until(lambda: len(http_json(ref, "/routez")["routes"]) == 4, "pooled routes")
    write(", accounts: [X]")
    ref.proc.send_signal(signal.SIGHUP)
    ref.wait_for(re.compile(rb"Reloaded server configuration"))
    for s in (ref, ours):
        wait_until(lambda: sorted(r.get("account", "") for r in http_json(s, "/routez")
                                  ["routes"]) == ["", "", "", "$SYS", "X"],
                   "a dedicated route for X")
    assert "Timed out waiting for confirmation" not in ref.text()

    flows(ref, ours, "pinned", user="x")
    flows(ours, ref, "pinned", user="x")


async def _crosses(pub, sub, subject, probe):
    """Whether ``subject`` published on ``pub`` reaches ``sub``'s connection, proven by
    ``probe`` (subscribed there, published after it): no waiting for a timeout."""
    s = await sub.subscribe(subject)
    p = await sub.subscribe(probe)
    await sub.flush()
    await until_delivered(pub, p, probe)        # interest has crossed by now
    await pub.publish(subject, b"x")
    await pub.publish(probe, b"after")
    await pub.flush()
    while (await p.next_msg(timeout=TIMEOUT)).data != b"after":
        pass
    await p.unsubscribe()
    # Messages of one publisher keep their order: anything on subject came first.
    crossed = s.pending_msgs > 0
    await drain(s)
    return s, crossed


@pytest.mark.parametrize("kinds", [("natsjs", "reference"), ("reference", "natsjs"),
                                   ("natsjs", "natsjs")])
def test_cluster_permissions_import_and_export(procs, tmp_path, kinds):
    """``cluster { permissions { import, export } }`` on server A: it sends interest
    only for subjects it may import and takes a peer's interest only for subjects it
    may export (route.go canImport/canExport).  natsjs applies its own, shows them to
    nats-server (which lists them in /routez), and follows a nats-server peer's: a
    reload that widens them lets interest cross that was held back, both ways."""
    import signal
    port = _free_port()
    conf = tmp_path / "a.conf"
    perms = ("cluster { name: C1, listen: 127.0.0.1:%d, permissions { import: [%s], "
             "export: { allow: [%s], deny: \"out.secret\" } } }\n")
    imports, exports = '"in.>", "probe.>"', '"out.>", "probe.>"'
    conf.write_text(perms % (port, imports, exports))
    a = start(kinds[0], "-c", str(conf))
    procs.append(a)
    b = start(kinds[1], *cluster_args(routes=[port]))
    procs.append(b)
    wait_mesh([a, b])
    if kinds[1] == "reference":
        routes = http_json(b, "/routez")["routes"]
        assert routes[0]["import"] == {"allow": ["in.>", "probe.>"]}
        assert routes[0]["export"] == {"allow": ["out.>", "probe.>"], "deny": ["out.secret"]}

    async def main():
        na, nb = await connect(a), await connect(b)
        # import: B's messages reach A only on subjects A may import
        assert (await _crosses(nb, na, "in.x", "probe.1"))[1]
        other, crossed = await _crosses(nb, na, "other", "probe.2")
        assert not crossed
        # export: A's messages reach B only on subjects A may export
        assert (await _crosses(na, nb, "out.x", "probe.3"))[1]
        assert not (await _crosses(na, nb, "out.secret", "probe.4"))[1]
        later, crossed = await _crosses(na, nb, "later", "probe.5")
        assert not crossed

        # The reload widens both lists; the live subscriptions above now cross.
        conf.write_text(perms % (port, imports + ', "other"', exports + ', "later"'))
        n = a.text().count("Reloaded server configuration")
        a.proc.send_signal(signal.SIGHUP)
        await await_until(lambda: a.text().count("Reloaded server configuration") > n,
                          "reload")
        for pub, s, subject in ((nb, other, "other"), (na, later, "later")):
            await until_delivered(pub, s, subject)
        await na.close()
        await nb.close()
    run(main())


@pytest.mark.parametrize("block,expect", [
    ('permissions { import: "a.>", export: { allow: ["b.*"], deny: "b.x" } }', "ok"),
    ('authorization { user: r, password: p, permissions { import: "a.>" } }', "deprecated"),
    ('permissions { import: "a.>", allow_responses: true }', "error"),
    ('permissions { export: ["foo bar"] }', "error"),
    ('permissions { import: "a..b" }', "error"),
    ('permissions { bogus: "a" }', "error"),
])
def test_cluster_permissions_config_is_checked_like_the_reference(tmp_path, block, expect):
    """Both servers check the file (-t) alike; the deprecated place inside the cluster
    authorization block is taken with a warning (nats-server's -t, pedantic, fails
    on the warning)."""
    import subprocess
    import sys
    from conftest import reference_server_binary
    path = tmp_path / "c.conf"
    path.write_text("cluster { listen: 127.0.0.1:-1, %s }\n" % block)

    def check(cmd):
        return subprocess.run(cmd + ["-t", "-c", str(path)], capture_output=True, text=True,
                              timeout=TIMEOUT)
    ours, ref = check([sys.executable, "-m", "natsjs"]), check([reference_server_binary()])
    assert (ours.returncode == 0) == (expect != "error"), ours.stderr
    if expect == "deprecated":
        assert "within cluster authorization block is deprecated" in ref.stderr
    else:
        assert (ref.returncode == 0) == (expect == "ok"), ref.stderr
    if expect != "error":
        from natsjs.config import load_config
        warnings = []
        perms = load_config(str(path), warn=warnings.append).cluster.permissions
        assert perms.publish.allow == ("a.>",)
        assert bool(warnings) == (expect == "deprecated")


def test_a_peer_cannot_hold_subscriptions_without_bound(procs):
    """``--cluster_max_subs``: past it, a peer's new interest is ignored with an error
    log (at most every 10 s), the route stays up, and interest withdrawn makes room.
    nats-server itself has no bound on a route, and natsjs sends it no -ERR (it
    would drop the route and send everything again)."""
    a = start("natsjs", *cluster_args(extra=["--cluster_max_subs", "120"]))
    procs.append(a)
    ref = start("reference", *cluster_args(routes=[a.cluster_port]))
    procs.append(ref)
    wait_mesh([a, ref])
    limit_line = re.compile(rb"maximum subscriptions exceeded")

    async def main():
        na, nr = await connect(a), await connect(ref)
        probe = await nr.subscribe("probe")
        await nr.flush()
        await until_delivered(na, probe, "probe")
        subs = [await nr.subscribe("s.%d" % i) for i in range(150)]
        await nr.flush()
        await await_until(lambda: limit_line.search(a.log), "the limit to be hit")
        rids = {r["rid"] for r in http_json(a, "/routez")["routes"]}
        for subject in ("s.0", "s.149", "probe"):
            await na.publish(subject, b"x")
        await na.flush()
        await probe.next_msg(timeout=TIMEOUT)
        await drain(probe)
        assert subs[0].pending_msgs == 1 and subs[149].pending_msgs == 0
        assert {r["rid"] for r in http_json(a, "/routez")["routes"]} == rids
        assert len(limit_line.findall(a.log)) == 1
        # Withdrawn interest makes room again.
        for s in subs[:100]:
            await s.unsubscribe()
        again = await nr.subscribe("again")
        await nr.flush()
        await until_delivered(na, again, "again")
        await na.close()
        await nr.close()
    run(main())


def test_gossip_dials_only_plausible_peers_and_not_too_many_at_once(procs):
    """A route peer's INFO about other servers (processImplicitRoute) can name any
    address: natsjs dials only what looks like a cluster member, not itself, and at
    most 32 gossiped routes at once."""
    import select
    fake_id = "N" + "F" * 55
    a = start("natsjs", "-D", *cluster_args())
    procs.append(a)
    peer = socket.create_connection(("127.0.0.1", a.cluster_port), timeout=TIMEOUT)
    _read_until(peer, b"INFO ")
    peer.sendall(b'CONNECT {"name":"%s","cluster":"C1","headers":true}\r\nINFO {"server_id":'
                 b'"%s","server_name":"fake","cluster":"C1","headers":true,"port":1}\r\n'
                 % (fake_id.encode(), fake_id.encode()))
    wait_until(lambda: remote_ids(a) == {fake_id}, "the scripted peer registered")

    def listener():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        s.setblocking(False)
        return s
    bait, targets = listener(), [listener() for _ in range(40)]

    def gossip(sid, ip):
        info = {"server_id": sid, "server_name": sid, "cluster": "C1", "ip": ip}
        peer.sendall(b"INFO " + json.dumps(info).encode() + b"\r\n")
    bait_url = "nats-route://127.0.0.1:%d/" % bait.getsockname()[1]
    gossip("not an id!", bait_url)
    gossip("NBOGUS1", "http://127.0.0.1:%d/" % bait.getsockname()[1])
    gossip("NBOGUS2", "nats-route://127.0.0.1:%d/" % a.cluster_port)     # itself
    for i, t in enumerate(targets):
        gossip("NGOSSIP%d" % i, "nats-route://127.0.0.1:%d/" % t.getsockname()[1])
    wait_until(lambda: a.text().count("implicit routes are being dialled already") == 8,
               "the 8 gossiped routes over the bound to be refused")
    accepted = []
    deadline = time.monotonic() + TIMEOUT
    while len(accepted) < 32 and time.monotonic() < deadline:
        ready, _, _ = select.select(targets, [], [], 0.5)
        for t in ready:
            accepted.append(t.accept()[0])
    assert len(accepted) == 32
    assert not select.select(targets + [bait], [], [], 0)[0]
    for s in accepted + targets + [bait, peer]:
        s.close()


@pytest.mark.parametrize("kinds", [("natsjs", "reference", "natsjs"),
                                   ("reference", "natsjs", "natsjs")])
def test_members_that_meet_through_gossip_get_every_connection(procs, kinds):
    """Two servers that route to a seed meet through gossip; their dedicated ($SYS)
    connection comes from the seed gossiping dedicated routes too
    (forwardNewRouteInfoToKnownServers with route_account)."""
    servers = three(procs, kinds)
    for s in servers:
        wait_until(lambda: sorted(r.get("account", "") for r in http_json(s, "/routez")
                                  ["routes"]) == [""] * 6 + ["$SYS"] * 2,
                   "3 pooled and 1 $SYS route to each of 2 peers")
