"""TLS end to end: natsjs-server with --tls/--tlsverify and nats-py, and TLS routes
in a cluster mixing natsjs and the reference nats-server."""
import asyncio
import json
import re
import shutil
import socket
import ssl

import nats
import pytest

from conftest import start_natsjs, start_reference
from test_cluster import (cluster_args, connect, http_json, start, until_delivered,
                          wait_mesh, wait_until)
from test_tls import Certs, _cert, _openssl
from helpers import run

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl CLI")
TIMEOUT = 10


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    _openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=natsjs e2e CA",
             "-days", "2", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    # One certificate that serves both ends of a route: server and client auth.
    _cert(d, "node", "/CN=localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
          "extendedKeyUsage=serverAuth,clientAuth\n", serial=2)
    _cert(d, "user", "/CN=alice", "extendedKeyUsage=clientAuth\n", serial=3)
    return Certs(d)


def ctx(pki, cert=None):
    c = ssl.create_default_context(cafile=pki.ca_pem)
    if cert:
        c.load_cert_chain(getattr(pki, cert + "_pem"), getattr(pki, cert + "_key"))
    return c


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_tls_clients(pki, kind):
    start_fn = start_natsjs if kind == "natsjs" else start_reference
    s = start_fn("--tls", "--tlscert", pki.node_pem, "--tlskey", pki.node_key)
    try:
        raw = socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT)
        info = json.loads(raw.recv(4096)[5:])
        raw.close()
        assert info["tls_required"] is True

        async def main():
            nc = await nats.connect("tls://127.0.0.1:%d" % s.port, tls=ctx(pki),
                                    allow_reconnect=False)
            sub = await nc.subscribe("secure")
            await nc.publish("secure", b"x" * 100000)
            assert len((await sub.next_msg(timeout=TIMEOUT)).data) == 100000
            await nc.close()
        run(main())
    finally:
        s.stop()


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_tls_verify_requires_a_client_certificate(pki, kind):
    start_fn = start_natsjs if kind == "natsjs" else start_reference
    s = start_fn("--tlsverify", "--tlscert", pki.node_pem, "--tlskey", pki.node_key,
                 "--tlscacert", pki.ca_pem)
    try:
        async def main():
            with pytest.raises(Exception):
                nc = await nats.connect("tls://127.0.0.1:%d" % s.port, tls=ctx(pki),
                                        allow_reconnect=False, connect_timeout=3)
                await nc.close()
            nc = await nats.connect("tls://127.0.0.1:%d" % s.port, tls=ctx(pki, "user"),
                                    allow_reconnect=False)
            await nc.flush()
            await nc.close()
        run(main())
        assert s.alive()
    finally:
        s.stop()


def test_tls_routes_in_a_mixed_cluster(pki, tmp_path):
    conf = tmp_path / "tls.conf"
    conf.write_text('cluster { tls { cert_file: "%s", key_file: "%s", ca_file: "%s" } }\n'
                    % (pki.node_pem, pki.node_key, pki.ca_pem))
    procs = []
    try:
        seed = start("natsjs", "-c", str(conf), *cluster_args())
        procs.append(seed)
        ref = start("reference", *cluster_args(routes=[seed.cluster_port],
                                                extra=["-c", str(conf)]))
        procs.append(ref)
        ours = start("natsjs", "-c", str(conf), *cluster_args(routes=[seed.cluster_port]))
        procs.append(ours)
        wait_mesh([seed, ref, ours])

        async def main():
            a, b = await connect(ours), await connect(ref)
            sub = await a.subscribe("over.tls")
            await a.flush()
            await until_delivered(b, sub, "over.tls")
            await a.close()
            await b.close()
        run(main())
        # the mesh check above needs one connection per peer; the rest of each pool
        # may still be in its TLS handshakes
        wait_until(lambda: http_json(seed, "/routez")["num_routes"] == 8, "the full pools")
        # a plain-text route attempt is refused and does not join
        plain = start("natsjs", *cluster_args(routes=[seed.cluster_port]))
        procs.append(plain)
        seed.wait_for(re.compile(rb"TLS route handshake error"))
        assert http_json(plain, "/routez")["num_routes"] == 0
        assert http_json(seed, "/routez")["num_routes"] == 8
    finally:
        for p in procs:
            p.stop()


def test_verify_and_map_binds_the_certificate_user(pki, tmp_path):
    conf = tmp_path / "map.conf"
    conf.write_text('''
tls { cert_file: "%s", key_file: "%s", ca_file: "%s", verify_and_map: true }
authorization { users = [
  { user: "CN=alice", permissions: { publish: "alice.>", subscribe: "alice.>" } }
] }
''' % (pki.node_pem, pki.node_key, pki.ca_pem))
    s = start_natsjs("-c", str(conf))
    try:
        async def main():
            errors = []

            async def on_error(e):
                errors.append(str(e).lower())
            nc = await nats.connect("tls://127.0.0.1:%d" % s.port, tls=ctx(pki, "user"),
                                    allow_reconnect=False, error_cb=on_error)
            sub = await nc.subscribe("alice.inbox")
            await nc.publish("alice.inbox", b"mine")
            assert (await sub.next_msg(timeout=TIMEOUT)).data == b"mine"
            await nc.publish("bob.inbox", b"not mine")
            await nc.flush()
            for _ in range(20):
                if errors:
                    break
                await nc.flush()
            assert any("permissions violation for publish" in e for e in errors)
            await nc.close()
            # a certificate that maps to no user is refused
            with pytest.raises(Exception):
                bad = await nats.connect("tls://127.0.0.1:%d" % s.port, tls=ctx(pki, "node"),
                                         allow_reconnect=False, connect_timeout=3)
                await bad.close()
        run(main())
    finally:
        s.stop()


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_verify_and_map_clients_survive_a_reload(pki, tmp_path, kind):
    import signal
    conf = tmp_path / "map.conf"
    conf.write_text('''
tls { cert_file: "%s", key_file: "%s", ca_file: "%s", verify_and_map: true }
authorization { users = [ { user: "CN=alice" } ] }
''' % (pki.node_pem, pki.node_key, pki.ca_pem))
    s = (start_natsjs if kind == "natsjs" else start_reference)("-c", str(conf))
    try:
        async def main():
            closed = asyncio.Event()

            async def on_closed():
                closed.set()
            nc = await nats.connect("tls://127.0.0.1:%d" % s.port, tls=ctx(pki, "user"),
                                    allow_reconnect=False, closed_cb=on_closed)
            sub = await nc.subscribe("alice.inbox")
            await nc.flush()
            # A changed authorization block makes the server check every client again.
            conf.write_text(conf.read_text().replace('{ user: "CN=alice" }',
                                                     '{ user: "CN=alice" }, { user: "CN=bob" }'))
            s.proc.send_signal(signal.SIGHUP)
            await asyncio.get_running_loop().run_in_executor(
                None, s.wait_for, re.compile(rb"Reloaded server configuration"))
            await nc.publish("alice.inbox", b"still here")
            assert (await sub.next_msg(timeout=TIMEOUT)).data == b"still here"
            assert not closed.is_set() and nc.is_connected
            await nc.close()
        run(main())
    finally:
        s.stop()
