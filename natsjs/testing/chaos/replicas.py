"""The final read: what each server's store holds, read from its files after it stopped.

No client API is trusted for this: a read through the stream would answer from one
replica (the leader, or whichever direct-get responder the request reached), and the
question is what *every* replica holds.  So after the cluster healed and caught up, the
runner stops the servers cleanly and this module reads each node's copy of the stream
from disk:

* natsjs: ``<store>/jetstream/<account>/streams/<stream>/msgs`` is a ``FileLog``
  (natsjs/_core/filelog.pyx); it is opened on a copy, since opening runs recovery, and
  read from the first sequence to the last.
* nats-server: the same directory holds message blocks ``<n>.blk``; each record is
  ``total_len(4) seq(8) ts(8) subj_len(2) subj [hdr_len(4) hdr] msg hash(8)``, little
  endian, the high bit of total_len marking headers, bit 63 of seq an erased message and
  bit 62 a tombstone (the deletion of that sequence); record layout from
  server/filestore.go writeMsgRecordLocked.  Blocks are plain unless the stream asks for
  compression or the server for encryption, neither of which the chaos runs do.

Both give ``{seq: payload}`` for the stream's live messages.
"""
from __future__ import annotations

import os
import shutil
import struct
import tempfile

ACCOUNT = "APP"
_REC = struct.Struct("<IQQH")
HBIT = 1 << 31
EBIT = 1 << 63
TBIT = 1 << 62


def stream_dir(store_dir: str, stream: str, account: str = ACCOUNT) -> str:
    return os.path.join(store_dir, "jetstream", account, "streams", stream)


def read_natsjs(store_dir: str, stream: str) -> dict[int, bytes]:
    from natsjs._core.filelog import FileLog
    src = os.path.join(stream_dir(store_dir, stream), "msgs")
    if not os.path.isdir(src):
        return {}
    out: dict[int, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="chaos-read-") as tmp:
        copy = os.path.join(tmp, "msgs")
        shutil.copytree(src, copy)
        with FileLog(copy) as log:
            seq = log.first_seq
            last = log.last_seq
            while seq <= last:
                got = log.load_next(seq)
                if got is None:
                    break
                s, _subject, _hdr, msg, _ts = got
                out[s] = bytes(msg)
                seq = s + 1
    return out


def parse_blk(data: bytes) -> tuple[dict[int, bytes], set[int]]:
    """Records of one nats-server message block: live messages and tombstoned sequences."""
    msgs: dict[int, bytes] = {}
    dead: set[int] = set()
    off = 0
    while off + _REC.size + 8 <= len(data):
        rl, seq, _ts, slen = _REC.unpack_from(data, off)
        has_hdr = bool(rl & HBIT)
        rl &= ~HBIT
        if rl < _REC.size + 8 or off + rl > len(data):
            break       # the torn tail of a block, or zero fill
        body = off + _REC.size + slen
        if has_hdr:
            (hlen,) = struct.unpack_from("<I", data, body)
            body += 4 + hlen
        msg = data[body:off + rl - 8]
        if seq & TBIT:
            dead.add(seq & ~(TBIT | EBIT))
        elif seq & EBIT:
            dead.add(seq & ~EBIT)
        elif seq:
            msgs[seq] = bytes(msg)
        off += rl
    return msgs, dead


def read_nats_server(store_dir: str, stream: str) -> dict[int, bytes]:
    mdir = os.path.join(stream_dir(store_dir, stream), "msgs")
    if not os.path.isdir(mdir):
        return {}
    msgs: dict[int, bytes] = {}
    dead: set[int] = set()
    blocks = sorted((f for f in os.listdir(mdir) if f.endswith(".blk")),
                    key=lambda f: int(f.split(".")[0]))
    for name in blocks:
        with open(os.path.join(mdir, name), "rb") as f:
            m, d = parse_blk(f.read())
        msgs.update(m)
        dead |= d
    for seq in dead:
        msgs.pop(seq, None)
    return msgs


def read_replica(store_dir: str, stream: str, reference: bool) -> dict[int, bytes]:
    return (read_nats_server if reference else read_natsjs)(store_dir, stream)
