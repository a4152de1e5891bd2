"""Authentication, permissions, accounts and $SYS requests, as a user configures them.

Each scenario runs the same configuration file on natsjs and on the reference
nats-server, and checks what nats-py sees.
"""
import json

import bcrypt
import nkeys
import pytest
from nats.errors import TimeoutError as NatsTimeout

from conftest import settle, start_natsjs, start_reference
from helpers import connect, run

TIMEOUT = 10
SEED = b"SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU"
HASH = bcrypt.hashpw(b"b-secret", bcrypt.gensalt(rounds=4)).decode()
NKEY = nkeys.from_seed(SEED).public_key.decode()

CONFIG = """
authorization {
  timeout: 1
  users = [
    { user: alice, password: a-secret }
    { user: bob, password: "%(hash)s" }
    { user: limited, password: l,
      permissions: { publish: { allow: ["ok.>", "_INBOX.>"], deny: ["ok.secret"] },
                     subscribe: { allow: ["ok.>", "_INBOX.>"] } } }
    { user: svc, password: s,
      permissions: { publish: { deny: ">" }, subscribe: "req.>", allow_responses: true } }
    { nkey: %(nkey)s }
  ]
}
""" % {"hash": HASH, "nkey": NKEY}

ACCOUNTS = """
accounts {
  A {
    users = [ { user: a, password: a } ]
    exports = [ { stream: "feed.>" }, { service: "help.*" } ]
  }
  B {
    users = [ { user: b, password: b } ]
    imports = [
      { stream: { account: A, subject: "feed.>" } }
      { service: { account: A, subject: "help.me" }, to: "ask.a" }
    ]
  }
  C { users = [ { user: c, password: c } ] }
  $SYS { users = [ { user: admin, password: "%(hash)s" } ] }
}
""" % {"hash": HASH}


def _server(kind, tmp_path, text):
    path = tmp_path / "server.conf"
    path.write_text(text)
    return (start_natsjs if kind == "natsjs" else start_reference)("-c", str(path))


@pytest.fixture(params=["natsjs", "reference"])
def auth_server(request, tmp_path):
    s = _server(request.param, tmp_path, CONFIG)
    yield s
    s.stop()


@pytest.fixture(params=["natsjs", "reference"])
def accounts_server(request, tmp_path):
    s = _server(request.param, tmp_path, ACCOUNTS)
    yield s
    s.stop()


async def refused(server, **kw):
    with pytest.raises(Exception) as info:
        nc = await connect(server, **kw)
        await nc.close()
    assert "authorization violation" in str(info.value).lower()


def test_passwords_plain_and_bcrypt(auth_server):
    async def main():
        for user, pw in (("alice", "a-secret"), ("bob", "b-secret")):
            nc = await connect(auth_server, user=user, password=pw)
            sub = await nc.subscribe("x")
            await nc.publish("x", b"hi")
            assert (await sub.next_msg(timeout=TIMEOUT)).data == b"hi"
            await nc.close()
        await refused(auth_server, user="alice", password="wrong")
        await refused(auth_server, user="bob", password=HASH)   # the hash is not the password
        await refused(auth_server, user="nobody", password="x")
        await refused(auth_server)
    run(main())


def test_nkey_user(auth_server, tmp_path):
    async def main():
        seed = tmp_path / "user.nk"
        seed.write_bytes(SEED)
        nc = await connect(auth_server, nkeys_seed=str(seed))
        await nc.flush()
        await nc.close()
        other = nkeys.from_seed(b"SUAGMJH5XLGZKQQWAWKRZJIGMOU4HPFUYLXJMXOO5NLFEO2OOQJ5LPRDPM")
        bad = tmp_path / "other.nk"
        bad.write_bytes(other.seed)
        await refused(auth_server, nkeys_seed=str(bad))
    run(main())


def test_publish_and_subscribe_permissions(auth_server):
    async def main():
        errors = []

        async def on_error(e):
            errors.append(str(e))
        nc = await connect(auth_server, user="limited", password="l", error_cb=on_error)
        sub = await nc.subscribe("ok.>")
        await nc.publish("ok.fine", b"1")
        await nc.publish("ok.secret", b"2")            # denied
        await nc.publish("elsewhere", b"3")            # not allowed
        await nc.flush()
        assert (await sub.next_msg(timeout=TIMEOUT)).data == b"1"
        with pytest.raises(NatsTimeout):
            await sub.next_msg(timeout=0.3)
        await nc.subscribe("forbidden.topic")
        await nc.flush()
        for _ in range(50):
            if len(errors) >= 3:
                break
            await nc.flush()
        joined = "\n".join(errors).lower()
        assert 'permissions violation for publish to "ok.secret"' in joined
        assert 'permissions violation for publish to "elsewhere"' in joined
        assert 'permissions violation for subscription to "forbidden.topic"' in joined
        assert nc.is_connected                        # violations do not close the connection
        await nc.close()
    run(main())


def test_allow_responses(auth_server):
    async def main():
        svc = await connect(auth_server, user="svc", password="s")
        errors = []

        async def on_error(e):
            errors.append(str(e))
        svc._error_cb = on_error

        async def answer(msg):
            await msg.respond(b"answer")
            await svc.publish(msg.reply, b"second answer is not allowed")
        await svc.subscribe("req.q", cb=answer)
        await settle(svc)
        client = await connect(auth_server, user="alice", password="a-secret")
        inbox = client.new_inbox()
        replies = await client.subscribe(inbox)
        await client.publish("req.q", b"?", reply=inbox)
        assert (await replies.next_msg(timeout=TIMEOUT)).data == b"answer"
        with pytest.raises(NatsTimeout):
            await replies.next_msg(timeout=0.3)
        await svc.publish("req.q", b"direct publish denied")
        await svc.flush()
        assert any("permissions violation for publish" in e.lower() for e in errors)
        await svc.close()
        await client.close()
    run(main())


def test_auth_timeout(auth_server):
    import socket
    s = socket.create_connection(("127.0.0.1", auth_server.port), timeout=TIMEOUT)
    data = b""
    while not data.endswith(b"<EOF>"):
        chunk = s.recv(4096)
        data += chunk if chunk else b"<EOF>"
    s.close()
    assert b'"auth_required":true' in data
    assert b"-ERR 'Authentication Timeout'" in data


def test_ops_before_connect_are_refused(auth_server):
    import socket
    s = socket.create_connection(("127.0.0.1", auth_server.port), timeout=TIMEOUT)
    s.recv(4096)
    s.sendall(b"SUB foo 1\r\n")
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    assert data == b"-ERR 'Authorization Violation'\r\n"


def test_accounts_isolation_and_imports(accounts_server):
    async def main():
        a = await connect(accounts_server, user="a", password="a")
        b = await connect(accounts_server, user="b", password="b")
        c = await connect(accounts_server, user="c", password="c")
        b_feed = await b.subscribe("feed.>")
        c_feed = await c.subscribe("feed.>")
        a_private = await a.subscribe("private")
        await settle(b, c)

        async def helper(msg):
            await msg.respond(b"helped:" + msg.data)
        await a.subscribe("help.*", cb=helper)
        await settle(a)

        await a.publish("feed.news", b"exported")
        await c.publish("private", b"from c")         # same subject, other account
        await a.flush()
        await c.flush()
        got = await b_feed.next_msg(timeout=TIMEOUT)
        assert (got.subject, got.data) == ("feed.news", b"exported")
        with pytest.raises(NatsTimeout):
            await c_feed.next_msg(timeout=0.3)        # C imports nothing
        with pytest.raises(NatsTimeout):
            await a_private.next_msg(timeout=0.3)     # accounts are isolated

        reply = await b.request("ask.a", b"please", timeout=TIMEOUT)
        assert reply.data == b"helped:please"
        for nc in (a, b, c):
            await nc.close()
    run(main())


def test_system_account_requests(accounts_server):
    async def main():
        admin = await connect(accounts_server, user="admin", password="b-secret")
        info = admin._server_info
        ping = await admin.request("$SYS.REQ.SERVER.PING", b"", timeout=TIMEOUT)
        body = json.loads(ping.data)
        assert body["server"]["id"] == info["server_id"]
        assert body["statsz"]["connections"] >= 1
        varz = json.loads((await admin.request("$SYS.REQ.SERVER.PING.VARZ", b"",
                                               timeout=TIMEOUT)).data)
        assert varz["data"]["server_id"] == info["server_id"]
        direct = json.loads((await admin.request(
            "$SYS.REQ.SERVER.%s.VARZ" % info["server_id"], b"", timeout=TIMEOUT)).data)
        assert direct["data"]["server_id"] == info["server_id"]
        connz = json.loads((await admin.request(
            "$SYS.REQ.SERVER.PING.CONNZ", json.dumps({"subscriptions": True}).encode(),
            timeout=TIMEOUT)).data)
        assert connz["data"]["num_connections"] >= 1
        assert any("subscriptions_list" in c for c in connz["data"]["connections"])
        # STATSZ answers as the plain PING does (events.go statszReq), HEALTHZ carries
        # the status code that /healthz gives as its HTTP status
        statsz = json.loads((await admin.request("$SYS.REQ.SERVER.PING.STATSZ", b"",
                                                 timeout=TIMEOUT)).data)
        assert statsz["statsz"]["connections"] >= 1 and "data" not in statsz
        health = json.loads((await admin.request("$SYS.REQ.SERVER.PING.HEALTHZ", b"",
                                                 timeout=TIMEOUT)).data)
        assert health["data"] == {"status": "ok", "status_code": 200}
        await admin.close()
        # a user outside the system account cannot reach these
        a = await connect(accounts_server, user="a", password="a")
        with pytest.raises(Exception):
            await a.request("$SYS.REQ.SERVER.PING", b"", timeout=0.5)
        await a.close()
    run(main())


def test_token_and_user_flags(natsjs_server, reference_server):
    for start in (natsjs_server, reference_server):
        s = start("--auth", "t0k3n")

        async def main():
            nc = await connect(s, token="t0k3n")
            await nc.flush()
            await nc.close()
            await refused(s, token="wrong")
        run(main())
        u = start("--user", "u", "--pass", "p")

        async def main2():
            nc = await connect(u, user="u", password="p")
            await nc.flush()
            await nc.close()
            await refused(u, user="u", password="q")
        run(main2())


DENY = """
authorization { users = [
  { user: watcher, password: w, permissions: { subscribe: { allow: ">", deny: "secret.>" } } }
  { user: pub, password: p }
] }
"""


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_wildcard_subscription_does_not_receive_denied_subjects(kind, tmp_path):
    s = _server(kind, tmp_path, DENY)
    try:
        async def main():
            w = await connect(s, user="watcher", password="w")
            p = await connect(s, user="pub", password="p")
            everything = await w.subscribe(">")
            await settle(w)
            await p.publish("secret.plans", b"no")
            await p.publish("public.news", b"yes")
            await p.flush()
            got = await everything.next_msg(timeout=TIMEOUT)
            assert got.subject == "public.news"
            with pytest.raises(NatsTimeout):
                await everything.next_msg(timeout=0.3)
            await w.close()
            await p.close()
        run(main())
    finally:
        s.stop()


SWITCH = """
accounts {
  A { users = [ { user: a, password: a } ] }
  B { users = [ { user: b, password: b } ] }
}
"""


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_second_connect_into_another_account_drops_old_subscriptions(kind, tmp_path):
    import socket
    s = _server(kind, tmp_path, SWITCH)
    try:
        raw = socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT)
        raw.recv(4096)
        raw.sendall(b'CONNECT {"verbose":false,"user":"a","pass":"a"}\r\nSUB foo 1\r\nPING\r\n')
        buf = b""
        while b"PONG" not in buf:
            buf += raw.recv(4096)
        raw.sendall(b'CONNECT {"verbose":false,"user":"b","pass":"b"}\r\nPING\r\n')
        buf = b""
        while b"PONG" not in buf:
            buf += raw.recv(4096)

        async def main():
            a = await connect(s, user="a", password="a")
            await a.publish("foo", b"for account A")
            await a.flush()
            await a.close()
        run(main())
        raw.sendall(b"PING\r\n")
        buf = b""
        while b"PONG" not in buf:
            buf += raw.recv(4096)
        assert b"MSG foo" not in buf       # the switched connection left account A behind
        raw.close()
    finally:
        s.stop()


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_second_connect_into_another_account_publishes_there(kind, tmp_path):
    """A connection that moves to account B publishes in B only, even when B's and A's
    subscription lists happen to have changed the same number of times."""
    import socket
    s = _server(kind, tmp_path, SWITCH)
    try:
        async def main():
            in_a = await connect(s, user="a", password="a")
            sub_a = await in_a.subscribe("foo")            # one change in A
            await settle(in_a)
            raw = socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT)
            raw.recv(4096)

            def round_trip(data):
                raw.sendall(data + b"PING\r\n")
                buf = b""
                while b"PONG" not in buf:
                    buf += raw.recv(4096)
            round_trip(b'CONNECT {"verbose":false,"user":"a","pass":"a"}\r\nPUB foo 3\r\none\r\n')
            in_b = await connect(s, user="b", password="b")
            await in_b.subscribe("bar")                      # one change in B
            await settle(in_b)
            round_trip(b'CONNECT {"verbose":false,"user":"b","pass":"b"}\r\nPUB foo 3\r\ntwo\r\n')
            raw.close()
            await settle(in_a)
            assert (await sub_a.next_msg(timeout=TIMEOUT)).data == b"one"
            with pytest.raises(NatsTimeout):
                await sub_a.next_msg(timeout=0.3)          # "two" was published in B
            await in_a.close()
            await in_b.close()
        run(main())
    finally:
        s.stop()


SLOW_HASH = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=12)).decode()
SLOW = """
authorization {
  users = [
    { user: x, password: x }
    { user: bob, password: "%s" }
  ]
}
""" % SLOW_HASH


def _until(sock, marker: bytes) -> bytes:
    buf = b""
    while marker not in buf:
        chunk = sock.recv(4096)
        assert chunk, buf
        buf += chunk
    return buf


def _raw_client(server, connect: bytes):
    """A raw connection that has sent ``CONNECT <connect>`` and had its PONG."""
    import socket
    c = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
    c.recv(4096)
    c.sendall(b"CONNECT " + connect + b"\r\nPING\r\n")
    _until(c, b"PONG")
    return c


def _ping(sock) -> None:
    sock.sendall(b"PING\r\n")
    _until(sock, b"PONG")


def _refused_only_now(socks) -> None:
    """None of ``socks`` has been refused yet, and each of them is refused later."""
    for b in socks:
        b.setblocking(False)
        try:
            early = b.recv(4096)
        except BlockingIOError:
            early = b""
        assert b"Authorization Violation" not in early, "a password check held the PONG back"
    for b in socks:
        b.setblocking(True)
        _until(b, b"Authorization Violation")
        b.close()


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_password_hashing_does_not_hold_up_other_clients(kind, tmp_path):
    """Connections that send wrong passwords for a bcrypt user cost their own time: a
    client already connected gets its PONG while their checks are still running."""
    import socket
    import time
    conf = tmp_path / "slow.conf"
    conf.write_text(SLOW)
    s = (start_natsjs if kind == "natsjs" else start_reference)("-c", str(conf), "-V")
    try:
        x = _raw_client(s, b'{"verbose":false,"user":"x","pass":"x"}')
        bad = []
        for _ in range(4):
            b = socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT)
            b.recv(4096)
            bad.append(b)
        for b in bad:
            b.sendall(b'CONNECT {"verbose":false,"user":"bob","pass":"wrong"}\r\nPING\r\n')
        # Every bad CONNECT has been read (the trace shows it) before we ping.
        deadline = time.monotonic() + TIMEOUT
        while s.text().count('"user":"bob"') < 4:
            assert time.monotonic() < deadline, s.text()
            time.sleep(0.01)
        _ping(x)
        _refused_only_now(bad)
        x.close()
    finally:
        s.stop()


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_route_password_hashing_does_not_hold_up_clients(kind, tmp_path):
    import re
    import socket
    conf = tmp_path / "cluster.conf"
    conf.write_text('cluster { name: C, listen: "127.0.0.1:-1", authorization { user: r, '
                    'password: "%s" } }\n' % SLOW_HASH)
    start_fn = start_natsjs if kind == "natsjs" else start_reference
    s = start_fn("-c", str(conf))
    try:
        port = int(s.wait_for(re.compile(rb"Listening for route connections on [^\s:]+:(\d+)"))
                   .group(1))
        x = _raw_client(s, b'{"verbose":false}')
        bad = []
        for i in range(4):
            b = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
            b.recv(4096)
            b.sendall(b'CONNECT {"verbose":false,"user":"r","pass":"wrong","name":"N%d"}\r\n'
                      % i)
            bad.append(b)
        _ping(x)
        _refused_only_now(bad)
        x.close()
    finally:
        s.stop()


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_reload_checks_changed_password_hashes_without_holding_up_clients(kind, tmp_path):
    import re
    import signal
    import socket
    conf = tmp_path / "slow.conf"
    conf.write_text(SLOW)
    s = (start_natsjs if kind == "natsjs" else start_reference)("-c", str(conf), "-D")
    try:
        x = _raw_client(s, b'{"verbose":false,"user":"x","pass":"x"}')
        victims = [_raw_client(s, b'{"verbose":false,"user":"bob","pass":"right"}')
                   for _ in range(3)]
        # bob's password changes: each of his connections must be checked again
        conf.write_text(SLOW.replace(SLOW_HASH, bcrypt.hashpw(
            b"changed", bcrypt.gensalt(rounds=12)).decode()))
        s.proc.send_signal(signal.SIGHUP)
        s.wait_for(re.compile(rb"Trapped"))
        _ping(x)
        _refused_only_now(victims)
        x.close()
    finally:
        s.stop()
