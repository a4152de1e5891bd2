"""Clients failing over in a cluster that was started all at once, as test harnesses do.

Three and five servers, each routed to all the others, are started one after another
without waiting; a client connects to the first at once, and the server it is on is
stopped, again and again (tests/failover_client.py is the client).  nats-py runs in
this interpreter; nats-core (PyPI ``nats-core``, Python 3.13 only) in a virtualenv
that a session fixture makes under ~/.cache.  The reference nats-server runs the same
scenario in the same test, to show the expectation holds there.

Also here: what a stopping server does with connections that arrive meanwhile.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ServerProcess, natsjs_command, reference_server_binary, start_natsjs, \
    start_reference

HERE = Path(__file__).parent
ROUNDS = {3: 5, 5: 2}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(kind: str, n: int) -> list[ServerProcess]:
    """n servers on chosen ports, each routed to the others, started without waiting."""
    ports = [_free_port() for _ in range(n)]
    cluster_ports = [_free_port() for _ in range(n)]
    command = natsjs_command() if kind == "natsjs" else [reference_server_binary()]
    procs = []
    for i in range(n):
        routes = ",".join("nats://127.0.0.1:%d" % p for j, p in enumerate(cluster_ports)
                          if j != i)
        args = ["-a", "127.0.0.1", "-p", str(ports[i]), "--cluster",
                "nats://127.0.0.1:%d" % cluster_ports[i], "--cluster_name", "FO",
                "--routes", routes]
        p = ServerProcess(command + args, args=args)
        p.port = ports[i]
        procs.append(p)
    return procs


def fail_over(python: str, client: str, kind: str, n: int) -> dict:
    procs = start_cluster(kind, n)
    try:
        argv = [python, str(HERE / "failover_client.py"), client] + \
            ["%d:%d" % (p.port, p.proc.pid) for p in procs]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        lines = out.stdout.strip().splitlines()
        assert lines, out.stderr[-2000:]
        result = json.loads(lines[-1])
        if not result["ok"]:
            result["logs"] = [p.text()[-3000:] for p in procs]
        return result
    finally:
        for p in procs:
            p.stop()


@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize("kind", ["natsjs", "reference"])
@pytest.mark.parametrize("client", ["nats-py", "nats-core"])
def test_client_fails_over_to_a_survivor_every_time(request, client, kind, n):
    python = sys.executable if client == "nats-py" else request.getfixturevalue(
        "nats_core_python")
    for round_ in range(ROUNDS[n]):
        result = fail_over(python, "py" if client == "nats-py" else "core", kind, n)
        assert result["ok"], (round_, result)
        assert len(result["steps"]) == n - 1


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_a_stopping_server_refuses_new_connections_at_once(kind):
    """While a stop waits for slow clients to drain, a client that reconnects to this
    server must be refused at once, not left waiting for an INFO that never comes
    (nats-server closes its listener first)."""
    s = (start_natsjs if kind == "natsjs" else start_reference)("-D")
    try:
        stuck = socket.create_connection(("127.0.0.1", s.port))
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.recv(4096)
        stuck.sendall(b'CONNECT {"verbose":false}\r\nSUB big 1\r\nPING\r\n')
        buf = b""
        while b"PONG" not in buf:
            buf += stuck.recv(4096)
        # ~16 MB towards a reader that never reads: the server's writes block.
        pub = socket.create_connection(("127.0.0.1", s.port))
        pub.recv(4096)
        pub.sendall(b'CONNECT {"verbose":false}\r\n')
        chunk = b"PUB big 262144\r\n" + b"x" * 262144 + b"\r\n"
        for _ in range(64):
            pub.sendall(chunk)
        pub.sendall(b"PING\r\n")
        buf = b""
        while b"PONG" not in buf:
            buf += pub.recv(4096)
        s.proc.send_signal(signal.SIGTERM)
        s.wait_for(re.compile(rb"Trapped"))
        try:
            probe = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        except ConnectionRefusedError:
            return
        probe.settimeout(1.0)
        try:
            data = probe.recv(4096)
        except ConnectionResetError:
            data = b""
        except socket.timeout:
            pytest.fail("a connection to the stopping server was accepted and left hanging")
        finally:
            probe.close()
        # Accepted before the stop took hold: it got its INFO or was closed at once.
        assert data == b"" or data.startswith(b"INFO "), data
    finally:
        s.stop()
        for c in ("stuck", "pub"):
            if c in locals():
                locals()[c].close()
