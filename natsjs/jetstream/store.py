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
import shutil
import struct

import trio

from natsjs._core.filelog import FileLog, MemLog, replace_file, xxh64
from natsjs.jetstream.schema import loads

META = "meta.json"
MSGS = "msgs"
OBS = "obs"


def write_json_atomic(path: str, obj) -> None:
    """Write ``obj`` as JSON so that ``path`` holds either the old or the new text (and
    no temporary file is left when the write fails: a full disk)."""
    replace_file(path, json.dumps(obj, separators=(",", ":")).encode())
    fsync_dir(os.path.dirname(path))


def fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: str):
    """A JSON file read the way requests are (natsjs/jetstream/schema.py loads: bytes
    that are not UTF-8 and lone surrogates become U+FFFD); ValueError when it is not
    JSON."""
    with open(path, "rb") as f:
        return loads(f.read())


def write_meta(path: str, cfg: dict, created: int) -> None:
    """A stream's or consumer's meta.json in directory ``path``, with a checksum of its
    content (nats-server keeps one beside its meta.inf, meta.sum): recovery refuses a
    file whose checksum fails, so a damaged configuration is never taken for a valid
    one."""
    body = {"config": cfg, "created": created}
    body["sum"] = meta_sum(body)
    write_json_atomic(os.path.join(path, META), body)


def meta_sum(body: dict) -> str:
    text = json.dumps({"config": body.get("config"), "created": body.get("created")},
                      sort_keys=True, separators=(",", ":"))
    return "%016x" % xxh64(text.encode())


def create_stream_store(path: str, cfg: dict, created: int):
    """A new file stream's directory, its meta.json and its message log.  When any of
    it fails (a full disk), nothing of what this made is left behind: a directory
    without metadata would be reported at every start."""
    made = not os.path.exists(path)
    try:
        os.makedirs(os.path.join(path, MSGS), exist_ok=True)
        write_meta(path, cfg, created)
        return open_message_log(os.path.join(path, MSGS), cfg)
    except BaseException:
        if made:
            shutil.rmtree(path, ignore_errors=True)
        raise


def create_consumer_store(path: str, cfg: dict, created: int, fsync=None):
    """A new durable consumer's directory, meta.json and state store; nothing is left
    when that fails (see create_stream_store)."""
    made = not os.path.exists(path)
    try:
        os.makedirs(path, exist_ok=True)
        write_meta(path, cfg, created)
        return FileConsumerStore(path, fsync)
    except BaseException:
        if made:
            shutil.rmtree(path, ignore_errors=True)
        raise


def open_message_log(path: str | None, cfg: dict):
    """The message store of a stream: a FileLog in ``path`` or a MemLog."""
    # Nothing stored yet reports first_seq 0 (server/filestore.go, memstore.go: FirstSeq
    # stays 0 until the first message, unless the config asks for a first sequence).
    first = cfg.get("first_seq") or 0
    if cfg["storage"] == "memory" or path is None:
        return MemLog(first)
    os.makedirs(path, exist_ok=True)
    return FileLog(path, compression=cfg.get("compression") or "none", first_seq=first)


# ---- what a stream's log held when last seen ------------------------------------------

# msgs/state.json: the log's first and last sequence and message count, written
# (checksummed, fsynced) after each recovery and at each clean shutdown.  If block files
# go missing or are cut short, recovery still knows how far the stream had come: it
# says how much was lost and keeps the sequence, so no new message reuses a sequence a
# consumer has already passed (nats-server keeps the same in its index.db).
STORE_STATE = "state.json"


def write_store_state(path: str, store) -> None:
    body = {"first_seq": store.first_seq, "last_seq": store.last_seq, "msgs": store.msgs}
    body["sum"] = _state_sum(body)
    write_json_atomic(os.path.join(path, MSGS, STORE_STATE), body)


def read_store_state(path: str) -> dict | None:
    """What write_store_state wrote; None when there is none, ValueError when it is
    damaged."""
    p = os.path.join(path, MSGS, STORE_STATE)
    if not os.path.exists(p):
        return None
    d = read_json(p)
    if not isinstance(d, dict) or d.get("sum") != _state_sum(d):
        raise ValueError("checksum mismatch")
    for k in ("first_seq", "last_seq", "msgs"):
        _seq(d.get(k))
    return d


def _state_sum(d: dict) -> str:
    text = "%s:%s:%s" % (d.get("first_seq"), d.get("last_seq"), d.get("msgs"))
    return "%016x" % xxh64(text.encode())


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
        """The state ``to_json`` wrote; ValueError for anything else (a damaged file
        or a hostile archive must not become positions the consumer trusts)."""
        if not isinstance(d, dict):
            raise ValueError("consumer state is not an object")
        st = cls(_seq(d["sseq"], 1), _seq(d["dseq"], 1))
        st.asflr, st.adflr = _seq(d["asflr"]), _seq(d["adflr"])
        if st.asflr >= st.sseq or st.adflr >= st.dseq:
            raise ValueError("consumer ack floor above its position")
        st.pending = {_seq(s, 1): [_seq(ds, 1), _seq(ts)] for s, ds, ts in _rows(d, "pending", 3)}
        st.rdc = {_seq(s, 1): _seq(n) for s, n in _rows(d, "rdc", 2)}
        ahead = d.get("acked_ahead", [])
        if not isinstance(ahead, list):
            raise ValueError("consumer state: acked_ahead is not a list")
        st.acked_ahead = {_seq(s, 1) for s in ahead}
        return st


def _seq(v, low: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v < 1 << 64:
        raise ValueError("consumer state: %r is not a sequence" % (v,))
    return v


def _rows(d: dict, key: str, width: int) -> list:
    rows = d.get(key, [])
    if not isinstance(rows, list) or \
            not all(isinstance(r, list) and len(r) == width for r in rows):
        raise ValueError("consumer state: bad %s" % key)
    return rows


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
        self.prev_path = os.path.join(path, "snap.prev.json")
        self.damage: list[str] = []
        self.log = open_message_log(os.path.join(path, "state"), {"storage": "file"})
        self._since = self.log.msgs
        self._appended = False

    def load(self) -> ConsumerState | None:
        """The state as the last snapshot and the acknowledgements after it left it.
        What could not be read is listed in ``self.damage`` (the caller reports it):
        a damaged snapshot falls back to the one before it (the log keeps the records
        after that one too), and only when both are unreadable does the state start
        from the log alone, with acknowledged messages delivered again."""
        self.damage = []
        st = base = None
        for path in (self.snap_path, self.prev_path):
            if not os.path.exists(path):
                continue
            try:
                st, base = _read_snapshot(path)
                break
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.damage.append("%s unreadable (%s)" % (os.path.basename(path), exc))
        report = self.log.recovery or {}
        if report.get("corrupt") or report.get("lost"):
            self.damage.append("%d damaged records in its acknowledgement log"
                               % len(report.get("corrupt") or ()))
        if st is None:
            if self.damage:
                self.damage.append("state rebuilt from the acknowledgement log alone: "
                                   "acknowledged messages may be delivered again")
            if self.log.msgs == 0:
                return None
            st, base = ConsumerState(), 0
        scratch = base == 0
        dseqs = {}
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
            if scratch and op == OP_ACK:
                dseqs[a] = b
        if scratch and dseqs:
            _floor_from_acks(st, dseqs)
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
        """Write the whole state (checksummed); the one before it stays as
        ``snap.prev.json`` and the log keeps every entry after that older one, so one
        damaged snapshot file loses nothing."""
        last = self.log.last_seq
        body = {"state": state.to_json(), "log_seq": last}
        body["sum"] = _snapshot_sum(body)
        prev_base = None
        if os.path.exists(self.snap_path):
            try:
                prev_base = _read_snapshot(self.snap_path)[1]
            except (OSError, ValueError, KeyError, TypeError):
                prev_base = None    # a damaged one is not kept as the fallback
            else:
                os.replace(self.snap_path, self.prev_path)
        write_json_atomic(self.snap_path, body)
        if prev_base is not None:
            self.log.compact(prev_base + 1)
        self._since = 0

    async def sync(self) -> None:
        if not self._appended:
            return
        self._appended = False
        try:
            s = self.log.begin_sync()
            if self._fsync is not None:
                await self._fsync(s)
            else:
                await trio.to_thread.run_sync(s.run)
        except OSError:
            # What could not be made durable stays buffered in the log (a failed Sync
            # makes the next one write it all again): still dirty, to be retried.
            self._appended = True
            raise
        self.log.mark_synced(s)

    def close(self) -> None:
        self.log.close()


def _snapshot_sum(body: dict) -> str:
    text = json.dumps({"state": body["state"], "log_seq": body["log_seq"]},
                      sort_keys=True, separators=(",", ":"))
    return "%016x" % xxh64(text.encode())


def _read_snapshot(path: str) -> tuple[ConsumerState, int]:
    """(state, log sequence it covers) from a snapshot file; ValueError when it is
    damaged (its checksum, when it has one, must hold: files written before the
    checksum came have none)."""
    d = read_json(path)
    if not isinstance(d, dict):
        raise ValueError("not an object")
    if "sum" in d and d["sum"] != _snapshot_sum(d):
        raise ValueError("checksum mismatch")
    return ConsumerState.from_json(d["state"]), _seq(d.get("log_seq", 0))


def _floor_from_acks(st: ConsumerState, dseqs: dict) -> None:
    """A state rebuilt from the acknowledgement log alone: acknowledgements from the
    start on are the ack floor, and the positions are past every acknowledged one."""
    while st.asflr + 1 in st.acked_ahead:
        st.asflr += 1
        st.acked_ahead.discard(st.asflr)
    st.adflr = max(st.adflr, dseqs.get(st.asflr, 0))
    st.sseq = max(st.sseq, st.asflr + 1)
    st.dseq = max(st.dseq, max(dseqs.values()) + 1, st.adflr + 1)


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
