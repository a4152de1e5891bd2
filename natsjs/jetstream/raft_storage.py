"""A Raft group's durable state: the storage under a RaftNode and its recovery.

``RaftStorage`` is synchronous and knows nothing of trio; the driver
(natsjs/jetstream/raft_driver.py) runs it in the server, and the simulator
(natsjs/testing/raftsim.py) runs it over a model file log that forgets unsynced writes on
a crash, so the recovery rules below are exercised by the same code that runs in the
server.  On disk, per group::

    <dir>/state.json        term, vote and the bootstrap voter set (atomic replace)
    <dir>/snapshot.json     index, term, voters, size and file of the current snapshot
    <dir>/snap-<index>.bin  the snapshot itself (received ones arrive as snap-<index>.tmp)
    <dir>/log/              the entries: a FileLog whose sequence is the Raft index

What callers can rely on:

* after ``recover`` the log, term, vote, voters and snapshot are consistent with one
  another, and whatever was found damaged is listed in ``damage`` and never used;
* ``save_hard_state``, ``write_snapshot`` and an installed snapshot's files are durable
  on return; appends and truncations (also the emptied log under an installed
  snapshot) are durable once a sync that began after them has finished (``begin_sync``,
  ``Sync.run``, ``finish_sync``), and ``finish_sync`` never reports as persisted an index
  that a truncation took back while the sync ran; recovery drops what did not reach
  the disk in a consistent state;
* threads: one sync's ``run`` and one ``write_snapshot`` may run in worker threads while
  the owner appends; nothing else may run concurrently, and a truncation, an installed
  snapshot or ``snapshot_written`` never runs while a sync does (the driver sees to it).
"""
from __future__ import annotations

import json
import os
import zlib

from natsjs._core.raftlog import RaftCodecError, decode_entry
from natsjs.jetstream.raft import (
    OP_APPEND,
    OP_SNAPSHOT_CHUNK,
    OP_SNAPSHOT_INSTALL,
    OP_SNAPSHOT_SAVE,
    OP_TRUNCATE,
    SnapshotMeta,
)
from natsjs.jetstream.store import fsync_dir, write_json_atomic

STATE = "state.json"
SNAPSHOT = "snapshot.json"
ENTRY_SUBJECT = b"$NRG"   # every record of a Raft log carries this subject


# ---- files ----------------------------------------------------------------------------

class DirFiles:
    """The small files of one Raft group in a directory (durable where it says so)."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(path, exist_ok=True)

    def _p(self, name: str) -> str:
        return os.path.join(self.path, name)

    def read_json(self, name: str):
        try:
            with open(self._p(name), "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None

    def write_json(self, name: str, obj) -> None:
        """Durable on return: temporary file, fsync, rename, fsync of the directory."""
        write_json_atomic(self._p(name), obj)

    def write_at(self, name: str, offset: int, data: bytes) -> None:
        """Write into a scratch file (not durable until ``promote``)."""
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if offset == 0 else 0)
        fd = os.open(self._p(name), flags, 0o644)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)

    def write_file(self, name: str, data: bytes) -> None:
        """Durable on return, like write_json."""
        self.write_at(name + ".part", 0, data)
        self.promote(name + ".part", name)

    def promote(self, src: str, dst: str) -> None:
        fd = os.open(self._p(src), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self._p(src), self._p(dst))
        fsync_dir(self.path)

    def read_at(self, name: str, offset: int, size: int) -> bytes:
        with open(self._p(name), "rb") as f:
            f.seek(offset)
            return f.read(size)

    def remove(self, name: str) -> None:
        try:
            os.unlink(self._p(name))
        except FileNotFoundError:
            pass

    def names(self) -> list[str]:
        return os.listdir(self.path)


# ---- the log --------------------------------------------------------------------------

class RaftStorage:
    """A Raft group's durable state over a FileLog-interface log and a ``DirFiles``.

    It is also the node's ``LogView``: ``last_index``, ``entry(index)``,
    ``snapshot_chunk(offset, size)``.

    Every record is checked on the way in: log entries by the FileLog's checksums and
    their own index and term; ``state.json`` and ``snapshot.json`` carry a CRC-32 of
    their content (``crc``), and ``snapshot.json`` one of the snapshot file (``sum``).
    What ``recover`` finds damaged it never uses: it lists it in ``damage`` (the owner
    logs it) and sets ``repair``, so the node repairs before voting (natsjs/jetstream/
    raft.py):

    * a torn tail (the last block cut short, as a crash leaves an unsynced write) is cut
      off and is not damage: it was never acknowledged;
    * an entry that fails its checks ends the log there; the entries it may have
      acknowledged after it come back from the leader;
    * a log that no longer starts where the snapshot (or the beginning) says, or a
      snapshot whose files fail their checks, leaves nothing to build on: the log is
      emptied and the node rejoins empty, repaired by the leader's snapshot and entries;
    * a ``state.json`` that fails its checks loses the term and the vote: the term is
      rebuilt as the highest the snapshot and the log prove, the vote as none, and the
      node votes again only once repaired (it then counts the leader it found as its
      vote for that term).  The voters come from the snapshot and the log's
      configuration entries, else from the caller's ``peers``.

    The policy for a lost vote, its limit: a vote cast before the damage in a term
    higher than the leader the node repairs from, for a candidate that neither won nor
    told anyone else its term, is not known; the node could vote again in that term.
    Pre-vote and the leader lease make such a term rare (a candidate needs a majority's
    pre-vote while no leader is heard), and refusing to vote for ever is the only
    certain alternative.
    """

    def __init__(self, log, files):
        self.log = log
        self.files = files
        self.term = 0
        self.vote = None
        self.peers: tuple = ()
        self.snapshot: SnapshotMeta | None = None
        self._snap_file = None
        self._staged = None        # (index, data): a snapshot taken, not yet on disk
        self._incoming = None      # name of the snapshot being received
        self._clamp = None         # lowest truncation point since the running sync began
        self.recovered_truncations = 0
        self.repair = False        # repair before voting (see the class docstring)
        self.damage: list[str] = []

    # -- recovery

    def recover(self, peers=()) -> None:
        """Load term, vote and snapshot, and make the log consistent with them.

        ``peers`` is the bootstrap voter set, recorded on first start (a node joining an
        existing group passes none and learns its voters from the leader).  Damage is
        handled as the class docstring says; recovery itself never fails on it.
        """
        log = self.log
        report = getattr(log, "recovery", None) or {}
        if report.get("corrupt") or report.get("lost"):
            self._damaged("log records failed their checks (%d bad, lost %s)" % (
                len(report.get("corrupt") or ()), _brief(report.get("lost") or ())))
        found_state, state = self._read_checked(STATE, _STATE_KEYS, _state_ok)
        found_snap, snap = self._read_checked(SNAPSHOT, _SNAP_KEYS, _snap_ok)
        if snap is not None and not self._snap_file_ok(snap):
            self._damaged("snapshot file %s fails its checks" % snap["file"])
            snap = None
        elif found_snap and snap is None:
            self._damaged("%s fails its checks" % SNAPSHOT)
        if snap is not None:
            self.snapshot = SnapshotMeta(snap["index"], snap["term"], tuple(snap["peers"]),
                                         snap["size"])
            self._snap_file = snap["file"]
        for name in self.files.names():
            # leftovers of a snapshot that was never completed, or replaced, or damaged
            if name.startswith("snap-") and name != self._snap_file:
                self.files.remove(name)
        lost_state = False
        if state is not None:
            self.term, self.vote = state["term"], state["vote"]
            self.peers = tuple(state["peers"])
            if state.get("repair"):
                self.repair = True
                self.damage.append("still repairing from an earlier start")
        elif not found_state and not found_snap and log.last_seq < log.first_seq == 1:
            # a new member: nothing on disk yet
            self.peers = tuple(peers)
            self.files.write_json(STATE, _sealed({"term": 0, "vote": None,
                                                  "peers": list(peers)}))
        else:
            self._damaged("%s %s: term and vote unknown" % (
                STATE, "fails its checks" if found_state else "is missing"))
            self.peers = tuple(peers)
            lost_state = True
        base = self.snapshot.index if self.snapshot else 0
        if self.snapshot is not None:
            # The log must continue the snapshot: keep it only if it holds the snapshot's
            # last entry with the same term, or starts right after it (we compacted it).
            first, last = log.first_seq, log.last_seq
            keep = False
            if last < first:
                keep = first == base + 1
                if first > base + 1:
                    self._damaged("log starts at %d, after the snapshot at %d"
                                  % (first, base))
            elif first == base + 1:
                keep = True
            elif first <= base <= last:
                rec = log.load(base)
                keep = rec is not None and self._term_of(rec[2], base) == self.snapshot.term
            elif first > base + 1:
                self._damaged("log starts at %d, after the snapshot at %d" % (first, base))
            if not keep:
                self._reset_log(base + 1)
            elif first <= base:
                log.compact(base + 1)
        elif log.first_seq != 1:
            # a compacted log is only ever left behind a durable snapshot.json
            self._damaged("log starts at %d but there is no snapshot" % log.first_seq)
            self._reset_log(1)
        # Entries must be intact, in sequence, with non-decreasing terms; the first one
        # that is not ends the log (a torn write, or a truncation that never reached disk;
        # an entry that fails its checks is damage).
        prev_term = self.snapshot.term if self.snapshot else 0
        for index in range(log.first_seq, log.last_seq + 1):
            rec = log.load(index)
            term = self._term_of(rec[2], index) if rec is not None else None
            if term is None or term < prev_term:
                if term is None:
                    self._damaged("log entry %d fails its checks: the log ends at %d"
                                  % (index, index - 1))
                log.truncate(index - 1)
                self.recovered_truncations += 1
                break
            prev_term = term
        if lost_state:
            # The highest term the node can prove it saw; it votes in none before repair.
            self.term, self.vote = prev_term, None
        if self.repair:
            self.save_hard_state(self.term, self.vote, True)
        self._sync_now()
        if report.get("corrupt") and hasattr(log, "scrub"):
            # What the damage decided (the cut, the repair flag) is durable: its bytes
            # can go, so the next start does not find the same damage again.
            log.scrub()

    def _damaged(self, what: str) -> None:
        self.damage.append(what)
        self.repair = True

    def _read_checked(self, name: str, keys: frozenset, valid):
        """(found, record): the checked content of a small JSON file, None when it fails
        a check (found says whether there was a file at all)."""
        try:
            obj = self.files.read_json(name)
        except (OSError, ValueError):
            return True, None
        if obj is None:
            return False, None
        rec = _unsealed(obj, keys)
        if rec is None or not valid(rec):
            return True, None
        return True, rec

    def _snap_file_ok(self, snap: dict) -> bool:
        try:
            data = self.files.read_at(snap["file"], 0, snap["size"] + 1)
        except (OSError, KeyError):
            return False
        if len(data) != snap["size"]:
            return False
        return "sum" not in snap or zlib.crc32(data) == snap["sum"]

    @staticmethod
    def _term_of(entry, index):
        try:
            _, term, eindex, _ = decode_entry(bytes(entry))
        except RaftCodecError:
            return None
        return term if eindex == index else None

    def _reset_log(self, first: int) -> None:
        """Empty the log; the next entry it takes is ``first``."""
        log = self.log
        log.truncate(0)
        if first > 1:
            log.compact(first)

    def _sync_now(self) -> None:
        s = self.log.begin_sync()
        s.run()
        self.log.mark_synced(s)

    # -- the node's view

    @property
    def last_index(self) -> int:
        return self.log.last_seq

    def entry(self, index: int):
        rec = self.log.load(index)
        if rec is None:
            return None
        return rec[2] if isinstance(rec[2], bytes) else bytes(rec[2])

    def snapshot_chunk(self, offset: int, size: int) -> bytes:
        if self._staged is not None:
            return self._staged[1][offset:offset + size]
        return self.files.read_at(self._snap_file, offset, size)

    def snapshot_bytes(self) -> bytes:
        """The whole current snapshot (for the application's restore)."""
        if self._staged is not None:
            return self._staged[1]
        if self.snapshot is None:
            return b""
        return self.files.read_at(self._snap_file, 0, self.snapshot.size)

    def stage_snapshot(self, index: int, data: bytes) -> None:
        """The node took a snapshot that is not on disk yet: until ``snapshot_written``,
        what the node reads of its current snapshot (to send to a follower) is this."""
        self._staged = (index, data)

    # -- effects

    def save_hard_state(self, term: int, vote, repair: bool = False) -> None:
        self.term, self.vote, self.repair = term, vote, repair
        state = {"term": term, "vote": vote, "peers": list(self.peers)}
        if repair:
            state["repair"] = True
        self.files.write_json(STATE, _sealed(state))

    def append(self, first: int, entries: list) -> None:
        append = self.log.append
        for k, e in enumerate(entries):
            append(ENTRY_SUBJECT, None, e, 0, first + k)

    def apply_op(self, op) -> None:
        """Carry out one Ready.ops entry (appends may also go through ``append``)."""
        kind = op[0]
        if kind == OP_APPEND:
            self.append(op[1], op[2])
        elif kind == OP_TRUNCATE:
            self._truncated(op[1])
            self.log.truncate(op[1])
        elif kind == OP_SNAPSHOT_SAVE:
            self.snapshot_written(op, self.write_snapshot(op))
        elif kind == OP_SNAPSHOT_CHUNK:
            _, index, term, offset, data = op
            self._incoming = "snap-%d.tmp" % index
            self.files.write_at(self._incoming, offset, data)
        elif kind == OP_SNAPSHOT_INSTALL:
            _, index, term, peers, size = op
            name = "snap-%d.bin" % index
            self.files.promote(self._incoming, name)
            self._incoming = None
            meta = SnapshotMeta(index, term, tuple(peers), size)
            self._write_meta(meta, name, zlib.crc32(self.files.read_at(name, 0, size)))
            self._adopt(meta, name)
            # The whole log is replaced; the next sync makes the empty log durable (and
            # recovery drops entries that do not continue the snapshot meanwhile).
            self._truncated(0)
            self._reset_log(index + 1)
        else:  # pragma: no cover - a programming error in the node
            raise ValueError("unknown raft log op %r" % (kind,))

    def write_snapshot(self, op) -> str:
        """Make an OP_SNAPSHOT_SAVE's snapshot durable (its file, then snapshot.json);
        touches no log, so it may run in a thread while entries are appended.  Returns
        the file's name, for ``snapshot_written``."""
        _, index, term, peers, data = op
        name = "snap-%d.bin" % index
        self.files.write_file(name, data)
        self._write_meta(SnapshotMeta(index, term, tuple(peers), len(data)), name,
                         zlib.crc32(data))
        return name

    def snapshot_written(self, op, name: str) -> None:
        """After ``write_snapshot``: the snapshot is the current one, and the entries it
        covers leave the log (never while an fsync runs on it)."""
        _, index, term, peers, data = op
        self._adopt(SnapshotMeta(index, term, tuple(peers), len(data)), name)
        if self._staged is not None and self._staged[0] <= index:
            self._staged = None
        if self.log.first_seq <= index:
            self.log.compact(index + 1)

    def _write_meta(self, meta: SnapshotMeta, name: str, crc: int) -> None:
        self.files.write_json(SNAPSHOT, _sealed({"index": meta.index, "term": meta.term,
                                                 "peers": list(meta.peers),
                                                 "size": meta.size, "file": name,
                                                 "sum": crc}))

    def _adopt(self, meta: SnapshotMeta, name: str) -> None:
        old = self._snap_file
        self.snapshot = meta
        self._snap_file = name
        if old and old != name:
            self.files.remove(old)

    def _truncated(self, keep: int) -> None:
        if self._clamp is not None and keep < self._clamp:
            self._clamp = keep

    # -- durability (group commit)

    def begin_sync(self):
        """Start a sync of everything appended so far; run ``.run()`` (any thread), then
        ``finish_sync``.  One at a time."""
        s = self.log.begin_sync()
        self._clamp = s.seq
        return s

    def finish_sync(self, s) -> int:
        """The index the node may now call persisted: the sync's end, lowered to any
        truncation that happened while it ran (those entries are not the ones synced)."""
        try:
            ok = self.log.mark_synced(s)
        except ValueError:      # its run() never completed (the fsync was refused)
            ok = False
        persisted = self._clamp
        self._clamp = None
        # a failed fdatasync proves nothing: the log rewrites and syncs it next time
        return persisted if ok else 0

    def close(self) -> None:
        self.log.close()


# ---- checked small files ----------------------------------------------------------------

_STATE_KEYS = frozenset(("term", "vote", "peers"))
_SNAP_KEYS = frozenset(("index", "term", "peers", "size", "file"))


def _crc(obj: dict) -> int:
    return zlib.crc32(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode())


def _sealed(obj: dict) -> dict:
    """``obj`` with the CRC-32 of its content, checked by ``_unsealed``."""
    return dict(obj, crc=_crc(obj))


def _unsealed(obj, keys: frozenset):
    """The content of a sealed record, or None when it fails its check.  A record
    without ``crc`` (written before records were sealed) is taken only in its old shape,
    exactly ``keys``."""
    if not isinstance(obj, dict):
        return None
    body = {k: v for k, v in obj.items() if k != "crc"}
    if "crc" not in obj:
        return body if set(body) == keys else None
    return body if keys <= set(body) and obj["crc"] == _crc(body) else None


def _is_peers(v) -> bool:
    return isinstance(v, list) and all(isinstance(p, str) for p in v)


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _state_ok(st: dict) -> bool:
    return (_is_count(st["term"]) and (st["vote"] is None or isinstance(st["vote"], str))
            and _is_peers(st["peers"]))


def _snap_ok(sn: dict) -> bool:
    f = sn["file"]
    return (_is_count(sn["index"]) and _is_count(sn["term"]) and _is_peers(sn["peers"])
            and _is_count(sn["size"]) and isinstance(f, str) and f.startswith("snap-")
            and "/" not in f and _is_count(sn.get("sum", 0)))


def _brief(lost) -> str:
    out = ", ".join("%d-%d" % x if isinstance(x, tuple) else str(x) for x in list(lost)[:5])
    return out + (" ..." if len(lost) > 5 else "") if out else "none"




__all__ = ["ENTRY_SUBJECT", "SNAPSHOT", "STATE", "DirFiles", "RaftStorage"]
