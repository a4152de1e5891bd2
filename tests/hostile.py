"""Helpers of the hostile-input tests (issue 19): asking a server JetStream API
requests, comparing the answers with nats-server's, restarting a server from its
store, and watching the protocol a client receives on a bare socket.

Used by tests/test_hostile_api.py (crafted requests, one by one) and
tests/test_hostile_fuzz.py (generated ones).
"""
from __future__ import annotations

import json
import socket
import time
from functools import partial

import nats

from conftest import ServerProcess, start_natsjs, start_reference
import helpers

run = partial(helpers.run, timeout=None)


async def ask(url: str, requests: list, user: str | None = None) -> list:
    """Each (subject, body) asked in turn; the answers' JSON (or "timeout")."""
    nc = await nats.connect(url, user=user, password=user, allow_reconnect=False)
    out = []
    try:
        for subject, body in requests:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            try:
                msg = await nc.request(subject, data, timeout=5)
                out.append(json.loads(msg.data))
            except nats.errors.TimeoutError:
                out.append("timeout")
    finally:
        await nc.close()
    return out


def outcome(answer) -> tuple:
    """What a client acts on: the error's code and text, or which kind of success."""
    if not isinstance(answer, dict):
        return (answer,)
    err = answer.get("error")
    if err:
        return (err["code"], err["err_code"], err["description"])
    return ("ok", answer.get("type"))


def both(requests: list, *args) -> tuple[list, list, ServerProcess]:
    """The requests' answers from natsjs and from nats-server (each a fresh server
    with JetStream in a temporary store); natsjs is left running for the caller."""
    ref = start_reference("-js", "-sd", args[0] + "-ref", *args[1:])
    try:
        expected = run(ask("nats://127.0.0.1:%d" % ref.port, requests))
    finally:
        ref.stop()
    js = start_natsjs("-js", "-sd", args[0], *args[1:])
    got = run(ask("nats://127.0.0.1:%d" % js.port, requests))
    return got, expected, js


def restarted(server: ServerProcess) -> ServerProcess:
    """The same natsjs server stopped and started again from its store."""
    assert server.alive(), server.text()[-3000:]
    server.stop()
    again = start_natsjs(*server.args[4:])
    assert again.alive()
    return again

def raw_subscriber(port: int, user: str | None = None) -> socket.socket:
    """A client of ``user``'s account (the default one without) on a bare socket,
    subscribed to everything: it sees every protocol line the server writes to it,
    forged ones included."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.recv(4096)
    auth = b',"user":"%s","pass":"%s"' % (user.encode(), user.encode()) if user else b""
    s.sendall(b'CONNECT {"verbose":false,"headers":true%s}\r\n'
              b"SUB > 1\r\nPING\r\n" % auth)
    buf = b""
    while b"PONG\r\n" not in buf:
        buf += s.recv(4096)
    return s


def frames(data: bytes) -> list[bytes]:
    """The subjects of the MSG/HMSG frames in ``data``, read as a client reads them
    (by the sizes in each line); anything that is not a frame fails the test."""
    subjects = []
    i = 0
    while i < len(data):
        end = data.index(b"\r\n", i)
        line = data[i:end].split(b" ")
        i = end + 2
        if line[0] in (b"PING", b"PONG"):
            continue
        assert line[0] in (b"MSG", b"HMSG"), data[i - 200:i + 200]
        size = int(line[-1])
        subjects.append(line[1])
        assert data[i + size:i + size + 2] == b"\r\n"
        i += size + 2
    return subjects


def read_until_pong(s: socket.socket) -> bytes:
    s.sendall(b"PING\r\n")
    buf = b""
    while not buf.endswith(b"PONG\r\n"):
        chunk = s.recv(65536)
        assert chunk, "connection closed"
        buf += chunk
    return buf


class RawRequester:
    """A client on a bare socket that sends exactly the bytes it is given, subject
    included (nats-py encodes subjects as text), and reads its answers by the sizes in
    each frame line.  ``request`` returns the answer's payload, or None when none came
    within ``wait`` seconds."""

    def __init__(self, port: int, user: str | None = None):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""
        self.n = 0
        self.errors: list[bytes] = []
        self._line()                                    # INFO
        auth = b',"user":"%s","pass":"%s"' % (user.encode(), user.encode()) if user else b""
        self.sock.sendall(b'CONNECT {"verbose":false,"headers":true%s}\r\n'
                          b"SUB _RAW.* 1\r\n" % auth)
        assert self.ping(), self.errors

    def close(self) -> None:
        self.sock.close()

    def _fill(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            return False
        if not chunk:
            raise ConnectionError("closed by the server: %r" % self.errors)
        self.buf += chunk
        return True

    def _line(self, deadline: float | None = None) -> bytes | None:
        deadline = deadline or time.monotonic() + 5
        while b"\r\n" not in self.buf:
            if not self._fill(deadline):
                return None
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _next(self, deadline: float):
        """The next thing the server sent: ("MSG", subject, payload), ("PONG",), or
        None at the deadline; PINGs are answered on the way."""
        while True:
            line = self._line(deadline)
            if line is None:
                return None
            op = line.split(b" ", 1)[0].upper()
            if op in (b"MSG", b"HMSG"):
                args = line.split(b" ")
                size = int(args[-1])
                hsize = int(args[-2]) if op == b"HMSG" else 0
                while len(self.buf) < size + 2:
                    if not self._fill(deadline):
                        return None
                data, self.buf = self.buf[:size], self.buf[size + 2:]
                return ("MSG", args[1], data[hsize:])
            if op == b"PING":
                self.sock.sendall(b"PONG\r\n")
            elif op == b"PONG":
                return ("PONG",)
            elif op == b"-ERR":
                self.errors.append(line)
            # INFO updates and +OK are not answers.

    def ping(self, wait: float = 5.0) -> bool:
        self.sock.sendall(b"PING\r\n")
        deadline = time.monotonic() + wait
        while (got := self._next(deadline)) is not None:
            if got[0] == "PONG":
                return True
        return False

    def request(self, subject: bytes, body: bytes, wait: float = 5.0) -> bytes | None:
        self.n += 1
        reply = b"_RAW.%d" % self.n
        self.sock.sendall(b"PUB %s %s %d\r\n%s\r\n" % (subject, reply, len(body), body))
        deadline = time.monotonic() + wait
        while (got := self._next(deadline)) is not None:
            if got[0] == "MSG" and got[1] == reply:
                return got[2]
        return None
