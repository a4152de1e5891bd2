"""Where streams and consumers keep their state: the log files and the metadata.

Layout under ``<store_dir>/jetstream/<account>/streams/<stream>/``, like nats-server's
(server/filestore.go, jetstream.go):

    meta.json                 the stream's configuration and creation time
    msgs/                     the message log (natsjs/_core/filelog.pyx FileLog)
    obs/<consumer>/meta.json  a consumer's configuration and creation time
    obs/<consumer>/state/     its acknowledgement log (a FileLog of small records)
    obs/<consumer>/snap.json  its last full state; the log holds what came after

Metadata is written the way a crash cannot tear: a temporary file, fsync, rename over
the old one, fsync of the directory.  Memory streams keep everything in a MemLog and
consumer state in memory.
"""
from __future__ import annotations

import json
import os
import struct

import trio

from natsjs._core.filelog import FileLog, MemLog

META = "meta.json"
MSGS = "msgs"
OBS = "obs"


def write_json_atomic(path: str, obj) -> None:
    """Write ``obj`` as JSON so that ``path`` holds either the old or the new text."""
    data = json.dumps(obj, separators=(",", ":")).encode()
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: str):
    with open(path, "rb") as f:
        return json.loads(f.read())


def open_message_log(path: str | None, cfg: dict):
    """The message store of a stream: a FileLog in ``path`` or a MemLog."""
    # Nothing stored yet reports first_seq 0 (server/filestore.go, memstore.go: FirstSeq
    # stays 0 until the first message, unless the config asks for a first sequence).
    first = cfg.get("first_seq") or 0
    if cfg["storage"] == "memory" or path is None:
        return MemLog(first)
    os.makedirs(path, exist_ok=True)
    return FileLog(path, compression=cfg.get("compression") or "none", first_seq=first)


# ---- consumer state -----------------------------------------------------------------------

# Records of a consumer's acknowledgement log (the payload of one log entry each).
OP_ACK = 1         # sseq, dseq: acknowledged (explicit), or terminated
OP_FLOOR = 2       # asflr, adflr: everything up to here is done (ack all, limits)
_OP = struct.Struct("<BQQ")


class ConsumerState:
    """What a consumer must not forget: positions, floors, pending and redeliveries."""

    __slots__ = ("sseq", "dseq", "asflr", "adflr", "pending", "rdc", "acked_ahead")

    def __init__(self, sseq: int = 1, dseq: int = 1):
        self.sseq = sseq              # next stream sequence to look at
        self.dseq = dseq              # next delivery sequence
        self.asflr = sseq - 1         # ack floor, stream side
        self.adflr = dseq - 1         # ack floor, delivery side
        self.pending: dict[int, list] = {}   # sseq -> [dseq, ts]
        self.rdc: dict[int, int] = {}        # sseq -> redeliveries so far
        self.acked_ahead: set[int] = set()   # acked above a recovered position

    def to_json(self) -> dict:
        return {"sseq": self.sseq, "dseq": self.dseq, "asflr": self.asflr,
                "adflr": self.adflr, "pending": [[s, p[0], p[1]] for s, p in self.pending.items()],
                "rdc": [[s, n] for s, n in self.rdc.items()],
                "acked_ahead": sorted(self.acked_ahead)}

    @classmethod
    def from_json(cls, d: dict) -> "ConsumerState":
        st = cls(d["sseq"], d["dseq"])
        st.asflr, st.adflr = d["asflr"], d["adflr"]
        st.pending = {s: [ds, ts] for s, ds, ts in d.get("pending", [])}
        st.rdc = {s: n for s, n in d.get("rdc", [])}
        st.acked_ahead = set(d.get("acked_ahead", []))
        return st


class MemConsumerStore:
    """A consumer of a memory stream: nothing survives a restart, nothing to sync."""

    durable = False

    def load(self):
        return None

    def delivered(self, batch: list, state: ConsumerState) -> None:
        """Deliveries a replicated consumer's leader made (replicated.py); a local
        consumer's deliveries need no record."""

    def record(self, op: int, a: int, b: int) -> None:
        pass

    def needs_snapshot(self) -> bool:
        return False

    def snapshot(self, state: ConsumerState) -> None:
        pass

    async def sync(self) -> None:
        pass

    def dirty(self) -> bool:
        return False

    def close(self) -> None:
        pass


class FileConsumerStore:
    """A consumer's state on disk: a snapshot plus a log of acknowledgements after it.

    Acknowledgements are appended as they happen and made durable by ``sync`` (one
    fsync for all that came in meanwhile: group commit); an AckAck reply waits for it.
    Deliveries are not logged one by one: a delivered but unacknowledged message that
    a crash forgets is delivered again, which at-least-once allows; an acknowledged one
    is never delivered again, because its acknowledgement is in the log.
    """

    durable = True
    SNAPSHOT_EVERY = 10_000

    def __init__(self, path: str, fsync=None):
        self.path = path
        self._fsync = fsync
        os.makedirs(path, exist_ok=True)
        self.snap_path = os.path.join(path, "snap.json")
        self.log = open_message_log(os.path.join(path, "state"), {"storage": "file"})
        self._since = self.log.msgs
        self._appended = False

    def load(self) -> ConsumerState | None:
        st = None
        if os.path.exists(self.snap_path):
            try:
                d = read_json(self.snap_path)
                st = ConsumerState.from_json(d["state"])
                base = d.get("log_seq", 0)
            except (OSError, ValueError, KeyError, TypeError):
                st = None
        if st is None:
            if self.log.msgs == 0:
                return None
            st, base = ConsumerState(), 0
        seq = base + 1
        while True:
            rec = self.log.load_next(seq)
            if rec is None:
                break
            seq = rec[0] + 1
            try:
                op, a, b = _OP.unpack(rec[3])
            except struct.error:
                continue
            _apply_op(st, op, a, b)
        return st

    def record(self, op: int, a: int, b: int) -> None:
        self.log.append(b"o", None, _OP.pack(op, a, b), 0)
        self._since += 1
        self._appended = True

    def dirty(self) -> bool:
        return self._appended

    def needs_snapshot(self) -> bool:
        return self._since >= self.SNAPSHOT_EVERY

    def snapshot(self, state: ConsumerState) -> None:
        """Write the whole state, then drop the log entries it covers."""
        last = self.log.last_seq
        write_json_atomic(self.snap_path, {"state": state.to_json(), "log_seq": last})
        self.log.compact(last + 1)
        self._since = 0

    async def sync(self) -> None:
        if not self._appended:
            return
        self._appended = False
        s = self.log.begin_sync()
        if self._fsync is not None:
            await self._fsync(s)
        else:
            await trio.to_thread.run_sync(s.run)
        self.log.mark_synced(s)

    def close(self) -> None:
        self.log.close()


def _apply_op(st: ConsumerState, op: int, a: int, b: int) -> None:
    if op == OP_ACK:
        if a in st.pending:
            del st.pending[a]
        elif a >= st.sseq:
            st.acked_ahead.add(a)
        st.rdc.pop(a, None)
        if not st.pending:
            st.asflr, st.adflr = max(st.asflr, st.sseq - 1), max(st.adflr, st.dseq - 1)
    elif op == OP_FLOOR:
        if a > st.asflr:
            st.asflr, st.adflr = a, max(b, st.adflr)
            for s in [s for s in st.pending if s <= a]:
                del st.pending[s]
                st.rdc.pop(s, None)
            st.acked_ahead = {s for s in st.acked_ahead if s > a}
            if st.sseq <= a:
                st.sseq = a + 1
            if st.dseq <= b:
                st.dseq = b + 1
