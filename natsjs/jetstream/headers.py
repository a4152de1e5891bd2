"""NATS message headers as JetStream reads and writes them.

A header block is ``NATS/1.0[ status[ description]]\\r\\n(Key: Value\\r\\n)*\\r\\n``.
Lookups follow nats-server's getHeaderKeyIndex/sliceHeader (server/client.go): the key
is matched case-sensitively at the start of a line and must be followed by ``:``;
leading spaces of the value are skipped.  JetStream reads only a handful of
headers per stored message (Nats-Msg-Id, Nats-Expected-*, Nats-Rollup, Nats-TTL), so
plain byte searches beat building a dict.
"""
from __future__ import annotations

from natsjs.jetstream.jstime import parse_go_duration

HDR_LINE = b"NATS/1.0\r\n"
CRLF = b"\r\n"

# Header names (server/stream.go, server/jetstream.go).
MSG_ID = b"Nats-Msg-Id"
EXPECTED_STREAM = b"Nats-Expected-Stream"
EXPECTED_LAST_SEQ = b"Nats-Expected-Last-Sequence"
EXPECTED_LAST_SUBJ_SEQ = b"Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJ_SEQ_SUBJ = b"Nats-Expected-Last-Subject-Sequence-Subject"
EXPECTED_LAST_MSG_ID = b"Nats-Expected-Last-Msg-Id"
ROLLUP = b"Nats-Rollup"
MSG_TTL = b"Nats-TTL"
MARKER_REASON = b"Nats-Marker-Reason"
STREAM = b"Nats-Stream"
SUBJECT = b"Nats-Subject"
SEQUENCE = b"Nats-Sequence"
TIME_STAMP = b"Nats-Time-Stamp"
LAST_SEQUENCE = b"Nats-Last-Sequence"
MSG_SIZE = b"Nats-Msg-Size"
NUM_PENDING = b"Nats-Num-Pending"
PENDING_MESSAGES = b"Nats-Pending-Messages"
PENDING_BYTES = b"Nats-Pending-Bytes"
CONSUMER_STALLED = b"Nats-Consumer-Stalled"
LAST_CONSUMER = b"Nats-Last-Consumer"
LAST_STREAM = b"Nats-Last-Stream"
REQUEST_INFO = b"Nats-Request-Info"
STREAM_SOURCE = b"Nats-Stream-Source"
UP_TO_SEQUENCE = b"Nats-UpTo-Sequence"


_NEEDLES: dict = {}      # key -> CRLF key ":", for the keys looked up most (bounded)


def _key_index(hdr: bytes, key: bytes) -> int:
    """Where the line ``key:`` starts (after a CRLF: the status line comes first), or -1."""
    needle = _NEEDLES.get(key)
    if needle is None:
        needle = CRLF + key + b":"
        if len(_NEEDLES) < 256:
            _NEEDLES[key] = needle
    i = hdr.find(needle)
    return i + 2 if i >= 0 else -1


def get(hdr: bytes | None, key: bytes) -> bytes | None:
    """The value of ``key`` in a header block, or None."""
    if not hdr:
        return None
    i = _key_index(hdr, key)
    if i < 0:
        return None
    i += len(key) + 1
    n = len(hdr)
    while i < n and hdr[i] == 32:
        i += 1
    end = hdr.find(CRLF, i)
    return hdr[i:end if end >= 0 else n]


def nats_keys_all_of(hdr: bytes, family: bytes) -> bool:
    """Whether every ``Nats-`` key of the block starts with ``family`` (``Nats-Batch-``):
    keys are matched as ``get`` matches them, case-sensitively at a line's start."""
    return hdr.count(CRLF + b"Nats-") == hdr.count(CRLF + family)


def remove(hdr: bytes | None, key: bytes) -> bytes | None:
    """The block without ``key`` (every occurrence); None when nothing is left."""
    if not hdr:
        return hdr
    while True:
        i = _key_index(hdr, key)
        if i < 0:
            return hdr
        end = hdr.find(CRLF, i)
        if end < 0:
            return hdr
        hdr = hdr[:i] + hdr[end + 2:]
        if len(hdr) <= len(HDR_LINE) + 2:
            return None


def add(hdr: bytes | None, key: bytes, value: bytes) -> bytes:
    """Append ``Key: value`` (a new block if there is none)."""
    base = hdr[:-2] if hdr and len(hdr) > 2 else HDR_LINE
    return base + key + b": " + value + CRLF + CRLF


def set(hdr: bytes | None, key: bytes, value: bytes) -> bytes:  # noqa: A001
    return add(remove(hdr, key), key, value)


def status(hdr: bytes | None) -> bytes | None:
    """The status code of a header block (``NATS/1.0 408 ...``), or None."""
    if not hdr or not hdr.startswith(b"NATS/1.0 "):
        return None
    line = hdr[9:hdr.find(CRLF)]
    return line.split(b" ", 1)[0] or None


def make(code: int = 0, description: str = "", pairs=()) -> bytes:
    """A header block with an optional status line and ``(key, value)`` pairs."""
    first = b"NATS/1.0"
    if code:
        first += b" %d" % code
        if description:
            first += b" " + description.encode()
    out = [first]
    for k, v in pairs:
        out.append(k + b": " + (v if isinstance(v, bytes) else str(v).encode()))
    return CRLF.join(out) + CRLF + CRLF


def set_first(hdr: bytes | None, key: bytes, value: bytes) -> bytes:
    """server/client.go setHeader: the first ``key``'s value replaced where it is (one
    space after the colon kept if there was one), else ``key: value`` appended."""
    i = _key_index(hdr, key) if hdr else -1
    if i < 0:
        return add(hdr, key, value)
    start = i + len(key) + 1
    if start < len(hdr) and hdr[start] == 32:
        start += 1
    end = hdr.find(b"\r", start)
    if end < 0:
        return hdr
    return hdr[:start] + value + hdr[end:]


def parse_ttl(raw: bytes) -> int | None:
    """server/stream.go parseMessageTTL: seconds; -1 never; None when invalid."""
    text = raw.decode("utf-8", "replace").strip()
    if text.lower() == "never":
        return -1
    try:
        ns = parse_go_duration(text)
    except ValueError:
        if text.isdigit():
            return int(text)
        return None
    if ns < 1_000_000_000:
        return None
    return ns // 1_000_000_000


def remove_prefixed(hdr: bytes | None, prefix: bytes) -> bytes | None:
    """server/client.go removeHeaderIfPrefixPresent: every line whose key starts with
    ``prefix`` goes (None when nothing is left)."""
    index = 0
    while hdr and index < len(hdr):
        start = hdr.find(prefix, index)
        if start < 0:
            return hdr
        if start < 1 or hdr[start - 1] != 10:
            index = start + len(prefix)
            continue
        end = hdr.find(CRLF, start + len(prefix))
        if end < 0:
            return hdr
        hdr = hdr[:start] + hdr[end + 2:]
        index = start
        if len(hdr) <= len(HDR_LINE) + 2:
            return None
    return hdr
