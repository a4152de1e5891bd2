"""Raft on trio and on disk: the storage under a RaftNode and the task that drives it.

Where it sits on the clustered write path::

    RaftNode.ready() -> RaftService: hard state (atomic file) -> log append (file log) ->
    send (transport: routes later, LocalNetwork in tests) ... fsync in a worker thread
    (group commit) -> RaftNode.persisted -> commit -> StateMachine.apply

``RaftStorage`` is synchronous and shared with the simulator (natsjs/testing/raftsim.py), which runs
it over a model file log that forgets unsynced writes on a crash; so the recovery rules
below are exercised by the same code that runs in the server.  On disk, per group::

    <dir>/state.json        term, vote and the bootstrap voter set (atomic replace)
    <dir>/snapshot.json     index, term, voters, size and file of the current snapshot
    <dir>/snap-<index>.bin  the snapshot itself (received ones arrive as snap-<index>.tmp)
    <dir>/log/              the entries: a FileLog whose sequence is the Raft index

``RaftService`` owns the timers and the tasks; every call into the node happens under one
lock and the effects of one ``ready()`` are carried out before the node sees another
input, so the node's read-only view of the log is always current.
"""
from __future__ import annotations

import collections
import json
import os
import random
import zlib

import trio

from natsjs._core.raftlog import RaftCodecError, decode_entry
from natsjs.jetstream.raft import (
    OP_APPEND,
    OP_SNAPSHOT_CHUNK,
    OP_SNAPSHOT_INSTALL,
    OP_SNAPSHOT_SAVE,
    OP_TRUNCATE,
    LEADER,
    NotLeader,
    RaftConfig,
    RaftNode,
    SnapshotMeta,
)
from natsjs.jetstream.jstime import now_ns
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


# ---- transport ------------------------------------------------------------------------

class LocalNetwork:
    """An in-process transport between RaftServices (tests, benchmarks).

    Later the transport is internal subscriptions in the system account over routes; it
    has the same shape: ``send(peer, data)`` never blocks and may drop (a full inbox is a
    slow consumer), and what arrives is fed to the node.
    """

    def __init__(self, capacity: int = 65536, inline: bool = False):
        """``inline``: a message is stepped in the sending task when the receiving
        service is free (``RaftService.receive``), as the server's transport does."""
        self._capacity = capacity
        self._inline = inline
        self._services: dict = {}
        self._inboxes: dict[str, trio.MemorySendChannel] = {}
        self.blocked: set[tuple[str, str]] = set()   # (from, to) pairs cut off
        self.dropped = 0

    def attach(self, node_id: str):
        """A transport for ``node_id`` and the channel its received messages arrive on."""
        send, recv = trio.open_memory_channel(self._capacity)
        self._inboxes[node_id] = send
        return LocalTransport(self, node_id), recv

    def detach(self, node_id: str) -> None:
        self._services.pop(node_id, None)
        ch = self._inboxes.pop(node_id, None)
        if ch is not None:
            ch.close()

    def _deliver(self, src: str, dst: str, data: bytes) -> None:
        ch = self._inboxes.get(dst)
        if ch is None or (src, dst) in self.blocked:
            self.dropped += 1
            return
        if not hand_to(self._services.get(dst), ch, data):
            self.dropped += 1


class LocalTransport:
    __slots__ = ("_net", "id")

    def __init__(self, net: LocalNetwork, node_id: str):
        self._net = net
        self.id = node_id

    def send(self, peer: str, data: bytes) -> None:
        self._net._deliver(self.id, peer, data)

    def bind(self, service) -> None:
        if self._net._inline:
            self._net._services[self.id] = service


# ---- the driver -----------------------------------------------------------------------

class StateMachine:
    """What a RaftService applies committed entries to (the stream, the consumer, meta)."""

    def apply(self, entries: list) -> None:
        """``(index, term, data)`` of committed entries, in order, each exactly once."""

    def restore(self, storage: RaftStorage, index: int, term: int):
        """Replace the state with the snapshot now in ``storage`` (taken at ``index``).
        Return False when the snapshot only describes the state and the rest must be
        fetched (a stream's messages): the member is not counted until the state
        machine calls ``RaftService.restored()``."""

    def leader_changed(self, leader, term: int) -> None:
        """``leader`` is the new leader's id (None while there is none)."""

    def leader_ready(self, term: int) -> None:
        """This node leads ``term`` and has applied every entry before it: what only a
        leader does (deliveries, timers) may start from an up-to-date state."""

    def handing_over(self, active: bool) -> None:
        """This leader started handing leadership over (``transfer_leadership``: it
        refuses proposals until another leads), or gave up and leads on (False)."""

    def membership_changed(self, index: int, peers: tuple) -> None:
        """A configuration entry (the voters ``peers``) committed at ``index``."""


def hand_to(service, inbox, data) -> bool:
    """Give a received message to its node: the service bound to it (``bind``) steps or
    queues it, else the node's inbox channel holds it.  False: it was dropped (full or
    closed), for the transport to count."""
    if service is not None:
        return service.receive(data)
    try:
        inbox.send_nowait(data)
    except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
        return False
    return True


# Messages ``RaftService.receive`` holds while the node is busy, at most (as the inboxes'
# channels: past it, like a slow consumer's, they are dropped and Raft sends again).
QUEUE_MAX = 65536


class RaftService:
    """Runs one RaftNode: timers, message intake, fsync with group commit, effects."""

    def __init__(self, node_id: str, storage: RaftStorage, transport, fsm: StateMachine,
                 *, peers=(), config: RaftConfig | None = None, seed=None,
                 tick_interval: float | None = None, fsync=None, fsync_submit=None):
        """``fsync`` is an async callable that makes a log ``Sync`` durable and raises
        OSError when the disk refuses; the server passes JetStream's fsync thread
        (``Engine.fsync``, natsjs/_core/syncer.pyx), which needs no GIL hand-offs.  The
        default runs ``Sync.run`` in a trio worker thread."""
        self.id = node_id
        self._ready_term = -1
        self._fsync = fsync or _thread_fsync
        self.sync_errors = 0
        self.storage = storage
        self.transport = transport
        self.fsm = fsm
        self.cfg = config or RaftConfig()
        self.tick_interval = tick_interval or self.cfg.heartbeat_interval / 5
        storage.recover(peers)
        restoring = False
        if storage.snapshot is not None:
            restoring = fsm.restore(storage, storage.snapshot.index,
                                    storage.snapshot.term) is False
        self.node = RaftNode(node_id, storage.peers, view=storage, config=self.cfg,
                             rng=random.Random(seed), term=storage.term, vote=storage.vote,
                             snapshot=storage.snapshot, now=trio.current_time(),
                             repair=storage.repair)
        self.node.set_restoring(restoring)
        self._lock = trio.Lock()
        self._wake = trio.Event()
        self._sync_idle = trio.Event()
        self._sync_idle.set()
        self._sync_retry = trio.Event()
        self._syncing = None         # the log Sync being fsynced
        self._sync_wanted = False    # entries appended since it began
        self._log_busy = False       # a truncation or snapshot in a thread
        self._driving = False        # effects being carried out in a caller's task
        self._carry = None           # a Ready taken there that waits for the flush task
        self._failure = None         # what went wrong there, for the flush task to raise
        self._nursery = None
        self._inbox = None
        self._queued = collections.deque()  # received while busy (``receive``)
        self._queued_ev = trio.Event()
        self._fsync_submit = fsync_submit
        self._last_save = None       # trio.Event: the latest snapshot save is done
        bind = getattr(transport, "bind", None)
        if bind is not None:
            bind(self)      # messages for us may be stepped in the receiving task
        self._applied_changed = trio.Event()
        self.applied = self.node.applied
        self.leader_since_ns = None   # wall clock, for info's leader_since (leader only)
        self.syncs = 0
        self.closed = False
        self.stopping = False      # stop(): the storage is about to be closed under us

    # -- properties for stream info / monitoring

    @property
    def leader(self):
        return self.node.leader_id

    @property
    def term(self) -> int:
        return self.node.term

    def is_leader(self) -> bool:
        return self.node.role == LEADER

    @property
    def leader_since(self) -> float:
        """When this node last became leader (trio's clock)."""
        return self.node.leader_since

    def stop(self) -> None:
        """The owner is about to close the storage and cancel ``run``."""
        self.stopping = True

    def has_lease(self) -> bool:
        """Leader, and heard from a quorum lately (RaftNode.has_lease), by the clock now:
        after a pause the node's own notion of time is stale until the next tick."""
        return self.node.has_lease(trio.current_time())

    def peer_info(self) -> list[dict]:
        return self.node.peer_info()

    # -- application calls (synchronous; the work is done by the service's tasks)

    def propose(self, data) -> int:
        index = self.node.propose(data)
        self._wake.set()
        return index

    def propose_many(self, datas) -> int:
        index = self.node.propose_many(datas)
        self._wake.set()
        return index

    def kick(self) -> None:
        """Carry out what the proposals just made need (append, send) in the caller's
        task when nothing is under way; the flush task does it otherwise."""
        self._drive_now()

    def restored(self) -> None:
        """The state machine now holds what the snapshot it restored describes (its
        ``restore`` returned False and it fetched the rest): the node acknowledges,
        applies and may stand for election again."""
        self.node.set_restoring(False)
        self._wake.set()

    def transfer_leadership(self, to=None) -> str:
        peer = self.node.transfer_leadership(to)
        self.fsm.handing_over(True)
        self._wake.set()
        return peer

    def add_peer(self, peer: str) -> int:
        index = self.node.add_peer(peer)
        self._wake.set()
        return index

    def remove_peer(self, peer: str) -> int:
        index = self.node.remove_peer(peer)
        self._wake.set()
        return index

    async def compact(self, index: int, data: bytes) -> None:
        async with self._lock:
            before = self.node.snap.index
            self.node.compact(index, data)
            if self.node.snap.index != before:
                # the node may send it to a follower before the files are written
                self.storage.stage_snapshot(index, data)
            await self._drive()

    async def wait_applied(self, index: int) -> None:
        while self.applied < index:
            if self.closed:
                raise trio.ClosedResourceError("raft service closed")
            ev = self._applied_changed
            await ev.wait()

    # -- tasks
    #
    # The hot path runs in the task that caused the work, not in a task of its own:
    # a proposal, a message off the route and an fsync's completion each carry the
    # node's effects out at once (``_drive_now``) when no task is in the middle of
    # effects that wait (a thread: hard state, truncation, snapshots).  Each hop through
    # another task costs a pass of the event loop, and a publish with a quorum fsync
    # crosses some ten of them without this; under load a pass is a few hundred
    # microseconds.  The tasks below remain for what must wait, and for timers.

    async def run(self, inbox, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled.  ``inbox`` yields the bytes other nodes sent us."""
        self._inbox = inbox
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._recv_loop, inbox)
                nursery.start_soon(self._queue_loop)
                nursery.start_soon(self._tick_loop, inbox)
                nursery.start_soon(self._sync_loop)
                nursery.start_soon(self._flush_loop)
                task_status.started()
        except BaseException:
            # A group being stopped (its replica removed from this server) closes its
            # storage while a task may still be using it: a write that was in a worker
            # thread when the cancel came goes on to a closed log.  What that raises is
            # the stop, not a failure of the server (found by natsjs/testing/chaos,
            # membership changes).
            if not self.stopping:
                raise
        finally:
            self.closed = True
            self._nursery = None
            self._notify()

    def receive(self, data) -> bool:
        """A message from another node (the route's reader calls this): stepped here
        when nothing is under way, else queued for ``_queue_loop``.  Messages are
        stepped in the order they came: none is stepped here while earlier ones wait in
        the queue.  (The inbox channel is no place for them: a task that has taken a
        message from a channel has not stepped it yet, and one stepped here meanwhile
        would overtake it.)  False: the queue is full and the message is dropped, as a
        slow consumer's would be."""
        if self._queued or not self._may_drive_now():
            if len(self._queued) >= QUEUE_MAX or self.closed:
                return False
            self._queued.append(data)
            self._queued_ev.set()
            return True
        self.node.step(data, trio.current_time())
        self._drive_now()
        return True

    async def _queue_loop(self) -> None:
        node = self.node
        queued = self._queued
        while True:
            await self._queued_ev.wait()
            self._queued_ev = trio.Event()
            async with self._lock:
                now = trio.current_time()
                while queued:
                    node.step(queued.popleft(), now)
                node.tick(now)
                await self._drive()

    async def _recv_loop(self, inbox) -> None:
        node = self.node
        async for data in inbox:
            async with self._lock:
                now = trio.current_time()
                node.step(data, now)
                self._take_queued(inbox, now)
                node.tick(now)
                await self._drive()

    def _take_queued(self, inbox, now: float) -> None:
        # Everything already queued goes in before the next ready: one append-entries per
        # peer for all of it, and no election timeout fires while a leader's messages wait
        # in our own inbox.
        step = self.node.step
        for _ in range(4096):
            try:
                data = inbox.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            step(data, now)

    async def _tick_loop(self, inbox) -> None:
        while True:
            await trio.sleep(self.tick_interval)
            async with self._lock:
                now = trio.current_time()
                self._take_queued(inbox, now)
                self.node.tick(now)
                await self._drive()

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            if self._failure is not None:
                exc, self._failure = self._failure, None
                raise exc
            async with self._lock:
                await self._drive()

    # -- durability: one fsync at a time, covering everything appended before it began

    def _want_sync_now(self) -> None:
        """Entries were appended: start an fsync now, or after the one running."""
        if self._syncing is not None or self._log_busy or self._nursery is None:
            self._sync_wanted = True
            return
        self._sync_wanted = False
        s = self.storage.begin_sync()
        self._syncing = s
        self._sync_idle = trio.Event()
        if self._fsync_submit is not None:
            self._fsync_submit(s, self._sync_done)
        else:
            self._nursery.start_soon(self._await_sync, s)

    async def _await_sync(self, s) -> None:
        err = 0
        try:
            await self._fsync(s)
        except OSError as exc:
            err = exc.errno or -1
        self._sync_done(s, err)

    def _sync_done(self, s, err: int) -> None:
        """The fsync ``s`` finished (``err`` 0: durable): tell the node, start the next."""
        self._syncing = None
        self._sync_idle.set()
        if self.closed:
            return
        self.node.persisted(self.storage.finish_sync(s))
        if err:
            # Nothing was acknowledged; the log writes the unsynced bytes again on the
            # next sync, which the sync task retries at a calm pace.
            self.sync_errors += 1
            self._sync_retry.set()
        else:
            self.syncs += 1
            if self._sync_wanted:
                self._want_sync_now()
        if not self._drive_now():
            self._wake.set()

    async def _sync_loop(self) -> None:
        while True:
            await self._sync_retry.wait()
            self._sync_retry = trio.Event()
            await trio.sleep(self.cfg.heartbeat_interval)
            if self._syncing is None:
                self._sync_wanted = True
                async with self._lock:
                    self._want_sync_now()

    # -- effects

    def _may_drive_now(self) -> bool:
        return not (self._lock.locked() or self._driving or self._carry is not None
                    or self.closed or self._nursery is None)

    def _drive_now(self) -> bool:
        """Carry out the node's effects in the caller's task (see "tasks" above).
        False when that cannot be done here: then a task does it."""
        if not self._may_drive_now():
            return False
        self._driving = True
        try:
            while True:
                r = self.node.ready()
                if not r:
                    return True
                if r.hard_state is not None or any(op[0] != OP_APPEND for op in r.ops):
                    # needs a thread: the flush task takes it, under the lock
                    self._carry = r
                    self._wake.set()
                    return True
                self._effects(r)
                if not r.more:
                    return True
        except BaseException as exc:
            # The service's task raises it, as if it had happened there.
            self._failure = exc
            self._wake.set()
            return True
        finally:
            self._driving = False

    async def _drive(self) -> None:
        """Carry out the node's effects until it has none (lock held)."""
        if self._carry is not None:
            r, self._carry = self._carry, None
            await self._execute(r)
        while True:
            r = self.node.ready()
            if not r:
                return
            await self._execute(r)
            if not r.more:
                return

    async def _execute(self, r) -> None:
        storage = self.storage
        if r.hard_state is not None:
            await trio.to_thread.run_sync(storage.save_hard_state, *r.hard_state)
        if any(op[0] != OP_APPEND for op in r.ops):
            for op in r.ops:
                if op[0] == OP_APPEND:
                    storage.append(op[1], op[2])
                elif op[0] == OP_SNAPSHOT_SAVE:
                    self._save_snapshot_soon(op)
                else:
                    # after the snapshots being saved, which they may replace
                    if self._last_save is not None:
                        await self._last_save.wait()
                    # truncation, snapshots: never while an fsync is running on the
                    # log, and none starts until they are done
                    self._log_busy = True
                    try:
                        while self._syncing is not None:
                            await self._sync_idle.wait()
                        await trio.to_thread.run_sync(storage.apply_op, op)
                    finally:
                        self._log_busy = False
            if self._sync_wanted or \
                    any(op[0] in (OP_APPEND, OP_TRUNCATE, OP_SNAPSHOT_INSTALL) for op in r.ops):
                self._want_sync_now()
            r.ops = []
        self._effects(r)

    # -- snapshots: written while the group goes on
    #
    # Saving a snapshot is four fsyncs (its file and snapshot.json, each with its
    # directory), some milliseconds in all.  Done in line, the group stood still that
    # long -- no appends, acknowledgements or commits -- on every replica at once, since
    # all of them take a snapshot after the same number of records.  The files go to a
    # thread instead while entries flow; until they are written, the storage serves the
    # snapshot from memory (``stage_snapshot``); then the log forgets what it covers,
    # between two fsyncs.  Saves run one after another, and a truncation or an installed
    # snapshot waits for them.

    def _save_snapshot_soon(self, op) -> None:
        prev, done = self._last_save, trio.Event()
        self._last_save = done
        self._nursery.start_soon(self._save_snapshot, op, prev, done)

    async def _save_snapshot(self, op, prev, done) -> None:
        try:
            if prev is not None:
                await prev.wait()
            name = await trio.to_thread.run_sync(self.storage.write_snapshot, op)
            self._log_busy = True
            try:
                while self._syncing is not None:
                    await self._sync_idle.wait()
                self.storage.snapshot_written(op, name)
            finally:
                self._log_busy = False
            if self._sync_wanted:
                self._want_sync_now()
        except Exception as exc:
            # The service's task raises it, as if the save had been done there.
            self._failure = exc
            self._wake.set()
        finally:
            done.set()

    def _effects(self, r) -> None:
        """What of a Ready needs no waiting: appends, messages, applies."""
        if r.ops:
            storage = self.storage
            for op in r.ops:
                storage.append(op[1], op[2])
        send = self.transport.send
        for peer, data in r.messages:
            send(peer, data)
        if r.ops:
            # after the sends: the followers write while this log is fsynced
            self._want_sync_now()
        if r.restore is not None:
            self.node.set_restoring(self.fsm.restore(self.storage, *r.restore) is False)
        if r.committed:
            self.fsm.apply(r.committed)
        for index, peers in r.membership:
            self.fsm.membership_changed(index, peers)
        if r.leader is not None:
            self.leader_since_ns = now_ns() if r.leader[0] == self.id else None
            self.fsm.leader_changed(*r.leader)
        if r.transfer_failed and r.leader is None:
            self.fsm.handing_over(False)
        node = self.node
        if self._ready_term != node.term and node.leader_caught_up():
            self._ready_term = node.term
            self.fsm.leader_ready(node.term)
        if self.applied != self.node.applied or r.leader is not None or r.role is not None:
            self.applied = self.node.applied
            self._notify()

    def _notify(self) -> None:
        self._applied_changed.set()
        self._applied_changed = trio.Event()


async def _thread_fsync(sync) -> None:
    await trio.to_thread.run_sync(sync.run)


__all__ = ["DirFiles", "LocalNetwork", "LocalTransport", "NotLeader", "RaftService",
           "RaftStorage", "StateMachine"]
