"""natsjs/_core/parser.pyx: framing across any split, arguments, errors, fuzzing."""
import random

import pytest
from hypothesis import given, settings, strategies as st

from natsjs._core import parser as P
from natsjs._core.parser import ProtocolError, ProtoParser


def parse(chunks, kind=P.KIND_CLIENT, **kw):
    ops = []
    p = ProtoParser(lambda op, args: ops.append((op, args)), kind, **kw)
    for c in chunks:
        p.feed(c)
    return ops, p


STREAM = (b"CONNECT {\"verbose\":false,\"headers\":true}\r\n"
          b"SUB foo.* q1 1\r\n"
          b"sub bar 2\r\n"
          b"PUB foo.x 5\r\nhello\r\n"
          b"PUB foo.y _INBOX.1 0\r\n\r\n"
          b"pub\tbar\t \t3\r\nabc\r\n"
          b"HPUB h 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"
          b"HPUB h r 12 12\r\nNATS/1.0\r\n\r\n\r\n"
          b"UNSUB 1 10\r\n"
          b"PING\r\nPONG\nping\r\n")

EXPECTED = [
    (P.CONNECT, b"{\"verbose\":false,\"headers\":true}"),
    (P.SUB, b"foo.* q1 1"),
    (P.SUB, b"bar 2"),
    (P.MSG, (b"foo.x", None, -1, b"hello", None, None)),
    (P.MSG, (b"foo.y", b"_INBOX.1", -1, b"", None, None)),
    (P.MSG, (b"bar", None, -1, b"abc", None, None)),
    (P.MSG, (b"h", None, 12, b"NATS/1.0\r\n\r\nhi", None, None)),
    (P.MSG, (b"h", b"r", 12, b"NATS/1.0\r\n\r\n", None, None)),
    (P.UNSUB, b"1 10"),
    (P.PING, b""),
    (P.PONG, b""),
    (P.PING, b""),
]


def test_whole_stream():
    ops, p = parse([STREAM])
    assert ops == EXPECTED
    assert p.pending_bytes == 0


def test_byte_by_byte():
    ops, p = parse([STREAM[i:i + 1] for i in range(len(STREAM))])
    assert ops == EXPECTED
    assert p.pending_bytes == 0


@pytest.mark.parametrize("seed", range(50))
def test_random_splits(seed):
    rnd = random.Random(seed)
    chunks, i = [], 0
    while i < len(STREAM):
        k = rnd.randint(1, 40)
        chunks.append(memoryview(bytearray(STREAM[i:i + k])))
        i += k
    ops, _ = parse(chunks)
    assert ops == EXPECTED


def test_reused_read_buffer_is_copied_when_split():
    """The read loop reuses one buffer: a split message must not see it change."""
    ops = []
    p = ProtoParser(lambda op, a: ops.append((op, a)))
    buf = bytearray(b"PUB subject 10\r\n01234")
    p.feed(memoryview(buf))
    buf[:] = b"XXXXXXXXXXXXXXXXXXXX"
    p.feed(b"56789\r\n")
    assert ops == [(P.MSG, (b"subject", None, -1, b"0123456789", None, None))]


def test_large_payload_split_everywhere():
    payload = bytes(range(256)) * 2000
    data = b"PUB big 512000\r\n" + payload + b"\r\nPING\r\n"
    ops, _ = parse([data[i:i + 7777] for i in range(0, len(data), 7777)],
                   max_payload=1 << 20)
    assert ops == [(P.MSG, (b"big", None, -1, payload, None, None)), (P.PING, b"")]


def test_routed_messages():
    data = (b"RMSG $G foo 2\r\nhi\r\n"
            b"RMSG $G foo reply 2\r\nhi\r\n"
            b"RMSG $G foo + reply q1 q2 2\r\nhi\r\n"
            b"RMSG $G foo | q1 2\r\nhi\r\n"
            b"HMSG $G foo + r q 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"
            b"RS+ $G foo q 3\r\nRS- $G foo\r\nLS+ $G bar\r\n")
    for chunks in ([data], [data[i:i + 1] for i in range(len(data))]):
        ops, _ = parse(chunks, kind=P.KIND_ROUTER)
        assert ops == [
            (P.MSG, (b"foo", None, -1, b"hi", b"$G", None)),
            (P.MSG, (b"foo", b"reply", -1, b"hi", b"$G", None)),
            (P.MSG, (b"foo", b"reply", -1, b"hi", b"$G", b"q1 q2")),
            (P.MSG, (b"foo", None, -1, b"hi", b"$G", b"q1")),
            (P.MSG, (b"foo", b"r", 12, b"NATS/1.0\r\n\r\nhi", b"$G", b"q")),
            (P.RS_PLUS, b"$G foo q 3"),
            (P.RS_MINUS, b"$G foo"),
            (P.LS_PLUS, b"$G bar"),
        ]


@pytest.mark.parametrize("data,client_error", [
    (b"FOO\r\n", P.ERR_UNKNOWN_OP),
    (b"PUBX a 1\r\n", P.ERR_UNKNOWN_OP),
    (b"PUB\r\n", P.ERR_UNKNOWN_OP),        # no space after the name: not a PUB at all
    (b"SUB\r\n", P.ERR_UNKNOWN_OP),
    (b"PUB a 3\r\nhiXX\r\n", P.ERR_UNKNOWN_OP),
    (b"PUB a 2000000\r\n", P.ERR_MAX_PAYLOAD),
    (b"SUB " + b"a" * 5000 + b" 1\r\n", P.ERR_MAX_CONTROL_LINE),
    (b"SUB " + b"a" * 5000, P.ERR_MAX_CONTROL_LINE),
    (b"PUB a\r\n", None),
    (b"PUB a b c 1\r\n", None),
    (b"PUB a x\r\n", None),
    (b"PUB a -1\r\n", None),
    (b"HPUB a 5 3\r\n", None),
    (b"HPUB a 3\r\n", None),
    (b"RMSG $G a 1\r\n", P.ERR_UNKNOWN_OP),   # a client may not send route ops
])
def test_errors(data, client_error):
    with pytest.raises(ProtocolError) as info:
        parse([data])
    assert info.value.client_error == client_error


def test_ping_pong_ok_ignore_the_rest_of_the_line():
    ops, _ = parse([b"PING x\r\nPINGX\r\npong!\r\n+OKAY\r\n"])
    assert [op for op, _ in ops] == [P.PING, P.PING, P.PONG, P.OK]


def test_closed_parser_drops_the_rest_of_the_batch():
    seen = []

    def on_op(op, args):
        seen.append(op)
        p.closed = True
    p = ProtoParser(on_op)
    p.feed(b"PING\r\nPING\r\n")
    assert seen == [P.PING]


def test_max_control_line_counts_only_the_line():
    ops, _ = parse([b"SUB " + b"a" * 4000 + b" 1\r\n"])
    assert ops[0][0] == P.SUB


OPS = st.sampled_from([
    b"PING\r\n", b"PONG\r\n", b"SUB a.b 1\r\n", b"UNSUB 1\r\n", b"PUB a.b 3\r\nabc\r\n",
    b"PUB a.b r 0\r\n\r\n", b"HPUB a 12 13\r\nNATS/1.0\r\n\r\nx\r\n", b"CONNECT {}\r\n",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=30), st.data())
def test_any_split_gives_the_same_ops(ops, data):
    stream = b"".join(ops)
    whole, _ = parse([stream])
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    chunks, last = [], 0
    for c in cuts + [len(stream)]:
        chunks.append(stream[last:c])
        last = c
    split, _ = parse(chunks)
    assert split == whole
    assert len(whole) == len(ops)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([P.KIND_CLIENT, P.KIND_ROUTER]))
def test_garbage_raises_only_protocol_errors(data, kind):
    ops = []
    p = ProtoParser(lambda op, a: ops.append(op), kind)
    try:
        for i in range(0, len(data), 13):
            p.feed(data[i:i + 13])
    except ProtocolError:
        pass
