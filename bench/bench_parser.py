"""Micro-benchmarks of the protocol parser (natsjs/_core/parser.pyx), run by ``make micro``.

Feeds pre-built read buffers to ``ProtoParser.feed`` the way a connection's read loop does:
whole reads of many small PUBs, the same stream cut into 4 KiB reads (messages straddling
reads take the copying path), and a control-heavy mix.  The base parser hands every
message to the Python callback, so these figures include one Python call per message.
"""
import pytest

parser = pytest.importorskip("natsjs._core.parser")

MSGS = 1000


def _pubs(size: int) -> bytes:
    payload = b"x" * size
    return b"".join(b"PUB bench.foo %d\r\n%s\r\n" % (size, payload) for _ in range(MSGS))


def _count():
    n = [0]

    def on_op(op, args):
        n[0] += 1
    return n, on_op


@pytest.mark.parametrize("size", [16, 1024])
def test_parse_pub_whole(benchmark, size):
    benchmark.group = "parser"
    buf = _pubs(size)
    n, on_op = _count()
    p = parser.ProtoParser(on_op)
    benchmark(p.feed, buf)
    assert n[0] % MSGS == 0
    benchmark.extra_info["msgs_per_round"] = MSGS


def test_parse_pub_split_4k(benchmark):
    benchmark.group = "parser"
    buf = _pubs(16)
    chunks = [buf[i:i + 4096] for i in range(0, len(buf), 4096)]
    n, on_op = _count()
    p = parser.ProtoParser(on_op)

    def feed_all():
        for c in chunks:
            p.feed(c)
    benchmark(feed_all)
    assert n[0] % MSGS == 0


def test_parse_control_mix(benchmark):
    benchmark.group = "parser"
    one = b"SUB bench.%d 1\r\nPING\r\nPUB bench.foo 2\r\nhi\r\nUNSUB 1\r\nPONG\r\n"
    buf = b"".join(one.replace(b"%d", b"%d" % i) for i in range(MSGS // 5))
    n, on_op = _count()
    p = parser.ProtoParser(on_op)
    benchmark(p.feed, buf)
    assert n[0] > 0
