"""Service imports as users run them: in a cluster, and against responders that misbehave.

Each scenario runs on natsjs and on the reference nats-server with the same
configuration, and checks what nats-py sees.
"""
import asyncio
import re
import socket
from functools import partial

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeout

from conftest import settle, start_natsjs, start_reference
from test_cluster import cluster_args, procs, start, wait_mesh  # noqa: F401 (fixture)
import helpers

run = partial(helpers.run, timeout=90)

TIMEOUT = 10

SERVICE = """
accounts {
  A {
    users = [ { user: a, password: a } ]
    exports = [ { service: "svc.>" } ]
  }
  B {
    users = [ { user: b, password: b } ]
    imports = [ { service: { account: A, subject: "svc.>" } } ]
  }
}
"""


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_service_import_requests_reach_the_responder_once_in_a_cluster(kind, tmp_path, procs):
    conf = tmp_path / "svc.conf"
    conf.write_text(SERVICE)
    seed = start(kind, "-c", str(conf), *cluster_args())
    procs.append(seed)
    for _ in range(2):
        procs.append(start(kind, "-c", str(conf), *cluster_args(routes=[seed.cluster_port])))
    wait_mesh(procs)
    first, second, third = procs

    async def main():
        calls = []
        responder = await nats.connect(second.url, user="a", password="a")

        async def answer(msg):
            calls.append(msg.data)
            await msg.respond(b"re:" + msg.data)
        await responder.subscribe("svc.>", cb=answer)
        await settle(responder)
        requester = await nats.connect(third.url, user="b", password="b")
        # Interest crosses the routes a moment after the SUB: ask until it answers.
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while True:
            try:
                await requester.request("svc.warmup", b"w", timeout=0.5)
                break
            except (NatsTimeout, nats.errors.NoRespondersError):
                assert asyncio.get_running_loop().time() < deadline, "service never answered"
        await settle(responder)
        calls.clear()
        for i in range(10):
            reply = await requester.request("svc.echo", b"%d" % i, timeout=TIMEOUT)
            assert reply.data == b"re:%d" % i
        # Late duplicates would arrive through the routes: a final round trip on each
        # connection, through the responder's server, lets them show up.
        await requester.request("svc.echo", b"last", timeout=TIMEOUT)
        await settle(requester, responder)
        assert calls.count(b"last") == 1
        assert len(calls) == 11, calls
        await requester.close()
        await responder.close()
    run(main())


# Responses are mapped back to the requester through a reply subject in A's
# reserved _R_ namespace; nothing outside the server may predict or claim one.
FORGE = """
accounts {
  A {
    users = [
      { user: a, password: a }
      { user: m, password: m, permissions: { subscribe: "other.>" } }
    ]
    exports = [ { service: "svc.>" } ]
  }
  B {
    users = [ { user: b, password: b } ]
    imports = [ { service: { account: A, subject: "svc.>" } } ]
  }
}
"""


def _server(kind, tmp_path, text):
    conf = tmp_path / "server.conf"
    conf.write_text(text)
    return (start_natsjs if kind == "natsjs" else start_reference)("-c", str(conf))


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_service_replies_cannot_be_predicted_by_another_client(kind, tmp_path):
    s = _server(kind, tmp_path, FORGE)
    try:
        async def main():
            seen = []
            responder = await nats.connect(s.url, user="a", password="a")

            async def answer(msg):
                seen.append(msg.reply)
                if msg.data == b"first":
                    await msg.respond(b"genuine")
                # the second request is left unanswered
            await responder.subscribe("svc.>", cb=answer)
            await settle(responder)
            requester = await nats.connect(s.url, user="b", password="b")
            assert (await requester.request("svc.x", b"first", timeout=TIMEOUT)).data \
                == b"genuine"
            first = seen[0]
            assert first.startswith("_R_.")
            # A client of A that cannot see the requests guesses the next reply
            # subject from one it learnt, and answers before the responder does.
            mallory = await nats.connect(s.url, user="m", password="m")
            pending = asyncio.ensure_future(requester.request("svc.x", b"second", timeout=2))
            while len(seen) < 2:
                await asyncio.sleep(0.01)
            for guess in _guesses(first):
                await mallory.publish(guess, b"forged")
            await settle(mallory)
            with pytest.raises(NatsTimeout):
                await pending
            second = seen[1]
            assert second != first and second not in _guesses(first)
            # Reply tokens carry enough randomness that a guess is hopeless.
            assert len(second.split(".")[-1]) >= 6
            for nc in (responder, requester, mallory):
                await nc.close()
        run(main())
    finally:
        s.stop()


def _guesses(reply: str) -> list[str]:
    """Subjects a forger would try after seeing ``reply``: neighbours of a number."""
    head, _, last = reply.rpartition(".")
    if last.isdigit():
        n = int(last)
        return ["%s.%d" % (head, n + k) for k in range(1, 20)]
    return ["%s.%s" % (head, last[:-1] + c) for c in "0123456789"]


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_clients_may_not_use_a_reserved_reply_subject(kind, tmp_path):
    s = _server(kind, tmp_path, SERVICE)
    try:
        raw = socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT)
        raw.recv(4096)
        raw.sendall(b'CONNECT {"verbose":false,"pedantic":false,"user":"a","pass":"a"}\r\n'
                    b"SUB svc.x 1\r\nPUB svc.x _R_.abcdef.ghijkl 2\r\nhi\r\n"
                    b"PUB svc.x _INBOX.ok 2\r\nok\r\nPING\r\n")
        buf = b""
        while b"PONG" not in buf:
            chunk = raw.recv(4096)
            assert chunk, buf
            buf += chunk
        raw.close()
        assert b"-ERR 'Permissions Violation for Publish with Reply of \"_R_.abcdef.ghijkl\"'" \
            in buf
        # the offending message was dropped, the connection and the next one went on
        assert buf.count(b"MSG svc.x 1") == 1 and b"_INBOX.ok" in buf
    finally:
        s.stop()


def test_pending_service_responses_are_bounded(monkeypatch):
    from natsjs import accounts
    monkeypatch.setattr(accounts, "MAX_PENDING_RESPONSES", 50)
    exporter, importer = accounts.Account("A"), accounts.Account("B")
    tokens = [exporter.map_reply(importer, b"_INBOX.%d" % i, "singleton") for i in range(500)]
    assert len(exporter._responses) <= 50
    # the newest mappings are the ones kept
    assert tokens[-1] in exporter._responses
    assert tokens[0] not in exporter._responses
    assert len(set(tokens)) == 500
    assert all(re.fullmatch(rb"_R_\.[0-9A-Za-z]+\.[0-9A-Za-z]{10,}", t) for t in tokens)


def _service_chain(n: int) -> str:
    """A0 imports svc from A1, which imports it from A2 ... up to A<n-1>."""
    accounts = []
    for i in range(n):
        body = "users = [ { user: u%d, password: p } ]\n    exports = [ { service: svc } ]" % i
        if i < n - 1:
            body += "\n    imports = [ { service: { account: A%d, subject: svc } } ]" % (i + 1)
        accounts.append("  A%d {\n    %s\n  }" % (i, body))
    return "accounts {\n%s\n}\n" % "\n".join(accounts)


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_a_long_chain_of_service_imports_answers(kind, tmp_path):
    n = 12
    s = _server(kind, tmp_path, _service_chain(n))
    try:
        async def main():
            responder = await nats.connect(s.url, user="u%d" % (n - 1), password="p")

            async def answer(msg):
                await msg.respond(b"answer")
            await responder.subscribe("svc", cb=answer)
            await settle(responder)
            requester = await nats.connect(s.url, user="u0", password="p")
            assert (await requester.request("svc", b"q", timeout=TIMEOUT)).data == b"answer"
            await requester.close()
            await responder.close()
        run(main())
    finally:
        s.stop()
