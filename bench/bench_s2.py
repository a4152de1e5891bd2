"""Micro-benchmarks for natsjs._core.s2 on route-shaped traffic.

Run:  .venv/bin/python -m pytest bench/bench_s2.py --benchmark-min-rounds=3 -q

Each case records in ``extra_info`` the throughput in MB/s of *uncompressed* bytes (the
figure that matters for a route: how much message traffic one core can push through)
and the compression ratio (uncompressed / compressed).  Two flush shapes: a 1 MiB flush
(busy route, writer coalesced many messages) and 16 KiB flushes (lightly loaded route,
where per-flush set-up cost dominates).  python-snappy's raw block codec is measured on
the same data as a baseline.
"""
import random

import pytest

from natsjs._core.s2 import S2Reader, S2Writer

try:
    import snappy
except ImportError:  # pragma: no cover - optional baseline
    snappy = None

LEVELS = ["fast", "better", "best"]


def route_traffic(seed: int, size: int) -> bytes:
    """RMSG lines with JSON-ish (60%) and random (40%) payloads of 16 B..4 KB."""
    rnd = random.Random(seed)
    subjects = [b"orders.new", b"orders.eu.paid", b"telemetry.host17.cpu",
                b"$JS.API.CONSUMER.INFO.ORDERS.worker", b"events.user.signup"]
    keys = ["id", "qty", "price", "status", "currency", "ts", "user", "region"]
    out = bytearray()
    while len(out) < size:
        if rnd.random() < 0.6:
            doc = ",".join('"%s":%s' % (k, rnd.choice(['%d' % rnd.randrange(10**7), '"ok"',
                                                       '"EUR"', "true", "null"]))
                           for k in rnd.sample(keys, 6))
            payload = ("{%s}" % doc).encode() * 40
            payload = payload[:rnd.randrange(16, 4096)]
        else:
            payload = rnd.randbytes(rnd.randrange(16, 4096))
        reply = b" _INBOX.9fQ2x.%d" % rnd.randrange(1000) if rnd.random() < 0.3 else b""
        out += b"RMSG $G %s%s %d\r\n%s\r\n" % (rnd.choice(subjects), reply, len(payload), payload)
    return bytes(out[:size])


BIG = route_traffic(1, 1 << 20)
SMALL = [route_traffic(100 + i, 16 << 10) for i in range(64)]


def _record(benchmark, nbytes: int, compressed: int):
    mean = benchmark.stats.stats.mean
    benchmark.extra_info["MB/s"] = round(nbytes / mean / 1e6, 1)
    benchmark.extra_info["ratio"] = round(nbytes / compressed, 3)


@pytest.mark.parametrize("level", LEVELS)
def test_encode_1mib_flush(benchmark, level):
    w = S2Writer(level)
    out = benchmark(w.compress, BIG)
    _record(benchmark, len(BIG), len(out))


@pytest.mark.parametrize("level", LEVELS)
def test_decode_1mib_flush(benchmark, level):
    stream = S2Writer(level).compress(BIG)

    def run():
        return S2Reader().feed(stream)

    assert benchmark(run) == BIG
    _record(benchmark, len(BIG), len(stream))


@pytest.mark.parametrize("level", LEVELS)
def test_encode_16kib_flushes(benchmark, level):
    w = S2Writer(level)

    def run():
        return sum(len(w.compress(flush)) for flush in SMALL)

    compressed = benchmark(run)
    _record(benchmark, sum(map(len, SMALL)), compressed)


@pytest.mark.parametrize("level", LEVELS)
def test_decode_16kib_flushes(benchmark, level):
    w = S2Writer(level)
    streams = [w.compress(flush) for flush in SMALL]
    r = S2Reader()

    def run():
        # One long-lived reader, as on a route connection.
        return sum(len(r.feed(s)) for s in streams)

    assert benchmark(run) == sum(map(len, SMALL))
    _record(benchmark, sum(map(len, SMALL)), sum(map(len, streams)))


@pytest.mark.skipif(snappy is None, reason="python-snappy not installed")
def test_baseline_python_snappy_encode(benchmark):
    out = benchmark(snappy.compress, BIG)
    _record(benchmark, len(BIG), len(out))


@pytest.mark.skipif(snappy is None, reason="python-snappy not installed")
def test_baseline_python_snappy_decode(benchmark):
    block = snappy.compress(BIG)
    assert benchmark(snappy.uncompress, block) == BIG
    _record(benchmark, len(BIG), len(block))
