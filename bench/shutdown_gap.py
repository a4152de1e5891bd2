"""Shutdown: how long a stopping server lives on after its clients saw it go.

A client of a server that is told to stop (SIGTERM) sees its connection close; a test
harness sees the process exit. nats-server closes its client connections last, right
before it exits, so the two are almost the same instant, and a harness that stops a
server and then starts waiting for the client to reconnect elsewhere does not miss the
reconnection (nats.py's nats-core test ``test_cluster_reconnect_sequential_shutdown``
does exactly that). This measures, for each kind of server, the time from the last
client connection closing (as a client sees it: end of file on its socket) to the
process exit (as its parent sees it: ``waitpid`` returning), and also from SIGTERM to
the first close and to the exit.

Each run starts one server (``--cluster N``: N routed servers, the one stopped being the
first; ``--js``: JetStream on, with ``--streams`` file streams to flush), connects
``--clients`` plain clients to it, sends SIGTERM and records the times.

    python -m bench.shutdown_gap [--nats-server PATH] [--repeat 5] [--cluster 3] [--js]

Prints one line per run and the medians with the natsjs / nats-server ratio.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from .servers import NATSJS, REFERENCE, free_ports, server_kinds


def _server_argv(kind, port: int, cluster_port: int, routes: list[int], js_dir: str | None,
                 http_port: int) -> list[str]:
    argv = list(kind.cmd) + ["-a", "127.0.0.1", "-p", str(port), "-m", str(http_port)]
    if cluster_port:
        argv += ["--cluster", "nats://127.0.0.1:%d" % cluster_port, "--cluster_name", "GAP",
                 "-n", "gap-%d" % port]
        if routes:
            argv += ["--routes", ",".join("nats://127.0.0.1:%d" % r for r in routes)]
    if js_dir:
        argv += ["-js", "-sd", js_dir]
    return argv


def _wait_ready(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Read the log until ``Server is ready``; the rest is drained in a thread."""
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError("server exited:\n" + b"".join(lines).decode(errors="replace"))
        lines.append(line)
        if b"Server is ready" in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return
    raise TimeoutError("server not ready")


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    f = s.makefile("rb")
    f.readline()                                   # INFO
    s.sendall(b'CONNECT {"verbose":false,"protocol":1}\r\nSUB gap.> 1\r\nPING\r\n')
    while f.readline() != b"PONG\r\n":
        pass
    return s


def _add_streams(port: int, n: int) -> None:
    s = _connect(port)
    f = s.makefile("rb")
    for i in range(n):
        cfg = {"name": "GAP%d" % i, "subjects": ["gap%d.>" % i], "storage": "file"}
        body = json.dumps(cfg).encode()
        s.sendall(b"SUB _INBOX.gap 99\r\nPUB $JS.API.STREAM.CREATE.GAP%d _INBOX.gap %d\r\n%s\r\n"
                  b"PUB gap%d.x %d\r\n%s\r\n"
                  % (i, len(body), body, i, 1000, b"x" * 1000))
        while not f.readline().startswith(b"MSG _INBOX.gap"):
            pass
        f.readline()
    s.close()


def one_run(kind, clients: int, cluster: int, js: bool, streams: int) -> dict:
    size = max(cluster, 1)
    free = free_ports(3 * size)
    ports, cports, hports = free[:size], free[size:2 * size], free[2 * size:]
    if not cluster:
        cports = [0] * size
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        procs = []
        for i in range(size):
            js_dir = os.path.join(tmp, "n%d" % i) if js else None
            argv = _server_argv(kind, ports[i], cports[i],
                                [c for j, c in enumerate(cports) if j != i and cluster],
                                js_dir, hports[i])
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
            procs.append(p)
            stack.callback(lambda p=p: (p.poll() is None and p.kill(), p.wait()))
        for p in procs:
            _wait_ready(p)
        if cluster:
            _wait_routes(hports, size)
        if js and streams:
            _add_streams(ports[0], streams)
        socks = [_connect(ports[0]) for _ in range(clients)]
        closed: list[float] = []
        exited: list[float] = []
        sel = selectors.DefaultSelector()
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)

        def watch_clients():
            left = len(socks)
            while left:
                for key, _ in sel.select(30):
                    try:
                        data = key.fileobj.recv(65536)
                    except (ConnectionError, BlockingIOError) as exc:
                        if isinstance(exc, BlockingIOError):
                            continue
                        data = b""
                    if not data:
                        closed.append(time.perf_counter())
                        sel.unregister(key.fileobj)
                        left -= 1

        def watch_exit():
            procs[0].wait()
            exited.append(time.perf_counter())

        threads = [threading.Thread(target=watch_clients), threading.Thread(target=watch_exit)]
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        procs[0].send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        for s in socks:
            s.close()
        return {"first_close_ms": (min(closed) - t0) * 1e3,
                "last_close_ms": (max(closed) - t0) * 1e3,
                "exit_ms": (exited[0] - t0) * 1e3,
                "gap_ms": (exited[0] - max(closed)) * 1e3}


def _wait_routes(hports: list[int], size: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ok = True
        for h in hports:
            with urllib.request.urlopen("http://127.0.0.1:%d/routez" % h, timeout=5) as r:
                names = {x.get("remote_name") or x.get("remote_id")
                         for x in json.load(r).get("routes") or []}
            ok &= len(names) >= size - 1
        if ok:
            return
        time.sleep(0.05)
    raise TimeoutError("routes not formed")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="%s,%s" % (REFERENCE, NATSJS))
    ap.add_argument("--nats-server", default=None)
    ap.add_argument("--natsjs-cmd", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--cluster", type=int, default=0)
    ap.add_argument("--js", action="store_true")
    ap.add_argument("--streams", type=int, default=0)
    ns = ap.parse_args(argv)
    kinds = server_kinds(ns.servers, ns.nats_server, ns.natsjs_cmd)
    results: dict[str, list[dict]] = {k.label: [] for k in kinds}
    for r in range(ns.repeat):
        for kind in (kinds if r % 2 == 0 else kinds[::-1]):
            out = one_run(kind, ns.clients, ns.cluster, ns.js, ns.streams)
            results[kind.label].append(out)
            print("%-12s run %d: %s" % (kind.label, r, "  ".join(
                "%s=%.2f" % kv for kv in out.items())), flush=True)
    med = {name: {k: statistics.median(o[k] for o in runs) for k in runs[0]}
           for name, runs in results.items() if runs}
    print("\n| median ms | " + " | ".join(med) + " | ratio natsjs/nats-server |")
    print("|---|" + "---|" * (len(med) + 1))
    for key in next(iter(med.values())):
        vals = [med[n][key] for n in med]
        ratio = (med[NATSJS][key] / med[REFERENCE][key]
                 if NATSJS in med and REFERENCE in med and med[REFERENCE][key] else float("nan"))
        print("| %s | %s | %.1f |" % (key, " | ".join("%.2f" % v for v in vals), ratio))
    return 0


if __name__ == "__main__":
    sys.exit(main())
