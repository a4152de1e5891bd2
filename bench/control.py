"""Control-plane benchmarks: subscribe, connect and route interest, natsjs next to nats-server.

natsbench measures messages; these loads measure the work around them, with a small
raw-socket load generator (this module) that drives both servers byte for byte the same:

* ``subs``: one connection sends ``--subs`` SUB lines for distinct subjects and a PING;
  the time is from the first byte sent to the PONG.  The server's RSS is read from
  ``/proc`` before the SUBs and after the PONG, which gives the RSS per subscription.
* ``conns``: ``--conns`` connections, at most ``--window`` being set up at once, each
  waiting for the INFO as clients do, then sending CONNECT, ``--conn-subs`` SUBs and a
  PING; the time is from the first connect to the last PONG (all stay open until then).
* ``route``: a server holding ``--subs`` subscriptions (one client, as in ``subs``) is
  joined by a second server that routes to it; the time is from the second server's
  first monitoring answer (before it has dialled anyone: both servers start their
  monitoring port before routing) until its ``/routez`` counts that many subscriptions
  on its routes (the few the servers' own internal subscriptions add make no
  difference at this size).
* ``jsconfig``: JetStream configuration checks that compare subjects set-wise: a stream
  create with ``--js-subjects`` subjects, then a consumer create with ``--js-filters``
  filter subjects, one request after the other on one connection (from the first byte
  of the first request to the last reply; the figure is subjects checked per second),
  while a second connection does PING round trips: the longest of those (the "PING
  during" row; the ratio is nats-server's over natsjs's) shows whether other clients
  were served meanwhile.

Each load runs ``--repeat`` times per server on fresh processes, the order alternating;
the table gives medians and the natsjs/nats-server ratio of rates (for RSS, of
subscriptions per megabyte), so that >= 1.0 means natsjs is at or better than the
reference.  ``--pin`` runs every server on core 0 and this generator on core 1
(bench/servers.py SERVER_CPU, LOAD_CPU).

    python -m bench.control [--nats-server PATH] [--repeat 3] [--load subs,conns,route,jsconfig]
"""
from __future__ import annotations

import argparse
import datetime as dt
import errno
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .servers import (HOST, LOAD_CPU, NATSJS, REFERENCE, SERVER_CPU, ServerKind, _http_json,
                      _wait_port, free_ports, on_cpu, read_until, rss_bytes, server_kinds,
                      stop)

REPO = Path(__file__).resolve().parent.parent
CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"protocol":1,"lang":"bench","version":"1"}\r\n'
LOADS = ("subs", "conns", "route", "jsconfig")
TITLES = {"subs": "subscribe (1 connection, %(subs)dk SUB, then PING)",
          "jsconfig": "JetStream config checks (stream of %(js_subjects)d subjects, "
                      "consumer of %(js_filters)d filters)",
          "jsping": "longest PING during those",
          "conns": "connection set-up (%(conns)d x CONNECT + %(conn_subs)d SUB)",
          "route": "route interest exchange (server joins one holding %(subs)dk subs)",
          "rss": "RSS per subscription"}


# --------------------------------------------------------------------------- helpers

def sub_lines(n: int, prefix: bytes, first_sid: int = 1) -> bytes:
    return b"".join(b"SUB %s.%d %d\r\n" % (prefix, i, first_sid + i) for i in range(n))


class Client:
    """One blocking client connection: INFO read, CONNECT sent and PING answered."""

    def __init__(self, port: int, timeout: float):
        self.timeout = timeout
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        read_until(self.sock, b"\r\n", buf, timeout)
        self.ping(CONNECT)

    def ping(self, before: bytes = b"") -> None:
        """Send ``before`` and a PING, wait for the PONG: the server has processed it all."""
        self.sock.settimeout(self.timeout)
        self.sock.sendall(before + b"PING\r\n")
        read_until(self.sock, b"PONG\r\n", bytearray(), self.timeout)

    def close(self) -> None:
        self.sock.close()


def launch(kind: ServerKind, args: list[str], log: Path, cpu: int | None) -> subprocess.Popen:
    with open(log, "wb") as logf:
        # taskset execs the server: the Popen's pid is the server's (for its RSS)
        return subprocess.Popen(on_cpu([*kind.cmd, *args], cpu), stdin=subprocess.DEVNULL,
                                stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)


# --------------------------------------------------------------------------- loads

def load_subs(port: int, pid: int, n: int, timeout: float) -> dict:
    c = Client(port, timeout)
    try:
        payload = sub_lines(n, b"bench.subs")
        before = rss_bytes(pid)
        t0 = time.perf_counter()
        c.ping(payload)
        seconds = time.perf_counter() - t0
        after = rss_bytes(pid)
    finally:
        c.close()
    return {"ops": n, "seconds": seconds, "rate": n / seconds,
            "rss_before": before, "rss_after": after, "rss_per_sub": (after - before) / n}


def load_conns(port: int, conns: int, subs_each: int, window: int, timeout: float) -> dict:
    """``conns`` clients set up through one epoll loop, ``window`` at a time."""
    sel = selectors.DefaultSelector()
    reqs = [CONNECT + sub_lines(subs_each, b"conn.%d" % i) + b"PING\r\n" for i in range(conns)]
    done_socks: list[socket.socket] = []
    state: dict[socket.socket, list] = {}     # sock -> [index, phase, buffer]
    started = 0
    finished = 0
    deadline = time.monotonic() + timeout

    def start_one() -> None:
        nonlocal started
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = s.connect_ex((HOST, port))
        if err not in (0, errno.EINPROGRESS):
            raise OSError(err, os.strerror(err))
        state[s] = [started, 0, bytearray()]
        sel.register(s, selectors.EVENT_READ)
        started += 1

    t0 = time.perf_counter()
    try:
        while finished < conns:
            while started < conns and started - finished < window:
                start_one()
            if time.monotonic() > deadline:
                raise TimeoutError("%d of %d connections set up in %gs" % (finished, conns, timeout))
            for key, _ in sel.select(1.0):
                s = key.fileobj
                st = state[s]
                try:
                    chunk = s.recv(65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    raise ConnectionError("connection %d closed by the server: %r"
                                          % (st[0], bytes(st[2][-200:])))
                st[2] += chunk
                if st[1] == 0:
                    if b"\r\n" in st[2]:           # the INFO: now the client speaks
                        st[1] = 1
                        del st[2][:]
                        s.sendall(reqs[st[0]])
                elif b"PONG\r\n" in st[2]:
                    if b"-ERR" in st[2]:
                        raise ConnectionError("server error: %r" % bytes(st[2][:200]))
                    sel.unregister(s)
                    del state[s]
                    done_socks.append(s)
                    finished += 1
        seconds = time.perf_counter() - t0
    finally:
        for s in list(state) + done_socks:
            s.close()
        sel.close()
    return {"ops": conns, "seconds": seconds, "rate": conns / seconds}


def read_msg(sock: socket.socket, buf: bytearray, timeout: float) -> bytes:
    """The payload of the next MSG on ``sock`` (answering the server's PINGs)."""
    while True:
        read_until(sock, b"\r\n", buf, timeout)
        end = buf.index(b"\r\n")
        line = bytes(buf[:end])
        del buf[:end + 2]
        if line.startswith(b"MSG "):
            size = int(line.split()[-1])
            data = read_exactly(sock, buf, size + 2, timeout)
            return data[:size]
        if line.startswith(b"PING"):
            sock.sendall(b"PONG\r\n")
        elif line.startswith(b"-ERR"):
            raise ConnectionError("server error: %r" % line)


def read_exactly(sock: socket.socket, buf: bytearray, n: int, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    while len(buf) < n:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed by the server")
        buf += chunk
    out = bytes(buf[:n])
    del buf[:n]
    return out


def load_jsconfig(port: int, n_subjects: int, n_filters: int, timeout: float) -> dict:
    """A stream create with ``n_subjects`` subjects, then a consumer create with
    ``n_filters`` of them as filters, while another connection does PING round trips."""
    subjects = ["cfg.%d.x" % i for i in range(n_subjects)]
    bodies = [
        (b"$JS.API.STREAM.CREATE.CFG",
         {"name": "CFG", "subjects": subjects, "storage": "memory"}),
        (b"$JS.API.CONSUMER.CREATE.CFG.C",
         {"stream_name": "CFG", "config": {"name": "C", "durable_name": "C",
                                           "ack_policy": "explicit",
                                           "filter_subjects": subjects[:n_filters]}})]
    c = Client(port, timeout)
    pinger = Client(port, timeout)
    stop_pinging = threading.Event()
    pings: list[float] = []

    def ping() -> None:
        while not stop_pinging.is_set():
            t = time.perf_counter()
            pinger.ping()
            pings.append(time.perf_counter() - t)

    thread = threading.Thread(target=ping, daemon=True)
    try:
        c.ping(b"SUB _INBOX.cfg 1\r\n")
        buf = bytearray()
        answers, times = [], []
        thread.start()
        t0 = time.perf_counter()
        for subject, body in bodies:
            data = json.dumps(body).encode()
            t = time.perf_counter()
            c.sock.sendall(b"PUB %s _INBOX.cfg %d\r\n%s\r\n" % (subject, len(data), data))
            answers.append(json.loads(read_msg(c.sock, buf, timeout)))
            times.append(time.perf_counter() - t)
        seconds = time.perf_counter() - t0
    finally:
        stop_pinging.set()
        if thread.is_alive():
            thread.join(timeout)
        c.close()
        pinger.close()
    errors = [a["error"] for a in answers if "error" in a]
    if errors:
        raise RuntimeError("JetStream answered %s" % errors[0])
    ops = n_subjects + n_filters
    return {"ops": ops, "seconds": seconds, "rate": ops / seconds, "stream_s": times[0],
            "consumer_s": times[1], "longest_ping": max(pings) if pings else None,
            "pings": len(pings)}


def wait_remote_interest(http_port: int, target: int,
                         timeout: float) -> tuple[float, float, int]:
    """Poll ``/routez`` until the server's routes hold ``target`` subscriptions of its
    peers; returns (first answer, done) as perf_counter times and the count."""
    deadline = time.monotonic() + timeout
    first = None
    count = 0
    while time.monotonic() < deadline:
        d = _http_json(http_port, "/routez")
        now = time.perf_counter()
        if d is not None and "routes" in d:
            if first is None:
                first = now
            count = sum(r.get("subscriptions", 0) for r in d.get("routes") or [])
            if count >= target:
                return first, now, count
        time.sleep(0.005)
    raise TimeoutError("/routez on :%d: %d of %d remote subscriptions after %gs"
                       % (http_port, count, target, timeout))


# --------------------------------------------------------------------------- one measurement

def measure(kind: ServerKind, load: str, args, work: Path) -> dict:
    """Start fresh server(s) of ``kind``, run one ``load``, stop them; a dict of figures."""
    pin = SERVER_CPU if args.pin else None
    procs: list[subprocess.Popen] = []
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    tag = f"{load}.{kind.label}.{time.monotonic_ns()}"
    try:
        if load in ("subs", "conns", "jsconfig"):
            port, http = free_ports(2)
            log = logs / f"{tag}.log"
            js = ["-js", "-sd", str(work / tag)] if load == "jsconfig" else []
            procs.append(launch(kind, ["-a", HOST, "-p", str(port), "-m", str(http), *js],
                                log, pin))
            _wait_port(port, procs[0], time.monotonic() + 30, log)
            if load == "subs":
                return load_subs(port, procs[0].pid, args.subs, args.timeout)
            if load == "jsconfig":
                return load_jsconfig(port, args.js_subjects, args.js_filters, args.timeout)
            return load_conns(port, args.conns, args.conn_subs, args.window, args.timeout)
        # route: A holds the subscriptions, B joins it.
        pa, ca, ha, pb, cb, hb = free_ports(6)
        cluster = ["--cluster_name", "ctlbench"]
        log_a, log_b = logs / f"{tag}-a.log", logs / f"{tag}-b.log"
        procs.append(launch(kind, ["-a", HOST, "-p", str(pa), "-m", str(ha), "-n", "ctl-a",
                                   *cluster, "--cluster", f"nats://{HOST}:{ca}"], log_a, pin))
        _wait_port(pa, procs[0], time.monotonic() + 30, log_a)
        c = Client(pa, args.timeout)
        try:
            c.ping(sub_lines(args.subs, b"bench.route"))
            procs.append(launch(kind, ["-a", HOST, "-p", str(pb), "-m", str(hb), "-n", "ctl-b",
                                       *cluster, "--cluster", f"nats://{HOST}:{cb}",
                                       "--routes", f"nats://{HOST}:{ca}"], log_b, pin))
            first, done, count = wait_remote_interest(hb, args.subs, args.timeout)
            rss_b = rss_bytes(procs[1].pid)
        finally:
            c.close()
        seconds = done - first
        return {"ops": args.subs, "seconds": seconds, "rate": args.subs / seconds,
                "count": count, "rss_joiner": rss_b}
    finally:
        for p in procs:
            stop(p)


# --------------------------------------------------------------------------- report

def summarise(rows: list[dict], servers: list[str], loads: list[str]) -> list[dict]:
    out = []
    for load in loads:
        figures = {"subs": ("rate", "rss_per_sub"), "jsconfig": ("rate", "longest_ping")}
        for figure in figures.get(load, ("rate",)):
            name = {"rss_per_sub": "rss", "longest_ping": "jsping"}.get(figure, load)
            e = {"load": name}
            for s in servers:
                vals = [r[figure] for r in rows if r["load"] == load and r["server"] == s
                        and not r.get("error") and r.get(figure) is not None]
                e[s] = statistics.median(vals) if vals else None
            out.append(e)
    return out


def table(summary: list[dict], servers: list[str], args) -> str:
    both = REFERENCE in servers and NATSJS in servers
    head = ["load"] + [f"{s}" for s in servers] + (["natsjs/nats-server"] if both else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    params = {"subs": args.subs // 1000, "conns": args.conns, "conn_subs": args.conn_subs,
              "js_subjects": args.js_subjects, "js_filters": args.js_filters}
    # For these the smaller figure is the better one: the ratio is nats-server's over ours.
    lower_better = ("rss", "jsping")
    for e in summary:
        title = TITLES[e["load"]] % params
        if e["load"] == "rss":
            cells = [("%.0f B" % e[s]) if e[s] is not None else "–" for s in servers]
        elif e["load"] == "jsping":
            cells = [("%.3f s" % e[s]) if e[s] is not None else "–" for s in servers]
        else:
            unit = {"conns": "conns/s", "jsconfig": "subjects/s"}.get(e["load"], "subs/s")
            cells = [("%s %s" % (f"{e[s]:,.0f}", unit)) if e[s] is not None else "–"
                     for s in servers]
        if both:
            ref, ours = e[REFERENCE], e[NATSJS]
            if ref and ours:
                # RSS: subscriptions per byte, so that >= 1.0 is at or better here too
                ratio = ref / ours if e["load"] in lower_better else ours / ref
                cells.append("%.2f" % ratio)
            else:
                cells.append("–")
        lines.append("| " + " | ".join([title] + cells) + " |")
    return "\n".join(lines) + "\n"


def failures(rows: list[dict]) -> str:
    """The measurements that failed, one line each (empty when none did)."""
    return "".join("- %s on %s, repeat %d: %s\n" % (r["load"], r["server"], r["repeat"],
                                                     r["error"])
                   for r in rows if r.get("error"))


def result_row(row: dict, slot: int, args) -> dict:
    """A RESULTS row of bench.trace's schema: msgs = operations (SUBs, connections),
    msgs_per_sec = their rate; for ``subs``, size = RSS bytes per subscription."""
    return {"scenario": "ctl-" + row["load"], "title": row["load"], "mode": "ctl-" + row["load"],
            "topology": "cluster2-join" if row["load"] == "route" else "single",
            # jsconfig: p99_us carries the longest PING round trip during the requests
            "nodes": 2 if row["load"] == "route" else 1, "server": row["server"],
            "repeat": row["repeat"], "slot": slot, "started_at": row["started_at"],
            "msgs": row.get("ops"), "size": round(row["rss_per_sub"]) if "rss_per_sub" in row else None,
            "pubs": 0, "subs": args.conn_subs if row["load"] == "conns" else args.subs,
            "seconds": row.get("seconds"), "msgs_per_sec": row.get("rate"),
            "mb_per_sec": None, "p50_us": None,
            "p99_us": row["longest_ping"] * 1e6 if row.get("longest_ping") else None,
            "received": None, "samples": 0,
            "error": row.get("error"), "natsbench_args": "pin" if args.pin else None,
            "server_args": None}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.control",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--nats-server", default=None, help="reference server binary")
    ap.add_argument("--natsjs-cmd", default=None, help="command starting natsjs")
    ap.add_argument("--servers", default=f"{REFERENCE},{NATSJS}")
    ap.add_argument("--load", default=",".join(LOADS), help="comma separated: " + ",".join(LOADS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--subs", type=int, default=200_000, help="subscriptions (subs, route)")
    ap.add_argument("--conns", type=int, default=4000, help="connections (conns)")
    ap.add_argument("--conn-subs", type=int, default=10, help="SUBs per connection (conns)")
    ap.add_argument("--window", type=int, default=100, help="connections being set up at once")
    ap.add_argument("--js-subjects", type=int, default=10_000,
                    help="subjects of the stream (jsconfig)")
    ap.add_argument("--js-filters", type=int, default=5_000,
                    help="filter subjects of the consumer (jsconfig)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per load, seconds")
    ap.add_argument("--pin", action="store_true",
                    help="servers on core 0, this generator on core 1 (taskset)")
    ap.add_argument("--results", default=None, help="write a trace folder under this directory")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    loads = [x.strip() for x in args.load.split(",") if x.strip()]
    if set(loads) - set(LOADS):
        raise SystemExit("--load: choose from " + ",".join(LOADS))
    kinds = server_kinds(args.servers, args.nats_server, args.natsjs_cmd)
    if args.pin:
        on_cpu([], LOAD_CPU)                  # checks taskset and the cores are there
        os.sched_setaffinity(0, {LOAD_CPU})
    servers = [k.label for k in kinds]
    writer = None
    if args.results:
        from .trace import RunWriter, git_info, machine_info, new_run_id
        sha, dirty = git_info(REPO)
        started = dt.datetime.now(dt.timezone.utc)
        run_id = new_run_id(sha, started) + "-ctl"
        writer = RunWriter(Path(args.results) / run_id, run_id)
        for k in kinds:
            writer.add_meta({"kind": "e2e", "started_at": started, "git_sha": sha,
                             "git_dirty": dirty, "server": k.label, "server_version": k.version(),
                             "server_cmd": " ".join(k.cmd), "natsbench": "bench.control",
                             **machine_info(), "repeat": args.repeat, "quick": False,
                             "scenarios": ",".join("ctl-" + x for x in loads),
                             "params": json.dumps(vars(args)),
                             "argv": " ".join(sys.argv)})
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="natsjs-ctl-") as tmp:
        for load in loads:
            for rep in range(args.repeat):
                for kind in (kinds if rep % 2 == 0 else kinds[::-1]):
                    row = {"load": load, "server": kind.label, "repeat": rep,
                           "started_at": dt.datetime.now(dt.timezone.utc)}
                    try:
                        row.update(measure(kind, load, args, Path(tmp)))
                    except (OSError, RuntimeError, TimeoutError, ConnectionError) as exc:
                        row["error"] = str(exc).splitlines()[0]
                    rows.append(row)
                    print("  %-6s %-12s r%d " % (load, kind.label, rep)
                          + ("%8.3f s %12s/s" % (row["seconds"], f"{row['rate']:,.0f}")
                             if "rate" in row else "")
                          + ("  rss %.0f B/sub" % row["rss_per_sub"] if "rss_per_sub" in row else "")
                          + ("  ERROR %s" % row["error"] if row.get("error") else ""),
                          file=sys.stderr)
                    if writer is not None:
                        writer.add_result(result_row(row, len(rows) - 1, args))
                        writer.flush()
    text = table(summarise(rows, servers, loads), servers, args)
    if failures(rows):
        text += "\n" + failures(rows)
    if args.pin:
        text = "pinned: servers on core %d, this generator on core %d\n\n" % (SERVER_CPU,
                                                                              LOAD_CPU) + text
    if writer is not None:
        (writer.dir / "table.md").write_text(text)
        print("trace: %s" % writer.dir, file=sys.stderr)
    print(text)
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
