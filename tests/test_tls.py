"""natsjs/tls.py: the TLS transport, its configuration, and the client identity.

Certificates are made per test session with the ``openssl`` CLI in a temporary
directory.  The in-process servers drive :class:`TLSTransport` the way client.py
does: INFO, handshake, then a read loop (``recv_into`` until BlockingIOError, then
``wait_readable``) and a synchronous ``send`` with a write loop that waits with
``wait_writable`` while output is left.  Clients are trio's SSLStream, nats-py, and
raw sockets; the reference nats-server is run with the same certificates to check
the sequence and the verify_and_map subject format against the real thing.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import socket
import ssl
import subprocess
import threading

import pytest
import trio
import trio.testing

from natsjs import conf
from natsjs.tls import (ClientIdentity, PlainTransport, TLSConfig, TLSConfigError,
                        TLSError, TLSHandshakeError, accept_tls,
                        client_identity, info_fields, make_server_context, parse_dn,
                        peek_first_byte)

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl CLI")

# The client certificate without SANs whose subject exercises Go's formatting:
# emailAddress (dropped, and it disables the ldap DN path), DCs, two OUs (one RDN
# joined with "+"), a comma to escape, and CN last in the DER but first in Go.
MAP_SUBJ = "/DC=org/DC=example/emailAddress=ops@example.com/C=US/O=Acme, Inc./OU=dev/OU=ops/CN=foo bar"
MAP_RDN = r"CN=foo bar,OU=dev+OU=ops,O=Acme\, Inc.,C=US"
MAP_DCS = "DC=org,DC=example"
# A plain subject with email and DNS SANs.
SAN_SUBJ = "/C=US/ST=CA/L=Los Angeles/O=Synadia/OU=nats.io/CN=example.com"
SAN_RDN = "CN=example.com,OU=nats.io,O=Synadia,L=Los Angeles,ST=CA,C=US"


# ---------------------------------------------------------------------------------
# Certificates


def _openssl(cwd, *args):
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError("openssl %s failed:\n%s" % (" ".join(args), r.stderr))


def _cert(d, name, subj, ext, signer="ca", serial=1):
    _openssl(d, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", name + ".key", "-out", name + ".csr", "-subj", subj)
    with open(os.path.join(d, name + ".ext"), "w") as f:
        f.write(ext)
    if signer is None:
        _openssl(d, "x509", "-req", "-in", name + ".csr", "-key", name + ".key",
                 "-days", "2", "-out", name + ".pem", "-extfile", name + ".ext")
    else:
        _openssl(d, "x509", "-req", "-in", name + ".csr", "-CA", signer + ".pem",
                 "-CAkey", signer + ".key", "-set_serial", str(serial), "-days", "2",
                 "-out", name + ".pem", "-extfile", name + ".ext")


class Certs:
    def __init__(self, d):
        self.dir = str(d)

    def __getattr__(self, name):
        # certs.server_pem -> <dir>/server.pem
        base, _, ext = name.rpartition("_")
        if ext not in ("pem", "key"):
            raise AttributeError(name)
        return os.path.join(self.dir, "%s.%s" % (base, ext))


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("certs"))
    _openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=natsjs test CA",
             "-days", "2", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _cert(d, "server", "/CN=localhost",
          "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n", serial=2)
    _cert(d, "client", SAN_SUBJ,
          "subjectAltName=email:client@example.com,DNS:client.example.com\n"
          "extendedKeyUsage=clientAuth\n", serial=3)
    _cert(d, "mapped", MAP_SUBJ, "extendedKeyUsage=clientAuth\n", serial=4)
    _cert(d, "rogue", "/CN=rogue", "extendedKeyUsage=clientAuth\n", signer=None)
    return Certs(d)


def server_cfg(certs, **kw) -> TLSConfig:
    return TLSConfig(cert_file=certs.server_pem, key_file=certs.server_key, **kw)


def client_ctx(certs, cert=None, max_version=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=certs.ca_pem)
    if cert is not None:
        ctx.load_cert_chain(getattr(certs, cert + "_pem"), getattr(certs, cert + "_key"))
    if max_version is not None:
        ctx.maximum_version = max_version
    return ctx


INFO = b'INFO {"server_id":"test","tls_required":true,"max_payload":1048576}\r\n'


# ---------------------------------------------------------------------------------
# A client connection the way client.py drives one


async def side_by_side(server, client, timeout: float) -> None:
    """Run a test's server and client tasks together, within ``timeout`` seconds."""
    with trio.fail_after(timeout):
        async with trio.open_nursery() as n:
            n.start_soon(server)
            n.start_soon(client)


def listening_socket(rcvbuf=None):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    s.setblocking(False)
    return s


async def accept(lsock, sndbuf=None):
    while True:
        try:
            conn, _ = lsock.accept()
        except BlockingIOError:
            await trio.lowlevel.wait_readable(lsock)
            continue
        conn.setblocking(False)
        if sndbuf:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        return conn


class Conn:
    """client.py's read loop / flush / write loop over a transport, with counters."""

    def __init__(self, transport, on_data, read_sizes=(65536,), wait_first=False, rng=None):
        self.t = transport
        self.on_data = on_data
        self.out = bytearray()
        self.write_blocked = False
        self._wake = trio.lowlevel.ParkingLot()
        self.read_sizes = read_sizes
        self.wait_first = wait_first
        self.rng = rng or random.Random(1)
        self.partial_sends = 0
        self.blocked_sends = 0
        self.eof = False

    def send(self, data):
        self.out += data
        if not self.write_blocked:
            self._try_send()

    def _try_send(self):
        out = self.out
        if not out:
            return
        try:
            n = self.t.send(out)
        except BlockingIOError:
            n = 0
            self.blocked_sends += 1
        if n:
            if n < len(out):
                self.partial_sends += 1
            del out[:n]
        if out:
            self.write_blocked = True
            self._wake.unpark()

    async def write_loop(self):
        out = self.out
        while True:
            if not self.write_blocked:
                await self._wake.park()
            while out:
                with trio.fail_after(10):
                    await self.t.wait_writable()
                try:
                    n = self.t.send(out)
                except BlockingIOError:
                    self.blocked_sends += 1
                    continue
                if n < len(out):
                    self.partial_sends += 1
                del out[:n]
            self.write_blocked = False

    async def read_loop(self):
        t = self.t
        while True:
            buf = bytearray(self.rng.choice(self.read_sizes))
            if self.wait_first:
                # Not client.py's order: wait before every read.  wait_readable must
                # not block while plaintext is already decrypted and buffered.
                await t.wait_readable()
            try:
                n = t.recv_into(buf)
            except BlockingIOError:
                await t.wait_readable()
                continue
            if n == 0:
                self.eof = True
                return
            self.on_data(self, bytes(buf[:n]))
            await trio.lowlevel.checkpoint()

    async def drain(self):
        while self.out:
            await self.t.wait_writable()
            try:
                del self.out[:self.t.send(self.out)]
            except BlockingIOError:
                pass

    async def run(self):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.write_loop)
            await self.read_loop()
            with trio.fail_after(10):
                await self.drain()
            nursery.cancel_scope.cancel()


async def read_line(stream) -> bytes:
    """Read one CRLF line from a raw trio stream without reading past it."""
    line = bytearray()
    while not line.endswith(b"\r\n"):
        b = await stream.receive_some(1)
        if not b:
            raise EOFError("closed after %r" % bytes(line))
        line += b
    return bytes(line)


async def tls_client(port, ctx, *, info_first=True, rcvbuf=None):
    """Connect like a NATS client: read the plaintext INFO, then TLS."""
    raw = await trio.open_tcp_stream("127.0.0.1", port)
    if rcvbuf:
        raw.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    info = await read_line(raw) if info_first else None
    s = trio.SSLStream(raw, ctx, server_hostname="localhost")
    await s.do_handshake()
    return s, info


async def receive_exactly(stream, n, rng=None, max_chunk=65536):
    got = bytearray()
    while len(got) < n:
        size = rng.randint(1, max_chunk) if rng else max_chunk
        b = await stream.receive_some(min(size, n - len(got)))
        if not b:
            raise EOFError("EOF after %d of %d bytes" % (len(got), n))
        got += b
    return bytes(got)


# ---------------------------------------------------------------------------------
# (1) byte-exact echo


def _echo(conn, data):
    conn.send(data)


@pytest.mark.parametrize("tls_version", ["1.3", "1.2"])
@pytest.mark.parametrize("mode", ["slow-reader", "concurrent", "wait-first"])
def test_echo_large_random_chunks(certs, tls_version, mode):
    seed = {"slow-reader": 1, "concurrent": 2, "wait-first": 3}[mode]
    rng = random.Random(seed)
    size = 3 * 1024 * 1024 + 12345
    data = rng.randbytes(size)
    ctx = make_server_context(server_cfg(certs))
    cctx = client_ctx(certs, max_version=ssl.TLSVersion.TLSv1_2 if tls_version == "1.2" else None)
    result = {}

    async def main():
        lsock = listening_socket()
        port = lsock.getsockname()[1]
        written = trio.Event()

        async def server():
            sock = await accept(lsock, sndbuf=32768)
            t = await accept_tls(sock, ctx, server_cfg(certs), INFO)
            result["version"] = t.version()
            conn = Conn(t, _echo, read_sizes=(1, 7, 100, 512, 4096, 16384, 65536),
                        wait_first=(mode == "wait-first"), rng=random.Random(seed + 100))
            result["conn"] = conn
            try:
                await conn.run()
            finally:
                t.close()

        async def client():
            s, info = await tls_client(port, cctx, rcvbuf=32768)
            assert info == INFO

            async def writer():
                view = memoryview(data)
                while view:
                    k = rng.randint(1, 200000)
                    await s.send_all(view[:k])
                    view = view[k:]
                written.set()

            async def reader():
                if mode == "slow-reader":
                    # Read nothing until everything was sent: the server's output
                    # must back up behind the small socket buffers.
                    await written.wait()
                result["echo"] = await receive_exactly(s, size, rng=random.Random(seed + 7),
                                                       max_chunk=20000)

            async with trio.open_nursery() as n:
                n.start_soon(writer)
                n.start_soon(reader)
            await s.aclose()

        await side_by_side(server, client, 60)
        lsock.close()

    trio.run(main)
    assert result["version"] == tls_version
    assert len(result["echo"]) == size
    assert result["echo"] == data
    conn = result["conn"]
    assert conn.eof  # close_notify from SSLStream.aclose() read as EOF
    if mode == "slow-reader":
        assert conn.partial_sends + conn.blocked_sends > 0
        assert conn.blocked_sends > 0


def test_send_reports_only_bytes_on_the_wire(certs):
    """send() counts plaintext as consumed only once its ciphertext is in the kernel,
    so a caller's buffer stays non-empty (its write loop keeps waiting) until TLS
    output really left; then wait_writable/send finish the job byte-exactly."""
    ctx = make_server_context(server_cfg(certs))
    payload = random.Random(5).randbytes(4 * 1024 * 1024)
    checks = {}

    async def main():
        lsock = listening_socket()
        port = lsock.getsockname()[1]
        stuck = trio.Event()

        async def server():
            sock = await accept(lsock, sndbuf=16384)
            t = await accept_tls(sock, ctx, server_cfg(certs), INFO)
            out = bytearray(payload)
            consumed = 0
            while True:  # fill the socket until send() can consume nothing
                try:
                    n = t.send(out)
                except BlockingIOError:
                    break
                assert 0 < n <= len(out)
                consumed += n
                del out[:n]
            checks["consumed"] = consumed
            checks["pending_ciphertext"] = t.pending_output
            checks["owed"] = owed = t._owed
            # A send that does not continue the stream is refused as an OSError,
            # without losing state: the write loop below still delivers exactly.
            with pytest.raises(TLSError, match="does not continue"):
                t.send(out[:owed - 1])
            assert t._owed == owed
            stuck.set()
            while out:  # the write loop
                with trio.fail_after(10):
                    await t.wait_writable()
                try:
                    del out[:t.send(out)]
                except BlockingIOError:
                    pass
            assert t.pending_output == 0
            t.close()

        async def client():
            raw = await trio.open_tcp_stream("127.0.0.1", port)
            raw.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            await read_line(raw)
            s = trio.SSLStream(raw, client_ctx(certs), server_hostname="localhost")
            await s.do_handshake()
            await stuck.wait()
            checks["echo"] = await receive_exactly(s, len(payload))
            await s.aclose()

        await side_by_side(server, client, 30)
        lsock.close()

    trio.run(main)
    assert 0 < checks["consumed"] < len(payload)
    # The last chunk's ciphertext did not fit: kept, and not reported as sent.
    assert checks["pending_ciphertext"] > 0 and checks["owed"] > 0
    assert checks["echo"] == payload


def test_tls_data_behind_finished_is_not_lost(certs):
    """A CONNECT sent right behind the client's Finished must come out of recv_into
    without waiting for the socket (it may already sit in the incoming BIO)."""
    ctx = make_server_context(server_cfg(certs))
    got = {}

    async def main():
        lsock = listening_socket()
        port = lsock.getsockname()[1]
        done = trio.Event()

        async def server():
            sock = await accept(lsock)
            t = await accept_tls(sock, ctx, server_cfg(certs), INFO)
            buf = bytearray(4)  # small: leaves plaintext inside the SSLObject
            data = bytearray()
            while len(data) < 23:
                # wait_readable first: must return while plaintext is buffered.
                await t.wait_readable()
                try:
                    n = t.recv_into(buf)
                except BlockingIOError:
                    continue
                data += buf[:n]
            got["data"] = bytes(data)
            await done.wait()
            t.close()

        async def client():
            s, _ = await tls_client(port, client_ctx(certs))
            await s.send_all(b"CONNECT {}\r\nPING\r\nPUB\r\n")  # 23 bytes, one record
            with trio.fail_after(5):
                while "data" not in got:
                    await trio.testing.wait_all_tasks_blocked()
            done.set()
            await s.aclose()

        await side_by_side(server, client, 10)
        lsock.close()

    trio.run(main)
    assert got["data"] == b"CONNECT {}\r\nPING\r\nPUB\r\n"


class _WantReadOnce:
    """An SSLObject whose next write needs the peer's input first (as during a
    renegotiation): the only way SSLWantReadError can reach send()."""

    def __init__(self, real):
        self._real = real
        self.tripped = False

    def write(self, data):
        if not self.tripped:
            self.tripped = True
            raise ssl.SSLWantReadError("The operation did not complete (read)")
        return self._real.write(data)

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_send_wanting_read_waits_for_the_reader(certs):
    ctx = make_server_context(server_cfg(certs))
    res = {}

    async def main():
        lsock = listening_socket()
        port = lsock.getsockname()[1]

        async def server():
            sock = await accept(lsock)
            t = await accept_tls(sock, ctx, server_cfg(certs), INFO)
            t._ssl = fake = _WantReadOnce(t._ssl)
            conn = Conn(t, _echo)
            res["conn"] = conn
            await conn.run()
            res["tripped"] = fake.tripped
            t.close()

        async def client():
            s, _ = await tls_client(port, client_ctx(certs))
            await s.send_all(b"hello")
            # The server's write loop is now parked until its reader gets input.
            await trio.testing.wait_all_tasks_blocked()
            res["blocked_before"] = res["conn"].blocked_sends
            res["out_before"] = bytes(res["conn"].out)
            await s.send_all(b"world")
            res["echo"] = await receive_exactly(s, 10)
            await s.aclose()

        await side_by_side(server, client, 10)
        lsock.close()

    trio.run(main)
    assert res["tripped"]
    assert res["blocked_before"] >= 1 and res["out_before"] == b"hello"
    assert res["echo"] == b"helloworld"


def test_shutdown_write_sends_close_notify_then_reads_on(certs):
    """The -ERR linger path: send, close_notify + half-close, read until EOF."""
    ctx = make_server_context(server_cfg(certs))
    res = {}

    async def main():
        lsock = listening_socket()
        port = lsock.getsockname()[1]

        async def server():
            sock = await accept(lsock)
            t = await accept_tls(sock, ctx, server_cfg(certs), INFO)
            await t.send_all(b"-ERR 'Maximum Payload Violation'\r\n")
            t.shutdown_write()
            with pytest.raises(OSError):
                t.send(b"late")
            data = bytearray()
            buf = bytearray(1000)
            while True:
                try:
                    n = t.recv_into(buf)
                except BlockingIOError:
                    await t.wait_readable()
                    continue
                if n == 0:
                    break
                data += buf[:n]
            res["server_read"] = bytes(data)
            t.close()

        async def client():
            s, _ = await tls_client(port, client_ctx(certs))
            res["err"] = await read_line(s)
            res["eof"] = await s.receive_some(100)  # b"" only for a real close_notify
            await s.send_all(b"PUB x 3\r\nabc\r\n")
            await s.aclose()

        await side_by_side(server, client, 10)
        lsock.close()

    trio.run(main)
    assert res["err"] == b"-ERR 'Maximum Payload Violation'\r\n"
    assert res["eof"] == b""
    assert res["server_read"] == b"PUB x 3\r\nabc\r\n"


def test_close_sends_close_notify(certs):
    ctx = make_server_context(server_cfg(certs))
    res = {}

    async def main():
        lsock = listening_socket()
        port = lsock.getsockname()[1]

        async def server():
            sock = await accept(lsock)
            t = await accept_tls(sock, ctx, server_cfg(certs), INFO)
            await t.send_all(b"PING\r\n")
            t.close()
            t.close()  # idempotent

        async def client():
            s, _ = await tls_client(port, client_ctx(certs))
            res["ping"] = await read_line(s)
            res["eof"] = await s.receive_some(100)  # ragged EOF would raise
            await s.aclose()

        await side_by_side(server, client, 10)
        lsock.close()

    trio.run(main)
    assert res == {"ping": b"PING\r\n", "eof": b""}


# ---------------------------------------------------------------------------------
# Handshake outcomes


def run_handshake(certs, cfg, client, *, ctx=None):
    """Serve one connection with accept_tls(cfg); return (server outcome, client result)."""
    ctx = ctx or make_server_context(cfg)
    res = {}

    async def main():
        lsock = listening_socket()
        port = lsock.getsockname()[1]

        async def server():
            sock = await accept(lsock)
            start = trio.current_time()
            try:
                t = await accept_tls(sock, ctx, cfg, INFO)
            except TLSHandshakeError as exc:
                res["error"] = exc
                res["elapsed"] = trio.current_time() - start
                sock.close()
                return
            res["transport"] = t
            res["identity"] = client_identity(t)
            # A line protocol after the handshake: echo one line, then close.
            conn = Conn(t, lambda c, d: c.send(d))
            await conn.run()
            t.close()

        async def run_client():
            try:
                res["client"] = await client(port)
            except Exception as exc:  # noqa: BLE001 -- the test inspects it
                res["client_error"] = exc

        await side_by_side(server, run_client, 20)
        lsock.close()

    trio.run(main)
    return res


def ping_client(ctx, info_first=True):
    async def client(port):
        s, info = await tls_client(port, ctx, info_first=info_first)
        if not info_first:
            info = await read_line(s)
        await s.send_all(b"PING\r\n")
        echoed = await receive_exactly(s, 6)
        await s.aclose()
        return info, echoed
    return client


def test_verify_accepts_ca_signed_client_and_maps_identity(certs):
    cfg = server_cfg(certs, ca_file=certs.ca_pem, verify=True)
    assert make_server_context(cfg).verify_mode == ssl.CERT_REQUIRED
    assert info_fields(cfg) == {"tls_required": True, "tls_verify": True}
    res = run_handshake(certs, cfg, ping_client(client_ctx(certs, "client")))
    assert "error" not in res, res
    assert res["client"] == (INFO, b"PING\r\n")
    ident = res["identity"]
    assert ident.subject == SAN_RDN
    assert ident.emails == ("client@example.com",)
    assert ident.dns_names == ("client.example.com",)
    assert ident.dcs == ""
    assert ident.dn == ((("CN", "example.com"),), (("OU", "nats.io"),), (("O", "Synadia"),),
                        (("L", "Los Angeles"),), (("ST", "CA"),), (("C", "US"),))
    # nats-server's order: SAN email before DNS before the subject.
    assert ident.match([SAN_RDN, "client.example.com", "client@example.com"]) == \
        "client@example.com"
    assert ident.match([SAN_RDN, "client.example.com"]) == "client.example.com"
    assert ident.match([SAN_RDN]) == SAN_RDN
    # The ldap DN path: reordered and spaced forms of the same DN match too.
    reordered = "C=US, ST=CA, L=Los Angeles, O=Synadia, OU=nats.io, CN=example.com"
    assert ident.match([reordered]) == reordered
    assert ident.match(["CN=example.com"]) is None
    assert len(ident.cert_sha256) == 64


def test_verify_identity_go_subject_format(certs):
    cfg = server_cfg(certs, ca_file=certs.ca_pem, verify_and_map=True, verify=True)
    res = run_handshake(certs, cfg, ping_client(client_ctx(certs, "mapped")))
    assert "error" not in res, res
    ident = res["identity"]
    assert ident.subject == MAP_RDN
    assert ident.dcs == MAP_DCS
    assert ident.emails == ident.dns_names == ()
    assert ident.dn is None  # emailAddress in the subject: no ldap DN matching
    assert ident.match([MAP_RDN + "," + MAP_DCS, MAP_RDN]) == MAP_RDN + "," + MAP_DCS
    assert ident.match([MAP_RDN]) == MAP_RDN
    # Without the DN path a reordered form does not match.
    assert ident.match(["C=US,O=Acme\\, Inc.,OU=dev+OU=ops,CN=foo bar"]) is None


def test_verify_rejects_client_without_certificate(certs):
    cfg = server_cfg(certs, ca_file=certs.ca_pem, verify=True)
    res = run_handshake(certs, cfg, ping_client(client_ctx(certs)))
    assert "transport" not in res
    assert "didn't provide a certificate" in str(res["error"])
    assert isinstance(res["error"], OSError) and not res["error"].probe
    assert "client_error" in res  # the client saw the alert (handshake or first read)


def test_verify_rejects_certificate_from_another_ca(certs):
    cfg = server_cfg(certs, ca_file=certs.ca_pem, verify=True)
    res = run_handshake(certs, cfg, ping_client(client_ctx(certs, "rogue")))
    assert "transport" not in res
    msg = str(res["error"])
    assert "client certificate verification failed" in msg, msg
    assert "client_error" in res


def test_without_verify_no_client_cert_requested(certs):
    cfg = server_cfg(certs)
    res = run_handshake(certs, cfg, ping_client(client_ctx(certs, "client")))
    assert res["client"] == (INFO, b"PING\r\n")
    assert res["identity"] is None


def test_tls12_minimum(certs):
    ctx = make_server_context(server_cfg(certs))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    ctx13 = make_server_context(server_cfg(certs, min_version="1.3"))
    res = run_handshake(certs, server_cfg(certs, min_version="1.3"),
                        ping_client(client_ctx(certs, max_version=ssl.TLSVersion.TLSv1_2)),
                        ctx=ctx13)
    assert "error" in res and "client_error" in res


def test_handshake_timeout_when_client_never_starts_tls(certs):
    cfg = server_cfg(certs, timeout=0.3)

    async def client(port):
        raw = await trio.open_tcp_stream("127.0.0.1", port)
        info = await read_line(raw)
        rest = await raw.receive_some(100)  # the server closes: b""
        await raw.aclose()
        return info, rest

    res = run_handshake(certs, cfg, client)
    err = res["error"]
    assert "timeout" in str(err) and err.probe
    assert 0.3 <= res["elapsed"] < 3
    # As nats-server: INFO in the clear, then the connection just closes.
    assert res["client"] == (INFO, b"")


def test_plaintext_client_gets_clear_error(certs):
    async def client(port):
        raw = await trio.open_tcp_stream("127.0.0.1", port)
        await read_line(raw)
        await raw.send_all(b'CONNECT {"verbose":false}\r\nPING\r\n')
        try:
            while await raw.receive_some(100):
                pass
        except trio.BrokenResourceError:
            pass
        await raw.aclose()

    res = run_handshake(certs, server_cfg(certs), client)
    err = res["error"]
    assert "does not look like a TLS handshake" in str(err), err
    assert err.probe


def test_client_closing_during_handshake(certs):
    async def client(port):
        raw = await trio.open_tcp_stream("127.0.0.1", port)
        await read_line(raw)
        await raw.aclose()

    res = run_handshake(certs, server_cfg(certs), client)
    assert "connection closed by client" in str(res["error"])


# ---------------------------------------------------------------------------------
# (4) handshake_first


def test_handshake_first_info_comes_through_tls(certs):
    cfg = server_cfg(certs, handshake_first=True)
    res = run_handshake(certs, cfg, ping_client(client_ctx(certs), info_first=False))
    assert res["client"] == (INFO, b"PING\r\n")
    assert res["transport"].tls_first


def test_handshake_first_client_waiting_for_info_times_out(certs):
    """Without fallback a client waiting for a plaintext INFO gets nothing."""
    cfg = server_cfg(certs, handshake_first=True, timeout=0.3)

    async def client(port):
        raw = await trio.open_tcp_stream("127.0.0.1", port)
        first = await raw.receive_some(100)
        await raw.aclose()
        return first

    res = run_handshake(certs, cfg, client)
    assert res["client"] == b""  # closed without a byte in the clear
    assert "timeout" in str(res["error"])


@pytest.mark.parametrize("tls_first", [True, False])
def test_handshake_first_with_fallback(certs, tls_first):
    cfg = TLSConfig.from_conf({"cert_file": certs.server_pem, "key_file": certs.server_key,
                               "handshake_first": "100ms"})
    assert cfg.handshake_first and cfg.handshake_first_fallback == pytest.approx(0.1)
    res = run_handshake(certs, cfg, ping_client(client_ctx(certs), info_first=not tls_first))
    assert res["client"] == (INFO, b"PING\r\n")
    assert res["transport"].tls_first is tls_first


def test_peek_first_byte():
    async def main():
        a, b = socket.socketpair()
        a.setblocking(False)
        assert await peek_first_byte(a, 0.05) is None
        b.send(b"\x16\x03")
        assert await peek_first_byte(a, 1) == 0x16
        assert a.recv(10) == b"\x16\x03"  # not consumed
        b.close()
        assert await peek_first_byte(a, 1) == -1
        a.close()
    trio.run(main)


# ---------------------------------------------------------------------------------
# Plain transport


def test_plain_transport_surface():
    async def main():
        a, b = socket.socketpair()
        a.setblocking(False)
        t = PlainTransport(a)
        assert not t.is_tls
        b.send(b"hello")
        await t.wait_readable()
        buf = bytearray(10)
        assert t.recv_into(buf) == 5 and buf[:5] == b"hello"
        with pytest.raises(BlockingIOError):
            t.recv_into(buf)
        await t.wait_writable()
        assert t.send(b"xyz") == 3
        t.shutdown_write()
        assert b.recv(10) == b"xyz" and b.recv(10) == b""
        t.close()
        b.close()
        assert client_identity(t) is None
    trio.run(main)


# ---------------------------------------------------------------------------------
# Errors on an established connection are OSErrors


def test_corrupt_record_is_oserror_and_eof_is_zero(certs):
    ctx = make_server_context(server_cfg(certs))
    res = {}

    async def main():
        lsock = listening_socket()
        port = lsock.getsockname()[1]
        stage = trio.Event()

        async def server():
            sock = await accept(lsock)
            t = await accept_tls(sock, ctx, server_cfg(certs), INFO)
            buf = bytearray(100)
            while True:
                try:
                    n = t.recv_into(buf)
                except BlockingIOError:
                    await t.wait_readable()
                    continue
                except OSError as exc:
                    res["error"] = exc
                    break
                res.setdefault("data", bytearray()).extend(buf[:n])
            stage.set()
            t.close()

        async def client():
            raw = await trio.open_tcp_stream("127.0.0.1", port)
            await read_line(raw)
            s = trio.SSLStream(raw, client_ctx(certs), server_hostname="localhost")
            await s.do_handshake()
            await s.send_all(b"ok")
            # An application-data record with garbage inside.
            await raw.send_all(b"\x17\x03\x03\x00\x20" + b"\x00" * 32)
            await stage.wait()
            await raw.aclose()

        await side_by_side(server, client, 10)
        lsock.close()

    trio.run(main)
    assert bytes(res["data"]) == b"ok"
    assert isinstance(res["error"], TLSError)
    assert not isinstance(res["error"], ssl.SSLWantReadError)


# ---------------------------------------------------------------------------------
# Configuration


def test_from_conf_values():
    block = conf.parse("""
    tls {
      cert_file: "s.pem"
      key_file: "s.key"
      ca_file: "ca.pem"
      verify_and_map: true
      timeout: "500ms"
      handshake_first: auto
    }""")["tls"]
    cfg = TLSConfig.from_conf(block)
    assert cfg == TLSConfig(cert_file="s.pem", key_file="s.key", ca_file="ca.pem",
                            verify=True, verify_and_map=True, timeout=0.5,
                            handshake_first=True, handshake_first_fallback=0.05)
    assert TLSConfig.from_conf({"timeout": 3}).timeout == 3.0
    assert TLSConfig.from_conf({"timeout": 1.5}).timeout == 1.5
    assert TLSConfig.from_conf({"timeout": 0}).timeout == 2.0  # 0 = default, as opts.go
    assert TLSConfig().timeout == 2.0
    assert TLSConfig.from_conf({"handshake_first": True}).handshake_first_fallback == 0
    assert TLSConfig.from_conf({"first": "on"}).handshake_first
    assert not TLSConfig.from_conf({"handshake_first": "off"}).handshake_first
    hf = TLSConfig.from_conf({"Handshake_First": "300ms"})
    assert hf.handshake_first and hf.handshake_first_fallback == pytest.approx(0.3)
    assert TLSConfig.from_conf({"verify": True}).verify
    warnings = []
    TLSConfig.from_conf({"cipher_suites": ["x"]}, warn=warnings.append)
    assert "cipher_suites" in warnings[0]


@pytest.mark.parametrize("text,message", [
    ("tls { bogus: 1 }", "unknown field 'bogus'"),
    ("tls { verify: 1 }", "expected 'verify' to be a boolean"),
    ("tls { cert_file: 1 }", "expected 'cert_file' to be filename"),
    ("tls { timeout: true }", "'timeout' wrong type"),
    ("tls { timeout: \"2x\" }", "'timeout' time: unknown unit"),
    ("tls { handshake_first: \"sometimes\" }", "value 'sometimes' is invalid"),
    ("tls { handshake_first: 5 }", "should be a boolean or a string"),
    ("tls { cert_file: a.pem }", "missing 'key_file'"),
    ("tls { key_file: a.key }", "missing 'cert_file'"),
    ("tls { pinned_certs: [] }", "not supported by natsjs"),
    ("tls { min_version: \"1.1\" }", "unsupported TLS version"),
])
def test_from_conf_errors(text, message):
    block = conf.parse(text, filename="x.conf")["tls"]
    with pytest.raises(TLSConfigError) as ei:
        TLSConfig.from_conf(block)
    assert message in str(ei.value)
    if "unknown" in message:
        assert ei.value.pos is not None and ei.value.pos.line == 1


def test_make_server_context_errors_name_the_file(certs, tmp_path):
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(TLSConfigError, match="cert_file.*nope.pem"):
        make_server_context(TLSConfig(cert_file=missing, key_file=certs.server_key))
    with pytest.raises(TLSConfigError, match="key_file.*nope.pem"):
        make_server_context(TLSConfig(cert_file=certs.server_pem, key_file=missing))
    with pytest.raises(TLSConfigError, match="ca_file.*nope.pem"):
        make_server_context(server_cfg(certs, ca_file=missing, verify=True))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(TLSConfigError, match="garbage.pem"):
        make_server_context(TLSConfig(cert_file=str(garbage), key_file=certs.server_key))
    with pytest.raises(TLSConfigError, match="root ca.*garbage.pem"):
        make_server_context(server_cfg(certs, ca_file=str(garbage)))
    with pytest.raises(TLSConfigError, match="certificate/key pair"):
        make_server_context(TLSConfig(cert_file=certs.server_pem, key_file=certs.client_key))
    with pytest.raises(TLSConfigError, match="needs both"):
        make_server_context(TLSConfig())


def test_parse_dn_like_go_ldap():
    assert parse_dn("CN=foo bar,OU=dev+OU=ops,O=Acme\\, Inc.") == (
        (("CN", "foo bar"),), (("OU", "dev"), ("OU", "ops")), (("O", "Acme, Inc."),))
    assert parse_dn(" CN = x , O=y ") == ((("CN", "x"),), (("O", "y"),))
    assert parse_dn("CN=\\41b") == ((("CN", "Ab"),),)
    assert parse_dn("CN=#0101") is None
    assert parse_dn("foo") is None
    assert parse_dn("=x,") is None
    ident = ClientIdentity(subject="CN=Ab,O=b", dn=((("CN", "Ab"),), (("O", "b"),)))
    assert ident.match(["CN=ab,O=b"]) is None          # values are case sensitive
    assert ident.match(["cn=Ab,o=b"]) == "cn=Ab,o=b"   # types are not
    assert ident.match(["O=b,CN=Ab"]) == "O=b,CN=Ab"   # any RDN order
    assert ident.match(["CN=Ab"]) is None


# ---------------------------------------------------------------------------------
# (5) Real clients: nats-py against natsjs' transport and against nats-server


class MiniNats:
    """A tiny NATS server in a trio thread using accept_tls + TLSTransport + Conn:
    CONNECT, PING/PONG, SUB and PUB (exact subjects, per connection)."""

    def __init__(self, cfg: TLSConfig):
        self.cfg = cfg
        self.ctx = make_server_context(cfg)
        self.errors: list[BaseException] = []
        self.identities: list = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    def __enter__(self):
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc):
        trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(10)

    @property
    def url(self):
        return "tls://127.0.0.1:%d" % self.port

    async def _main(self):
        self._token = trio.lowlevel.current_trio_token()
        lsock = listening_socket()
        self.port = lsock.getsockname()[1]
        with trio.CancelScope() as self._scope:
            self._ready.set()
            async with trio.open_nursery() as nursery:
                while True:
                    sock = await accept(lsock)
                    nursery.start_soon(self._serve, sock)
        lsock.close()

    async def _serve(self, sock):
        info = {"server_id": "mini", "version": "2.10.0", "proto": 1, "headers": True,
                "max_payload": 8 * 1024 * 1024, **info_fields(self.cfg)}
        try:
            t = await accept_tls(sock, self.ctx, self.cfg,
                                 b"INFO " + json.dumps(info).encode() + b"\r\n")
        except TLSHandshakeError as exc:
            self.errors.append(exc)
            sock.close()
            return
        self.identities.append(client_identity(t))
        state = {"in": bytearray(), "subs": {}}
        conn = Conn(t, lambda c, d: self._proto(c, d, state))
        try:
            await conn.run()
        except OSError:
            pass
        finally:
            t.close()

    @staticmethod
    def _proto(conn, data, state):
        buf = state["in"]
        buf += data
        while True:
            i = buf.find(b"\r\n")
            if i < 0:
                return
            line = bytes(buf[:i])
            op = line.split(b" ", 1)[0].upper()
            if op == b"PUB":
                parts = line.split()
                n = int(parts[-1])
                if len(buf) < i + 2 + n + 2:
                    return
                payload = bytes(buf[i + 2:i + 2 + n])
                del buf[:i + 2 + n + 2]
                subj, reply = parts[1], (parts[2] if len(parts) == 4 else None)
                for sid in state["subs"].get(subj, ()):
                    conn.send(b"MSG %s %s %s%d\r\n" % (subj, sid, reply + b" " if reply else b"",
                                                       n) + payload + b"\r\n")
                continue
            del buf[:i + 2]
            if op == b"PING":
                conn.send(b"PONG\r\n")
            elif op == b"SUB":
                parts = line.split()
                state["subs"].setdefault(parts[1], []).append(parts[-1])


async def _nats_roundtrip(url, ctx, payload_size=2 * 1024 * 1024, **kw):
    import nats
    nc = await nats.connect(url, tls=ctx, allow_reconnect=False, connect_timeout=5,
                            max_reconnect_attempts=0, **kw)
    try:
        got = []
        done = asyncio.Event()
        payload = random.Random(9).randbytes(payload_size)

        async def cb(msg):
            got.append(msg.data)
            if len(got) == 3:
                done.set()

        await nc.subscribe("tls.test", cb=cb)
        for _ in range(3):
            await nc.publish("tls.test", payload)
        await nc.flush(timeout=10)
        await asyncio.wait_for(done.wait(), 10)
        assert got == [payload] * 3
        return nc.connected_url
    finally:
        await nc.close()


@pytest.mark.parametrize("handshake_first", [False, True])
def test_nats_py_against_tls_transport(certs, handshake_first):
    cfg = server_cfg(certs, handshake_first=handshake_first)
    with MiniNats(cfg) as srv:
        asyncio.run(_nats_roundtrip(srv.url, client_ctx(certs),
                                    tls_handshake_first=handshake_first))
    assert not srv.errors


def test_nats_py_client_cert_against_tls_transport(certs):
    cfg = server_cfg(certs, ca_file=certs.ca_pem, verify=True)
    with MiniNats(cfg) as srv:
        asyncio.run(_nats_roundtrip(srv.url, client_ctx(certs, "mapped"), payload_size=1000))
        with pytest.raises(Exception):
            asyncio.run(_nats_roundtrip(srv.url, client_ctx(certs), payload_size=10))
    assert [i.subject for i in srv.identities] == [MAP_RDN]
    assert any("didn't provide a certificate" in str(e) for e in srv.errors)


def _write_conf(tmp_path, text):
    p = tmp_path / "server.conf"
    p.write_text(text)
    return str(p)


def _tls_block(certs, extra=""):
    return 'tls {\n  cert_file: "%s"\n  key_file: "%s"\n  %s\n}\n' % (
        certs.server_pem, certs.server_key, extra)


def test_reference_server_same_certs_nats_py(certs, reference_server):
    srv = reference_server("--tls", "--tlscert", certs.server_pem, "--tlskey", certs.server_key)
    asyncio.run(_nats_roundtrip("tls://127.0.0.1:%d" % srv.port, client_ctx(certs),
                                payload_size=1000 * 1000))  # under its 1 MB max_payload


def test_reference_server_handshake_first(certs, reference_server, tmp_path):
    srv = reference_server("-c", _write_conf(tmp_path, _tls_block(certs, "handshake_first: true")))
    asyncio.run(_nats_roundtrip("tls://127.0.0.1:%d" % srv.port, client_ctx(certs),
                                payload_size=1000, tls_handshake_first=True))


@pytest.mark.parametrize("target", ["reference", "natsjs-transport"])
@pytest.mark.parametrize("handshake_first", [False, True])
def test_raw_sequence_matches_reference(certs, reference_server, tmp_path, target,
                                        handshake_first):
    """INFO in the clear with tls_required, then TLS (or TLS, then INFO), then
    CONNECT/PING -> PONG: the same bytes from both servers."""
    if target == "reference":
        extra = "handshake_first: true" if handshake_first else ""
        port = reference_server("-c", _write_conf(tmp_path, _tls_block(certs, extra))).port
        mini = None
    else:
        mini = MiniNats(server_cfg(certs, handshake_first=handshake_first)).__enter__()
        port = mini.port
    try:
        async def probe():
            raw = await trio.open_tcp_stream("127.0.0.1", port)
            info = None
            if not handshake_first:
                info = await read_line(raw)
            s = trio.SSLStream(raw, client_ctx(certs), server_hostname="localhost")
            await s.do_handshake()
            if handshake_first:
                info = await read_line(s)
            await s.send_all(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
            pong = await read_line(s)
            await s.aclose()
            return info, pong

        info, pong = trio.run(probe)
    finally:
        if mini is not None:
            mini.__exit__(None, None, None)
    assert info.startswith(b"INFO {") and info.endswith(b"\r\n")
    fields = json.loads(info[5:])
    assert fields["tls_required"] is True
    assert pong == b"PONG\r\n"


def _reference_mapping_conf(certs, user):
    return (_tls_block(certs, 'ca_file: "%s"\n  verify_and_map: true' % certs.ca_pem)
            + 'authorization { users = [ {user: "%s"} ] }\n'
            % user.replace("\\", "\\\\").replace('"', '\\"'))


@pytest.mark.parametrize("cert,user,ok", [
    ("mapped", MAP_RDN + "," + MAP_DCS, True),
    ("mapped", MAP_RDN, True),
    ("mapped", "C=US,O=Acme\\, Inc.,OU=dev+OU=ops,CN=foo bar", False),
    ("client", SAN_RDN, True),
    ("client", "client@example.com", True),
    ("client", "CN=example.com", False),
])
def test_identity_matches_reference_verify_and_map(certs, reference_server, tmp_path,
                                                   cert, user, ok):
    """client_identity().match() maps a certificate to the same user as nats-server."""
    cfg = server_cfg(certs, ca_file=certs.ca_pem, verify_and_map=True, verify=True)
    res = run_handshake(certs, cfg, ping_client(client_ctx(certs, cert)))
    ident = res["identity"]
    assert (ident.match([user]) == user) is ok

    srv = reference_server("-c", _write_conf(tmp_path, _reference_mapping_conf(certs, user)))
    url = "tls://127.0.0.1:%d" % srv.port
    if ok:
        asyncio.run(_nats_roundtrip(url, client_ctx(certs, cert), payload_size=10))
    else:
        with pytest.raises(Exception):
            asyncio.run(_nats_roundtrip(url, client_ctx(certs, cert), payload_size=10))
