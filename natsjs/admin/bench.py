"""``natsjs bench ...``: natscli's benchmark utility, on nats-py.

``pub``/``sub`` measure core NATS, ``js pub sync|async`` JetStream publishing (each
PubAck awaited, or ``--batch`` publishes in flight), ``js ordered`` reading a stream
back.  Each client has its own connection; each reports msgs/sec and bytes/sec as
natscli does ("NATS Core NATS publisher stats: 123,456 msgs/sec ~ 15 MiB/sec"), with
per-client lines and min/avg/max/stddev when there are several, latency percentiles
for synchronous publishing, and a progress bar on a terminal.
"""
from __future__ import annotations

import asyncio
import json
import math
import statistics
import sys
import time

from natsjs.admin.errors import APIError, CLIError
from natsjs.admin.jsapi import JSApi, ordered_read
from natsjs.admin.render import comma, go_duration, ibytes, log, parse_bytes, parse_duration, NS

TYPES = {
    "pub": "Core NATS publisher", "sub": "Core NATS subscriber",
    "jspubsync": "JetStream synchronous publisher", "jspubasync":
        "JetStream asynchronous publisher", "jsordered": "JetStream ordered ephemeral consumer",
}
DEFAULT_STREAM = "benchstream"


def register(top) -> None:
    g = top.group("bench", "Benchmark utility")

    def common(p, subject=True):
        if subject:
            p.add_argument("subject", help="Subject to use for the benchmark")
        p.add_argument("--clients", type=int, default=1, help="Number of concurrent clients")
        p.add_argument("--msgs", type=int, default=100000, help="Number of messages")
        p.add_argument("--size", default="128B", help="Size of the test messages")
        p.add_argument("--progress", action=__import__("argparse").BooleanOptionalAction,
                       default=True, help="Enable or disable the progress bar")
        p.add_argument("--csv", default="", help="Save benchmark data to CSV file")
        p.add_argument("--sleep", default="", help="Sleep between publications")

    common(g.command("pub", "Publish Core NATS messages", pub))
    common(g.command("sub", "Subscribe to Core NATS messages", sub))
    js = g.group("js", "JetStream benchmark commands")
    jp = js.group("pub", "Publish JetStream messages")
    for name, func, help_ in (("sync", js_pub_sync, "Use synchronous JetStream publish"),
                              ("async", js_pub_async, "Use asynchronous JetStream publish")):
        p = jp.command(name, help_, func)
        common(p)
        p.add_argument("--stream", default=DEFAULT_STREAM, help="The stream to create or use")
        p.add_argument("--create", action="store_true", help="Create or update the stream first")
        p.add_argument("--storage", choices=["memory", "file"], default="file")
        p.add_argument("--replicas", type=int, default=1)
        p.add_argument("--maxbytes", default="1GB", help="The maximum size of the stream")
        p.add_argument("--purge", action="store_true", help="Purge the stream before running")
        p.add_argument("--batch", type=int, default=500, help="Publishes in flight (async)")
    p = js.command("ordered", "Consume JetStream messages from a consumer using an ephemeral "
                   "ordered consumer", js_ordered)
    common(p, subject=False)
    p.add_argument("--stream", default=DEFAULT_STREAM, help="The stream to consume")


# ---- results ------------------------------------------------------------------------------


class Sample:
    def __init__(self, msgs: int, size: int, start: float, end: float, latencies=None):
        self.msgs, self.size, self.start, self.end = msgs, size, start, end
        self.latencies = latencies or []          # microseconds

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1e-9)

    @property
    def rate(self) -> int:
        return int(self.msgs / self.seconds)

    @property
    def throughput(self) -> float:
        return self.msgs * self.size / self.seconds

    def __str__(self) -> str:
        text = "%s msgs/sec ~ %s/sec" % (comma(self.rate), ibytes(self.throughput))
        if self.latencies:
            lat = sorted(self.latencies)
            text += " ~ min: %sus ~ avg: %sus ~ max: %sus ~ P50: %sus ~ P90: %sus ~ P99: " \
                    "%sus ~ P99.9: %sus" % tuple(_us(v) for v in (
                        lat[0], statistics.fmean(lat), lat[-1], _pct(lat, 50), _pct(lat, 90),
                        _pct(lat, 99), _pct(lat, 99.9)))
        return text


def _us(v: float) -> str:
    return "{:,.2f}".format(v).rstrip("0").rstrip(".")


def _pct(sorted_values, p: float) -> float:
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, int(math.ceil(p / 100 * len(sorted_values))) - 1))
    return sorted_values[k]


def report(kind: str, samples: list[Sample]) -> str:
    """natscli's BenchmarkResults.Report."""
    label = TYPES[kind]
    if not samples:
        return "No publisher or subscribers. Nothing to report."
    if len(samples) == 1:
        return "NATS %s stats: %s\n" % (label, samples[0])
    out = []
    for i, s in enumerate(samples, 1):
        out.append("  [%d] %s (%s msgs)" % (i, s, comma(s.msgs)))
    start, end = min(s.start for s in samples), max(s.end for s in samples)
    total = sum(s.msgs for s in samples)
    agg = Sample(total, samples[0].size, start, end)
    rates = [s.rate for s in samples]
    out.append("\n NATS %s aggregated stats: %s msgs/sec ~ %s/sec" % (
        label, comma(agg.rate), ibytes(agg.throughput)))
    out.append(" message rates min %s | avg %s | max %s | stddev %s msgs" % (
        comma(min(rates)), comma(int(statistics.fmean(rates))), comma(max(rates)),
        comma(int(statistics.pstdev(rates)))))
    lats = sorted(v for s in samples for v in s.latencies)
    if lats:
        out.append(" latencies per operation min %sus | avg %sus | max %sus | stddev %sus | "
                   "P50 %sus | P90 %sus | P99 %sus | P99.9: %sus" % tuple(_us(v) for v in (
                       lats[0], statistics.fmean(lats), lats[-1], statistics.pstdev(lats),
                       _pct(lats, 50), _pct(lats, 90), _pct(lats, 99), _pct(lats, 99.9))))
    return "\n".join(out) + "\n"


def _csv(samples: list[Sample], prefix: str) -> str:
    rows = ["#RunID, ClientID, MsgCount, MsgBytes, MsgsPerSec, BytesPerSec, DurationSecs"]
    run = time.strftime("%Y%m%d%H%M%S")
    for i, s in enumerate(samples):
        rows.append("%s,%s%d,%d,%d,%d,%f,%f" % (run, prefix, i, s.msgs, s.msgs * s.size,
                                                s.rate, s.throughput, s.seconds))
    return "\n".join(rows) + "\n"


class Progress:
    """A progress bar per client on stderr, redrawn in place, when it is a terminal."""

    def __init__(self, enabled: bool, totals: list[int]):
        self.on = enabled and sys.stderr.isatty()
        self.totals, self.done = totals, [0] * len(totals)
        self.last = 0.0
        if self.on:
            sys.stderr.write("\n" * len(totals))

    def add(self, i: int, n: int = 1) -> None:
        self.done[i] += n
        now = time.monotonic()
        if self.on and (now - self.last > 0.1 or self.done[i] == self.totals[i]):
            self.last = now
            self.draw()

    def draw(self) -> None:
        lines = []
        for d, t in zip(self.done, self.totals):
            frac = d / t if t else 1.0
            width = 40
            fill = int(frac * width)
            lines.append("%7s/%-7s [%s%s] %3d%%" % (comma(d), comma(t), "=" * fill,
                                                    " " * (width - fill), int(frac * 100)))
        sys.stderr.write("\x1b[%dA" % len(lines) + "".join(l_ + "\n" for l_ in lines))
        sys.stderr.flush()

    def close(self) -> None:
        if self.on:
            self.draw()


def _shares(total: int, clients: int) -> list[int]:
    base, extra = divmod(total, clients)
    return [base + (1 if i < extra else 0) for i in range(clients)]


def _banner(kind: str, a, extra: dict) -> None:
    args = {"clients": comma(a.clients), "msg-size": ibytes(_size(a)), "msgs": comma(a.msgs),
            "sleep": go_duration(_sleep(a) * NS if a.sleep else 0)}
    args.update(extra)
    log("Starting %s benchmark [%s]" % (TYPES[kind], ", ".join(
        "%s=%s" % kv for kv in sorted(args.items()))))


def _size(a) -> int:
    try:
        return max(0, parse_bytes(a.size))
    except ValueError:
        raise CLIError("invalid --size %r" % a.size) from None


def _sleep(a) -> float:
    return parse_duration(a.sleep) / NS if a.sleep else 0.0


def _finish(kind: str, a, samples: list[Sample], progress: Progress) -> None:
    progress.close()
    print()
    print(report(kind, samples))
    if a.csv:
        with open(a.csv, "w") as f:
            f.write(_csv(samples, "P" if "pub" in kind else "S"))
        print("Saved metric data in csv file %s" % a.csv)


async def _connections(rt, n: int) -> list:
    return [await rt.new_conn(name="NATSJS CLI bench") for _ in range(n)]


# ---- core ---------------------------------------------------------------------------------


async def pub(rt) -> None:
    a = rt.args
    a.clients = max(1, min(a.clients, a.msgs))
    _banner("pub", a, {"subject": a.subject})
    payload = b"\0" * _size(a)
    shares = _shares(a.msgs, a.clients)
    conns = await _connections(rt, a.clients)
    progress = Progress(a.progress, shares)
    pause = _sleep(a)

    async def client(i, nc):
        start = time.monotonic()
        for n in range(shares[i]):
            await nc.publish(a.subject, payload)
            progress.add(i)
            if pause:
                await asyncio.sleep(pause)
            elif n % 1000 == 999:
                await asyncio.sleep(0)
        await nc.flush(timeout=max(rt.timeout, 30))
        return Sample(shares[i], len(payload), start, time.monotonic())

    samples = await asyncio.gather(*(client(i, nc) for i, nc in enumerate(conns)))
    _finish("pub", a, list(samples), progress)


async def sub(rt) -> None:
    a = rt.args
    _banner("sub", a, {"subject": a.subject})
    conns = await _connections(rt, a.clients)
    progress = Progress(a.progress, [a.msgs] * a.clients)
    states = []
    for i, nc in enumerate(conns):
        st = {"n": 0, "bytes": 0, "start": 0.0, "end": 0.0, "done": asyncio.Event()}

        async def on_msg(msg, st=st, i=i):
            if st["n"] == 0:
                st["start"] = time.monotonic()
            st["n"] += 1
            progress.add(i)
            if st["n"] >= a.msgs:
                st["end"] = time.monotonic()
                st["done"].set()

        await nc.subscribe(a.subject, cb=on_msg)
        await nc.flush()
        states.append(st)
    log("Waiting for %s messages on %s" % (comma(a.msgs), a.subject))
    await asyncio.gather(*(st["done"].wait() for st in states))
    size = _size(a)
    _finish("sub", a, [Sample(st["n"], size, st["start"], st["end"]) for st in states],
            progress)


# ---- JetStream ----------------------------------------------------------------------------


async def _prepare_stream(rt, a) -> None:
    js = await rt.js()
    if a.create:
        cfg = {"name": a.stream, "subjects": [a.subject], "storage": a.storage,
               "num_replicas": a.replicas, "max_bytes": parse_bytes(a.maxbytes),
               "retention": "limits", "discard": "old", "max_msgs": -1, "max_age": 0,
               "max_consumers": -1, "duplicate_window": 120 * NS}
        try:
            await js.request("STREAM.CREATE." + a.stream, cfg)
        except APIError as e:
            if e.err_code != 10058:
                raise CLIError("could not create the stream: %s" % e) from None
            await js.request("STREAM.UPDATE." + a.stream, cfg,
                             doing="could not update the stream")
    else:
        await js.stream_info(a.stream)
    if a.purge:
        await js.request("STREAM.PURGE." + a.stream, None, doing="could not purge the stream")


def _js_extra(a) -> dict:
    out = {"subject": a.subject, "stream": a.stream, "purge": str(a.purge).lower(),
           "batch": comma(a.batch)}
    if a.create:
        out.update({"storage": a.storage, "replicas": comma(a.replicas),
                    "max-bytes": comma(parse_bytes(a.maxbytes))})
    return out


async def _publishers(rt, kind: str):
    """The stream ready, the banner out, one connection and share of messages each."""
    a = rt.args
    a.clients = max(1, min(a.clients, a.msgs))
    await _prepare_stream(rt, a)
    _banner(kind, a, _js_extra(a))
    shares = _shares(a.msgs, a.clients)
    conns = await _connections(rt, a.clients)
    return a, b"\0" * _size(a), shares, conns, Progress(a.progress, shares)


def _check_ack(data: bytes) -> None:
    try:
        ack = json.loads(data)
    except ValueError:
        raise CLIError("invalid PubAck %r" % data[:80]) from None
    if ack.get("error"):
        raise APIError(ack["error"], "publish failed")


async def js_pub_sync(rt) -> None:
    import nats.errors
    a, payload, shares, conns, progress = await _publishers(rt, "jspubsync")
    pause = _sleep(a)

    async def client(i, nc):
        lat = []
        start = time.monotonic()
        for _ in range(shares[i]):
            t0 = time.monotonic()
            try:
                resp = await nc.request(a.subject, payload, timeout=rt.timeout)
            except nats.errors.NoRespondersError:
                raise CLIError("no stream is listening on %s" % a.subject) from None
            lat.append((time.monotonic() - t0) * 1e6)
            _check_ack(resp.data)
            progress.add(i)
            if pause:
                await asyncio.sleep(pause)
        return Sample(shares[i], len(payload), start, time.monotonic(), lat)

    samples = await asyncio.gather(*(client(i, nc) for i, nc in enumerate(conns)))
    _finish("jspubsync", a, list(samples), progress)


async def js_pub_async(rt) -> None:
    a, payload, shares, conns, progress = await _publishers(rt, "jspubasync")
    batch = max(1, a.batch)

    async def client(i, nc):
        inbox = nc.new_inbox()
        acked = {"n": 0, "want": 0, "error": None}
        ready = asyncio.Event()

        async def on_ack(msg):
            acked["n"] += 1
            try:
                _check_ack(msg.data)
            except CLIError as e:
                acked["error"] = e
            progress.add(i)
            if acked["n"] >= acked["want"]:
                ready.set()

        await nc.subscribe(inbox, cb=on_ack)
        start = time.monotonic()
        sent = 0
        while sent < shares[i]:
            n = min(batch, shares[i] - sent)
            ready.clear()
            acked["want"] += n
            for _ in range(n):
                await nc.publish(a.subject, payload, reply=inbox)
            sent += n
            try:
                await asyncio.wait_for(ready.wait(), timeout=max(rt.timeout, 10))
            except asyncio.TimeoutError:
                raise CLIError("timed out waiting for %d PubAcks" % (acked["want"] - acked["n"])
                               ) from None
            if acked["error"]:
                raise acked["error"]
        return Sample(shares[i], len(payload), start, time.monotonic())

    samples = await asyncio.gather(*(client(i, nc) for i, nc in enumerate(conns)))
    _finish("jspubasync", a, list(samples), progress)


async def js_ordered(rt) -> None:
    a = rt.args
    js = await rt.js()
    info = await js.stream_info(a.stream)
    have = (info.get("state") or {}).get("messages", 0)
    if have < a.msgs:
        raise CLIError("stream %s holds %s messages, fewer than --msgs %s" % (
            a.stream, comma(have), comma(a.msgs)))
    _banner("jsordered", a, {"stream": a.stream})
    conns = await _connections(rt, a.clients)
    progress = Progress(a.progress, [a.msgs] * a.clients)

    async def client(i, nc):
        cjs = JSApi(nc, rt.settings.api_prefix, rt.timeout, rt.settings.trace)
        st = {"start": 0.0, "bytes": 0}

        async def on_msg(m):
            if not st["start"]:
                st["start"] = time.monotonic()
            st["bytes"] += len(m.data)
            progress.add(i)

        t0 = time.monotonic()
        await ordered_read(cjs, a.stream, None, "all", follow=True, on_msg=on_msg,
                           limit=a.msgs)
        size = st["bytes"] // a.msgs if a.msgs else 0
        return Sample(a.msgs, size, st["start"] or t0, time.monotonic())

    samples = await asyncio.gather(*(client(i, nc) for i, nc in enumerate(conns)))
    _finish("jsordered", a, list(samples), progress)
