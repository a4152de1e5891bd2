"""The entries of a replicated stream's Raft group, as bytes (natsjs/jetstream/
replicated.py proposes and applies them; natsjs/jetstream/batching.py builds the atomic
batch's).  The first byte says the kind; the formats are natsjs's own.

    E_MSG      u8 kind | i64 ts | u16 subject len | u32 header len (NO_HDR: none) |
               subject | header | payload
    E_SOURCED  u8 kind | u64 mirror seq | E_MSG's layout after its kind: what the stream
               writes itself (mirrors, sources, subject delete markers), without the
               client's checks
    E_BATCH    u8 kind | records captured in C by the leader (natsjs/_core/jsingest.pyx)
    E_OP       u8 kind | JSON of a stream operation (purge, delete, ...)
    E_ATOMIC   u8 kind | u32 id len | batch id | (u32 len | an E_MSG entry) per message:
               a committed atomic batch, applied all or nothing
"""
from __future__ import annotations

import struct

E_MSG = b"M"
E_BATCH = b"B"
E_OP = b"J"
E_SOURCED = b"X"
E_ATOMIC = b"A"
NO_HDR = 0xFFFFFFFF
SEQ = struct.Struct("<Q")
_MSG = struct.Struct("<qHI")          # ts, subject length, header length (or NO_HDR)
_U32 = struct.Struct("<I")


def encode_msg(subject: bytes, hdr: bytes | None, msg: bytes, ts: int,
               kind: bytes = E_MSG) -> bytes:
    return b"".join((kind, _MSG.pack(ts, len(subject), NO_HDR if hdr is None else len(hdr)),
                     subject, hdr or b"", msg))


def encode_sourced(subject: bytes, hdr: bytes | None, msg: bytes, ts: int,
                   mirror_seq: int) -> bytes:
    return b"".join((E_SOURCED, SEQ.pack(mirror_seq), _MSG.pack(
        ts, len(subject), NO_HDR if hdr is None else len(hdr)), subject, hdr or b"", msg))


def decode_msg(data: bytes, off: int = 1):
    ts, slen, hlen = _MSG.unpack_from(data, off)
    p = off + _MSG.size
    subject = data[p:p + slen]
    p += slen
    if hlen == NO_HDR:
        hdr = None
    else:
        hdr = data[p:p + hlen]
        p += hlen
    return subject, hdr, data[p:], ts


def encode_atomic(bid: bytes, msgs: list, ts: int) -> bytes:
    """The batch as one entry: its id, then each message as a replicated stream's
    E_MSG entry (``encode_msg``), each after its length."""
    parts = [E_ATOMIC, _U32.pack(len(bid)), bid]
    for subject, hdr, msg in msgs:
        one = encode_msg(subject, hdr, msg, ts)
        parts += (_U32.pack(len(one)), one)
    return b"".join(parts)


def decode_atomic(data: bytes):
    """``(batch id, [(subject, hdr, msg), ...], ts)`` of an E_ATOMIC entry."""
    (n,) = _U32.unpack_from(data, 1)
    off = 5 + n
    bid = data[5:off]
    msgs = []
    ts = 0
    while off < len(data):
        (n,) = _U32.unpack_from(data, off)
        off += 4
        subject, hdr, msg, ts = decode_msg(data[off:off + n])
        msgs.append((subject, hdr, msg))
        off += n
    return bid, msgs, ts
