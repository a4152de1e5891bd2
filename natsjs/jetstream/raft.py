"""Raft consensus for JetStream clustering: the node as a pure state machine.

Where it sits on the clustered write path::

    stream leader -> RaftNode.propose -> [driver: log append, fsync] -> append-entries to
    the followers -> [their driver: append, fsync] -> RaftNode.persisted -> append
    response -> commit on a quorum -> Ready.committed -> stream apply -> PubAck

The node does no I/O and reads no clock.  The driver (``raft_driver.RaftService`` on trio,
``natsjs/testing/raftsim.py`` in the simulator) feeds it inputs -- ``tick(now)``, ``step(data)``,
``propose(data)``, ``persisted(index)``, ``transfer_leadership()``, ``add_peer`` /
``remove_peer``, ``compact(index, snapshot)`` -- and then takes the accumulated effects
with ``ready()``: hard state to persist, log operations, messages, committed entries.
Effects are collected rather than returned per input so a batch of inputs (every message
of one read, every proposal of one ingest batch) turns into one append-entries per peer.

The one thing the node reads is the log it asked the driver to write, through a read-only
``LogView`` (``entry(index)`` and ``snapshot_chunk(offset, size)``); recent entries stay
in an in-memory tail, so the view is read only to catch up a peer that fell behind the
tail, to apply after a restart, and to rebuild the term index on start.

Our own design (issue 10), after the Raft paper and Ongaro's thesis: pre-vote and a
leader lease (a rejoining node cannot depose a healthy leader), check-quorum, leader
transfer with TimeoutNow, single-server membership changes (a new peer catches up as a
non-voting learner first), snapshots sent in chunks.
Durability rules:

* a follower acknowledges an index only once the driver has reported it persisted, and
  only up to what the current leader has shown to match its own log (``_verified``);
* the leader counts itself toward a quorum only for what it has persisted itself;
* entries are applied only once committed and persisted locally;
* repair before voting: a node whose storage was found damaged on start (a log that
  lost entries it may have acknowledged, a term/vote it can no longer read: see
  ``RaftStorage.recover``, natsjs/jetstream/raft_storage.py) starts with ``repair=True``.
  It neither stands for election nor grants a vote (real or pre-) until it has heard a
  leader and holds, durable and matching that leader, an entry of the leader's term: it
  then has every entry committed before that term, and it takes that leader as its vote
  for the term.  Until then it only follows and acknowledges what it really holds, like
  any follower.  The flag is part of the hard state, so a crash during the repair does
  not end it.
* a member whose state machine is still fetching what a snapshot describes
  (``set_restoring``) neither acknowledges nor applies nor stands for election.

Message fields by type (``natsjs/_core/raftlog.pyx`` has the byte layout)::

    APPEND        index=prev index, log_term=prev term, commit=leader commit, entries
    APPEND_RESP   SUCCESS: index=highest durable index matching the leader's log
                  else: index=rejected prev index, hint=conflict hint index,
                        log_term=term at the hint
    VOTE          index/log_term=candidate's last index/term; PREVOTE, TRANSFER flags
    VOTE_RESP     SUCCESS when granted; PREVOTE echoes the request
    TIMEOUT_NOW   leader asks a caught-up voter to start an election now
    SNAPSHOT      index/log_term=snapshot's last index/term, commit, hint=byte offset,
                  DONE on the last chunk, peers=voters at the snapshot, data=chunk
    SNAPSHOT_RESP index=snapshot index, hint=next byte offset the follower expects
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from natsjs._core.raftlog import (
    ENTRY_CONFIG,
    ENTRY_NOOP,
    ENTRY_NORMAL,
    FLAG_DONE,
    FLAG_PREVOTE,
    FLAG_SUCCESS,
    FLAG_TRANSFER,
    MSG_APPEND,
    MSG_APPEND_RESP,
    MSG_SNAPSHOT,
    MSG_SNAPSHOT_RESP,
    MSG_TIMEOUT_NOW,
    MSG_VOTE,
    MSG_VOTE_RESP,
    MatchIndex,
    Message,
    RaftCodecError,
    TermRuns,
    decode_entry,
    decode_message,
    decode_peers,
    encode_append,
    encode_entry,
    encode_message,
    encode_peers,
    encode_snapshot,
    entry_term,
)

FOLLOWER = "follower"
PRECANDIDATE = "pre-candidate"
CANDIDATE = "candidate"
LEADER = "leader"

# Log operations in Ready.ops, executed by the driver in order.
OP_APPEND = "append"                  # (OP_APPEND, first_index, [encoded entries])
OP_TRUNCATE = "truncate"              # (OP_TRUNCATE, last_index_kept)
OP_SNAPSHOT_SAVE = "snapshot-save"    # (.., index, term, peers, data): own snapshot; then
                                      # drop entries <= index from the log
OP_SNAPSHOT_CHUNK = "snapshot-chunk"  # (.., index, term, offset, data): a received chunk
OP_SNAPSHOT_INSTALL = "snapshot-install"  # (.., index, term, peers, size): the received
                                      # snapshot is complete; it replaces the whole log

# Peer replication states on the leader.
# A leadership hand-over asks again this many times in all before the leader carries on
# (a lost TimeoutNow must not leave `stream cluster step-down` waiting in vain).
TRANSFER_TRIES = 3

PROBE = 0       # one append at a time until the follower's match point is found
REPLICATE = 1   # pipelined: batches sent optimistically, up to max_inflight unacked
SNAPSHOT = 2    # the follower needs entries we compacted: send the snapshot in chunks


class NotLeader(Exception):
    """A leader-only operation on a node that is not (or no longer) the leader."""

    def __init__(self, leader: str | None, msg: str = "not leader"):
        super().__init__(msg)
        self.leader = leader


class ConfigChangeInProgress(Exception):
    """Membership changes go one at a time, after the leader committed in its term."""


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Timing and batching of one Raft group (seconds and bytes).

    The election timeout is well under a second so that a new stream leader takes writes
    within ~1.5 s of the old one dying (issue 10's target); heartbeats go out only to a
    peer that was sent nothing else for ``heartbeat_interval``, so replication traffic is
    the heartbeat under load and cannot starve it.
    """

    heartbeat_interval: float = 0.1
    election_timeout_min: float = 0.5
    election_timeout_max: float = 0.9
    max_append_bytes: int = 256 * 1024
    max_append_entries: int = 4096
    max_inflight: int = 64
    snapshot_chunk: int = 128 * 1024
    tail_cache_bytes: int = 32 * 1024 * 1024
    max_apply_entries: int = 8192


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """What the node knows of the latest snapshot: its last index/term, voters, size."""

    index: int
    term: int
    peers: tuple
    size: int


class Ready:
    """Effects accumulated since the last ``RaftNode.ready()``, in the order to execute:

    1. ``hard_state`` (term, vote, repairing): persist atomically before sending any
       message;
    2. ``ops``: log operations, in order (appends are not yet durable; the driver reports
       durability with ``persisted``);
    3. ``messages``: ``(peer, bytes)`` to send;
    4. ``restore`` (index, term): the application reloads its state from the snapshot
       just installed, before ``committed``;
    5. ``committed``: ``(index, term, data)`` of normal entries to apply, in order,
       exactly once in the node's life; ``membership``: ``(index, peers)`` of committed
       configuration entries;
    6. ``leader`` (leader id or None, term) and ``role`` when they changed;
       ``transfer_failed`` when a leadership transfer ran out of tries and this node
       leads on (it refused proposals meanwhile).

    ``more`` says there is further work to collect (a long apply backlog): call
    ``ready()`` again.  ``applied`` is the applied index when it moved (entries that
    are not for the state machine, such as a leader's no-op, move it too).
    """

    __slots__ = ("hard_state", "ops", "messages", "committed", "membership", "restore",
                 "leader", "role", "transfer_failed", "more", "applied")

    def __init__(self):
        self.hard_state = None
        self.ops = []
        self.messages = []
        self.committed = []
        self.membership = []
        self.restore = None
        self.leader = None
        self.role = None
        self.transfer_failed = False
        self.more = False
        self.applied = 0

    def __bool__(self):
        return bool(self.hard_state or self.ops or self.messages or self.committed or
                    self.membership or self.restore or self.leader or self.role or
                    self.transfer_failed or self.more or self.applied)


class Progress:
    """The leader's view of one follower."""

    __slots__ = ("next", "match", "state", "paused", "inflight", "last_sent", "last_heard",
                 "sent_commit", "snap_index", "snap_offset")

    def __init__(self, next_index, now):
        self.next = next_index
        self.match = 0
        self.state = PROBE
        self.paused = False
        self.inflight = []        # last index of each unacknowledged append, ascending
        self.last_sent = -1e18    # force a first send
        self.last_heard = now     # a fresh leader gives everyone one timeout of grace
        self.sent_commit = 0
        self.snap_index = 0
        self.snap_offset = 0


class RaftNode:
    """One member of one Raft group.  See the module docstring for the contract."""

    def __init__(self, node_id: str, peers, *, view, config: RaftConfig | None = None,
                 rng: random.Random | None = None, term: int = 0, vote: str | None = None,
                 snapshot: SnapshotMeta | None = None, now: float = 0.0,
                 repair: bool = False):
        self.id = node_id
        self._sender = node_id.encode()
        self.cfg = config or RaftConfig()
        self._rng = rng or random.Random()
        self._view = view
        self.now = now
        self.term = term
        self.vote = vote
        self.repairing = repair              # repair before voting (module docstring)
        self.role = FOLLOWER
        self.leader_id: str | None = None
        self.snap = snapshot or SnapshotMeta(0, 0, tuple(peers), 0)
        self._runs = TermRuns(self.snap.index, self.snap.term)
        self._configs = [(self.snap.index, tuple(self.snap.peers))]
        self._tail: list[bytes] = []         # recent entries, indexes _tail_first..last
        self._tail_bytes = 0
        # Rebuild the term index and the configuration history from the log on disk.
        for index in range(self.snap.index + 1, view.last_index + 1):
            entry = view.entry(index)
            if entry is None:
                raise RuntimeError("raft log has a gap at %d" % index)
            if self._runs.append_entries(index, [entry]):
                self._configs.append((index, decode_peers(decode_entry(entry)[3])))
        self._tail_first = self._runs.last + 1
        self.voters: tuple = self._configs[-1][1]
        self.persisted_index = self._runs.last     # the driver syncs the recovered log first
        self.commit = self.snap.index
        self.applied = self.snap.index
        self._verified = 0                   # highest index matching this term's leader
        self._acked = 0                      # highest match sent to this term's leader
        self._last_resp_at = -1e18
        self._last_leader_contact = -1e18
        self._election_deadline = 0.0
        self._votes: dict[str, bool] = {}
        self._recv = None                    # [index, next offset, term] of a snapshot
                                             # coming in
        self._progress: dict[str, Progress] = {}
        self._match: MatchIndex | None = None
        self._leader_since = 0.0
        self._leader_first = 0               # index of this leader's no-op entry
        self._transfer_to: str | None = None
        self._transfer_deadline = 0.0
        self._transfer_tries = 0             # hand-over attempts left
        self._transfer_chosen = False        # the caller named the target
        self._learners: set[str] = set()     # peers being caught up before they vote
        self.restoring = False               # the state machine lacks its snapshot's state
        self._handlers = {MSG_APPEND: self._on_append, MSG_APPEND_RESP: self._on_append_resp,
                          MSG_VOTE: self._on_vote, MSG_VOTE_RESP: self._on_vote_resp,
                          MSG_SNAPSHOT: self._on_snapshot,
                          MSG_SNAPSHOT_RESP: self._on_snapshot_resp,
                          MSG_TIMEOUT_NOW: self._on_timeout_now}
        self._ready = Ready()
        if self.repairing and self.voters == (self.id,):
            self.repairing = False           # no one to repair from: what it has is all
            self._save_hard_state()
        self.dropped = 0                     # undecodable messages (counted, never fatal)
        self._reset_election_timer()
        if self.term == 0 and self.last_index == 0 and self.voters and \
                self.voters[0] == self.id:
            # A new group: its first peer stands at once instead of waiting out an
            # election timeout (a group of one is led from the first tick).
            self._election_deadline = self.now

    # ---- queries -----------------------------------------------------------------------

    @property
    def last_index(self) -> int:
        return self._runs.last

    @property
    def last_term(self) -> int:
        return self._runs.last_term

    @property
    def first_index(self) -> int:
        return self.snap.index + 1

    def term_at(self, index: int) -> int:
        return self._runs.term_at(index)

    def is_leader(self) -> bool:
        return self.role == LEADER

    def leader_caught_up(self) -> bool:
        """Leader, and every entry of earlier terms is applied (this term's no-op is):
        the state machine is the group's latest and may act as the leader."""
        return self.role == LEADER and self.applied >= self._leader_first > 0


    def committed_voters(self) -> tuple:
        """The voters of the latest committed configuration this node knows."""
        return self._config_at(self.commit)

    @property
    def leader_since(self) -> float:
        return self._leader_since

    def promotable(self) -> bool:
        """A voter that may campaign: not repairing its log and not restoring a
        snapshot's state."""
        return self.id in self.voters and not self.repairing and not self.restoring

    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def peer_info(self) -> list[dict]:
        """Per-peer replication state for stream/consumer info.  A follower knows only
        when it last heard from its leader (current: within two heartbeats, as
        nats-server's raft.go Peers says it); of the other followers, nothing."""
        if self.role != LEADER:
            leader = self.leader_id
            if leader is None:
                return []
            active = self.now - self._last_leader_contact
            return [{"name": leader, "current": active <= 2 * self.cfg.heartbeat_interval,
                     "active": active, "lag": 0, "offline": False}]
        out = []
        eto = self.cfg.election_timeout_max
        for peer, pr in sorted(self._progress.items()):
            active = self.now - pr.last_heard
            # As nats-server reports it (raft.go Peers): lag is what the quorum has and
            # the peer has not persisted yet; current means none.
            out.append({"name": peer, "current": pr.match >= self.commit and active < eto,
                        "active": active, "lag": max(0, self.commit - pr.match),
                        "offline": active >= 2 * eto})
        return out

    # ---- inputs ------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Advance the node's notion of time: elections, heartbeats, check-quorum."""
        self.now = now
        if self.role == LEADER:
            self._tick_leader()
        elif now >= self._election_deadline:
            if self.promotable():
                self._campaign(pre=True)
            else:
                self._reset_election_timer()

    def step(self, data, now: float | None = None) -> None:
        """Feed one message received from a peer (bytes, or a decoded Message); ``now``
        moves the clock first, without running the timers ``tick`` runs."""
        if now is not None:
            self.now = now
        if isinstance(data, Message):
            m = data
        else:
            try:
                m = decode_message(data)
            except RaftCodecError:
                self.dropped += 1
                return
        if m.sender == self.id:
            return
        if m.term > self.term:
            if m.type == MSG_VOTE:
                if not (m.flags & FLAG_TRANSFER) and self._in_lease():
                    return  # a leader we heard from recently is alive: no disruption
                if m.flags & FLAG_PREVOTE:
                    self._on_vote(m)  # a pre-vote never changes anyone's term
                    return
            elif m.type == MSG_VOTE_RESP and m.flags & FLAG_PREVOTE and m.flags & FLAG_SUCCESS:
                self._on_vote_resp(m)
                return
            self._become_follower(m.term, m.sender if m.type in (MSG_APPEND, MSG_SNAPSHOT)
                                  else None)
        elif m.term < self.term:
            # Tell a stale leader or pre-candidate our term so it steps back.
            if m.type in (MSG_APPEND, MSG_SNAPSHOT):
                self._send(m.sender, encode_message(MSG_APPEND_RESP, 0, self.term,
                                                    self._sender, m.index))
            elif m.type == MSG_VOTE and m.flags & FLAG_PREVOTE:
                self._send(m.sender, encode_message(MSG_VOTE_RESP, FLAG_PREVOTE, self.term,
                                                    self._sender))
            return
        self._handlers[m.type](m)

    def propose(self, data) -> int:
        """Append ``data`` as a new entry; returns its index.  Leader only."""
        self._check_can_propose()
        return self._append_new(ENTRY_NORMAL, [data])

    def propose_many(self, datas) -> int:
        """Append several entries at once; returns the index of the last one."""
        self._check_can_propose()
        return self._append_new(ENTRY_NORMAL, list(datas))

    def persisted(self, index: int) -> None:
        """The driver made every entry up to ``index`` of the current log durable."""
        if index > self._runs.last:
            index = self._runs.last
        if index <= self.persisted_index:
            return
        self.persisted_index = index
        if self.role == LEADER:
            if self._match.update(self.id, index):
                self._maybe_commit()
        elif self.role == FOLLOWER and self.leader_id is not None:
            self._ack_leader(False)
            self._check_repaired()

    def transferring(self) -> bool:
        """This leader is handing over (``transfer_leadership``): proposals are refused
        until the transfer succeeds or gives up."""
        return self._transfer_to is not None

    def transfer_leadership(self, to: str | None = None) -> str:
        """Hand leadership to ``to`` (or the most caught-up voter) once it has every entry;
        proposals are refused meanwhile.  Returns the chosen peer."""
        if self.role != LEADER:
            raise NotLeader(self.leader_id)
        others = [p for p in self.voters if p != self.id and p in self._progress]
        if not others:
            raise ValueError("no voter to transfer leadership to")
        if to is not None and to not in others:
            raise ValueError("%s is not a voter" % to)
        self._transfer_chosen = to is not None
        self._transfer_tries = TRANSFER_TRIES
        return self._hand_over(to or max(sorted(others), key=lambda p: self._progress[p].match))

    def _hand_over(self, to: str) -> str:
        """Ask ``to`` to campaign now (once it has every entry: see _on_append_resp)."""
        self._transfer_to = to
        self._transfer_deadline = self.now + self.cfg.election_timeout_max
        if self._progress[to].match == self.last_index:
            self._send(to, encode_message(MSG_TIMEOUT_NOW, 0, self.term, self._sender))
        return to

    def _retry_transfer(self) -> None:
        """The target did not take over in time (its TimeoutNow or the election it
        started went missing, or it is slow): ask again, another caught-up voter if the
        caller did not name one, until the tries run out; then carry on leading."""
        failed = self._transfer_to
        self._transfer_to = None
        self._transfer_tries -= 1
        others = [p for p in self.voters if p != self.id and p in self._progress]
        if self._transfer_tries <= 0 or not others:
            self._ready.transfer_failed = True
            return
        if self._transfer_chosen and failed in others:
            to = failed
        else:
            best = max(self._progress[p].match for p in others)
            ready = sorted(p for p in others if self._progress[p].match == best)
            to = next((p for p in ready if p != failed), ready[0])
        self._hand_over(to)

    def add_peer(self, peer: str) -> None:
        """Start adding ``peer``: it is caught up first as a non-voting learner (snapshot
        and replay), and the configuration entry that makes it a voter is appended once
        it is within one batch of the commit index -- so an empty newcomer never holds
        up commits (think R1 -> R2).  ``Ready.membership`` reports the committed change;
        a leader change before then drops the learner (call again)."""
        if peer in self.voters:
            raise ValueError("%s is already a voter" % peer)
        self._check_config_change()
        self._learners.add(peer)
        self._progress[peer] = Progress(self.last_index + 1, self.now)

    def learners(self) -> list:
        """Peers being caught up before they vote (leader only)."""
        return sorted(self._learners)

    def cancel_learner(self, peer: str) -> None:
        """Stop adding ``peer`` (it was never counted): the next change may start."""
        if peer in self._learners:
            self._learners.discard(peer)
            self._progress.pop(peer, None)

    def remove_peer(self, peer: str) -> int:
        """Append the configuration entry without ``peer``; returns its index."""
        if peer not in self.voters:
            raise ValueError("%s is not a voter" % peer)
        if len(self.voters) == 1:
            raise ValueError("cannot remove the last voter")
        self._check_config_change()
        return self._append_new(ENTRY_CONFIG, [encode_peers(
            tuple(p for p in self.voters if p != peer))])

    def set_restoring(self, restoring: bool) -> None:
        """Whether the state machine still lacks the state of the snapshot it restored
        (a stream replica's snapshot says how far the stream goes; the messages come from
        the leader afterwards).  Meanwhile the node acknowledges nothing, applies nothing
        past the snapshot and does not stand for election: the group must not count on
        -- or be led by -- a member that does not hold what it committed.  A new peer
        is then made a voter only once it has caught up."""
        if restoring == self.restoring:
            return
        self.restoring = restoring
        if not restoring and self.role == FOLLOWER and self.leader_id is not None:
            self._ack_leader(True)

    def compact(self, index: int, data: bytes) -> None:
        """The application's state up to ``index`` (applied) is ``data``: keep it as the
        snapshot and drop the log up to there."""
        if index <= self.snap.index:
            return
        if index > self.applied:
            raise ValueError("cannot snapshot beyond the applied index")
        term = self._runs.term_at(index)
        peers = self._config_at(index)
        self._ready.ops.append((OP_SNAPSHOT_SAVE, index, term, peers, data))
        self.snap = SnapshotMeta(index, term, peers, len(data))
        self._runs.compact(index, term)
        self._configs = [(index, peers)] + [c for c in self._configs if c[0] > index]
        self._drop_tail_through(index)

    def ready(self) -> Ready:
        """Take the effects of every input since the last call (see ``Ready``)."""
        if self.role == LEADER:
            self._broadcast()
        self._collect_apply()
        self._trim_tail()
        r = self._ready
        self._ready = Ready()
        return r

    # ---- log ---------------------------------------------------------------------------

    def _entry(self, index: int) -> bytes:
        if index >= self._tail_first:
            return self._tail[index - self._tail_first]
        e = self._view.entry(index)
        if e is None:
            raise RuntimeError("raft log entry %d missing" % index)
        return e

    def _entries(self, lo: int, hi: int) -> list:
        """Entries lo..hi (inclusive), cut to the append batch limits (at least one)."""
        cfg = self.cfg
        hi = min(hi, lo + cfg.max_append_entries - 1)
        out = []
        size = 0
        if lo >= self._tail_first:
            out = self._tail[lo - self._tail_first:hi - self._tail_first + 1]
            for i, e in enumerate(out):
                size += len(e)
                if size > cfg.max_append_bytes and i:
                    return out[:i]
            return out
        for index in range(lo, hi + 1):
            e = self._entry(index)
            size += len(e)
            if size > cfg.max_append_bytes and out:
                break
            out.append(e)
        return out

    def _append_new(self, etype: int, datas: list) -> int:
        first = self._runs.last + 1
        term = self.term
        entries = [encode_entry(etype, term, first + k, d) for k, d in enumerate(datas)]
        self._append_entries(first, entries)
        return self._runs.last

    def _append_entries(self, first: int, entries: list) -> None:
        for k in self._runs.append_entries(first, entries):
            self._configs.append((first + k, decode_peers(decode_entry(entries[k])[3])))
            self._set_voters(self._configs[-1][1])
        if not self._tail:
            self._tail_first = first
        self._tail.extend(entries)
        self._tail_bytes += sum(map(len, entries))
        ops = self._ready.ops
        if ops and ops[-1][0] == OP_APPEND and ops[-1][1] + len(ops[-1][2]) == first:
            ops[-1][2].extend(entries)
        else:
            ops.append((OP_APPEND, first, list(entries)))

    def _truncate(self, keep: int) -> None:
        if keep < self.commit:
            raise AssertionError("raft: truncating committed entry %d (commit %d)"
                                 % (keep + 1, self.commit))
        self._runs.truncate(keep)
        if keep + 1 >= self._tail_first:
            cut = keep + 1 - self._tail_first
            self._tail_bytes -= sum(map(len, self._tail[cut:]))
            del self._tail[cut:]
        else:
            self._tail = []
            self._tail_bytes = 0
            self._tail_first = keep + 1
        if self._configs[-1][0] > keep:
            self._configs = [c for c in self._configs if c[0] <= keep]
            self._set_voters(self._configs[-1][1])
        self.persisted_index = min(self.persisted_index, keep)
        self._ready.ops.append((OP_TRUNCATE, keep))

    def _drop_tail_through(self, index: int) -> None:
        if index < self._tail_first:
            return
        cut = min(index + 1 - self._tail_first, len(self._tail))
        self._tail_bytes -= sum(map(len, self._tail[:cut]))
        del self._tail[:cut]
        self._tail_first += cut
        if not self._tail:
            self._tail_first = self._runs.last + 1

    def _trim_tail(self) -> None:
        # Keep what a follower still needs and what is not applied yet, within a budget;
        # anything dropped is read back through the view (it is in the log already).
        if not self._tail:
            return
        keep_from = min(self.applied, self.persisted_index) + 1
        if self.role == LEADER:
            for pr in self._progress.values():
                if pr.state != SNAPSHOT and pr.next < keep_from:
                    keep_from = pr.next
        if self._tail_bytes > self.cfg.tail_cache_bytes:
            keep_from = max(keep_from, self.persisted_index + 1 - 1024)
        if keep_from - self._tail_first >= 1024 or (
                keep_from > self._tail_first and self._tail_bytes > self.cfg.tail_cache_bytes):
            self._drop_tail_through(min(keep_from, self.persisted_index + 1) - 1)

    def _config_at(self, index: int) -> tuple:
        peers = self._configs[0][1]
        for i, p in self._configs:
            if i > index:
                break
            peers = p
        return peers

    # ---- roles -------------------------------------------------------------------------

    def _reset_election_timer(self) -> None:
        cfg = self.cfg
        self._election_deadline = self.now + self._rng.uniform(cfg.election_timeout_min,
                                                               cfg.election_timeout_max)

    def has_lease(self, now: float) -> bool:
        """A leader that heard from a quorum (itself included) within the shortest
        election timeout: no other leader can have been elected since, because a
        follower that heard from us refuses votes for that long (``_in_lease``).  A leader
        that was paused (SIGSTOP) or cut off keeps ``role == LEADER`` until check-quorum
        or a higher term tells it otherwise; what it does on its own authority without a
        round trip (a consumer's deliveries) must wait for this to hold again.  Nor is
        there a lease while handing leadership over: the target campaigns at once
        (TimeoutNow) and the followers do not wait out the lease for it, so it can lead
        before this node hears of it -- and this node can record nothing meanwhile."""
        if self.role != LEADER or self._transfer_to is not None:
            return False
        lease = self.cfg.election_timeout_min
        heard = 1 if self.id in self.voters else 0
        for peer in self.voters:
            if peer == self.id:
                continue
            pr = self._progress.get(peer)
            if pr is not None and now - pr.last_heard < lease:
                heard += 1
        return heard >= self.quorum()

    def _in_lease(self) -> bool:
        if self.role == LEADER:
            return True
        return (self.leader_id is not None and
                self.now - self._last_leader_contact < self.cfg.election_timeout_min)

    def _set_leader(self, leader: str | None) -> None:
        if leader != self.leader_id:
            self.leader_id = leader
            self._ready.leader = (leader, self.term)

    def _set_role(self, role: str) -> None:
        if role != self.role:
            self.role = role
            self._ready.role = role

    def _save_hard_state(self) -> None:
        self._ready.hard_state = (self.term, self.vote, self.repairing)

    def _become_follower(self, term: int, leader: str | None) -> None:
        if term > self.term:
            self.term = term
            self.vote = None
            self._save_hard_state()
            self._verified = 0
            self._acked = 0
        handing_over = self.role == LEADER and self._transfer_to is not None
        self._set_role(FOLLOWER)
        self._set_leader(leader)
        self._progress = {}
        self._learners = set()
        self._match = None
        self._transfer_to = None
        if leader is not None:
            self._last_leader_contact = self.now
        self._reset_election_timer()
        if handing_over:
            # A leader that handed over waits a full timeout longer before standing
            # again: should its chosen successor's election fail, another peer (not
            # the one asked to step down) is the likely winner.
            self._election_deadline += self.cfg.election_timeout_max

    def _campaign(self, pre: bool, transfer: bool = False) -> None:
        flags = FLAG_TRANSFER if transfer else 0
        if pre:
            self._set_role(PRECANDIDATE)
            self._set_leader(None)
            term = self.term + 1
            flags |= FLAG_PREVOTE
        else:
            self._set_role(CANDIDATE)
            self._set_leader(None)
            self.term += 1
            self.vote = self.id
            self._verified = 0
            self._acked = 0
            self._save_hard_state()
            term = self.term
        self._votes = {self.id: True}
        self._reset_election_timer()
        if self._won():
            self._election_won(pre)
            return
        msg = encode_message(MSG_VOTE, flags, term, self._sender, self.last_index,
                             self.last_term)
        for peer in self.voters:
            if peer != self.id:
                self._send(peer, msg)

    def _won(self) -> bool:
        return sum(1 for p, g in self._votes.items() if g and p in self.voters) >= self.quorum()

    def _election_won(self, pre: bool) -> None:
        if pre:
            self._campaign(pre=False)
        else:
            self._become_leader()

    def _become_leader(self) -> None:
        self._set_role(LEADER)
        self._set_leader(self.id)
        now = self.now
        nxt = self.last_index + 1
        self._progress = {p: Progress(nxt, now) for p in self.voters if p != self.id}
        self._learners = set()
        self._match = MatchIndex(self.voters)
        self._match.update(self.id, self.persisted_index)
        self._leader_since = now
        self._transfer_to = None
        self._leader_first = self._append_new(ENTRY_NOOP, [b""])
        if self._configs[-1][0] == 0 and self.voters:
            # The voters are written nowhere but the bootstrap state file: put them in
            # the log (a configuration entry that changes nothing), so a member whose
            # state file is damaged learns them again from its log or the leader's.
            self._append_new(ENTRY_CONFIG, [encode_peers(self.voters)])

    def _set_voters(self, peers: tuple) -> None:
        self.voters = peers
        if self.role != LEADER:
            return
        self._match.set_voters(peers)
        self._match.update(self.id, self.persisted_index)
        for p in peers:
            if p != self.id and p not in self._progress:
                self._progress[p] = Progress(self.last_index + 1, self.now)
        self._learners.difference_update(peers)
        for p in list(self._progress):
            if p not in peers and p not in self._learners:
                del self._progress[p]

    def _config_change_allowed(self) -> bool:
        # One change at a time, and (Ongaro's fix for single-server changes) only once a
        # new leader has committed in its own term, or a change from an earlier term
        # could be lost under it.
        return self._configs[-1][0] <= self.commit and self.commit >= self._leader_first

    def changing_membership(self) -> bool:
        """A peer is being added, or a configuration entry is not committed yet: the
        next change must wait (``Ready.membership`` reports the commit)."""
        return bool(self._learners) or not self._config_change_allowed()

    def _check_config_change(self) -> None:
        if self.role != LEADER or self._transfer_to is not None:
            raise NotLeader(self.leader_id)
        if self._learners:
            raise ConfigChangeInProgress("a peer is being added")
        if not self._config_change_allowed():
            raise ConfigChangeInProgress("a membership change is not committed yet")

    def _maybe_promote(self, peer: str, pr: Progress) -> None:
        if (pr.state == REPLICATE and pr.match + self.cfg.max_append_entries >= self.commit
                and self._transfer_to is None and self._config_change_allowed()):
            self._append_new(ENTRY_CONFIG, [encode_peers(self.voters + (peer,))])

    def _check_can_propose(self) -> None:
        if self.role != LEADER:
            raise NotLeader(self.leader_id)
        if self._transfer_to is not None:
            raise NotLeader(None, "leadership transfer in progress")

    # ---- votes -------------------------------------------------------------------------

    def _on_vote(self, m: Message) -> None:
        pre = bool(m.flags & FLAG_PREVOTE)
        if self.repairing:
            # Repair before voting: we may have voted in this term before the damage, or
            # lost entries the candidate lacks.
            self._send(m.sender, encode_message(MSG_VOTE_RESP, FLAG_PREVOTE if pre else 0,
                                                self.term, self._sender))
            return
        can_vote = (self.vote == m.sender or (self.vote is None and self.leader_id is None)
                    or (pre and m.term > self.term))
        up_to_date = (m.log_term > self.last_term or
                      (m.log_term == self.last_term and m.index >= self.last_index))
        flags = FLAG_PREVOTE if pre else 0
        if can_vote and up_to_date:
            self._send(m.sender, encode_message(MSG_VOTE_RESP, flags | FLAG_SUCCESS, m.term,
                                                self._sender))
            if not pre:
                self.vote = m.sender
                self._save_hard_state()
                self._reset_election_timer()
        else:
            self._send(m.sender, encode_message(MSG_VOTE_RESP, flags, self.term,
                                                self._sender))

    def _on_vote_resp(self, m: Message) -> None:
        pre = bool(m.flags & FLAG_PREVOTE)
        if pre:
            if self.role != PRECANDIDATE:
                return
            if m.flags & FLAG_SUCCESS and m.term != self.term + 1:
                return  # an answer to an older pre-vote round
        elif self.role != CANDIDATE or m.term != self.term:
            return
        if m.sender not in self.voters:
            return
        self._votes[m.sender] = bool(m.flags & FLAG_SUCCESS)
        if self._won():
            self._election_won(pre)
        elif sum(1 for p, g in self._votes.items() if not g and p in self.voters) \
                >= self.quorum():
            self._become_follower(self.term, None)

    # ---- follower side -----------------------------------------------------------------

    def _on_timeout_now(self, m: Message) -> None:
        # the leader hands over: campaign at once, skipping the pre-vote and the lease
        if self.role == FOLLOWER and self.promotable():
            self._campaign(pre=False, transfer=True)

    def _heard_leader(self, leader: str) -> None:
        self._set_role(FOLLOWER)
        self._set_leader(leader)
        self._last_leader_contact = self.now
        self._reset_election_timer()

    def _ack_index(self) -> int:
        """What this follower may tell the leader it has: durable and verified (nothing
        while its state machine is restoring: the answer only says it is alive)."""
        if self.restoring:
            return 0
        return min(self.persisted_index, self._verified)

    def _ack_leader(self, force: bool) -> None:
        ack = self._ack_index()
        if ack > self._acked or force:
            self._acked = max(self._acked, ack)
            self._last_resp_at = self.now
            self._send(self.leader_id, encode_message(MSG_APPEND_RESP, FLAG_SUCCESS,
                                                      self.term, self._sender, ack))

    def _on_append(self, m: Message) -> None:
        if self.role == LEADER:
            return  # cannot happen: one leader per term
        self._heard_leader(m.sender)
        prev, prev_term, entries = m.index, m.log_term, m.entries
        base = self.snap.index
        if prev < base:
            # Entries at or below our snapshot are committed and already in it.
            skip = base - prev
            entries = entries[skip:] if skip < len(entries) else []
            prev, prev_term = base, self.snap.term
        if prev > self.last_index:
            self._reject(m.index, self.last_index)
            return
        if self._runs.term_at(prev) != prev_term:
            self._reject(m.index, self._runs.last_at_most(prev, prev_term))
            return
        index = prev + 1
        k = 0
        n = len(entries)
        runs = self._runs
        last = runs.last
        # Skip what we already have (duplicates, overlapping pipelined batches).
        while k < n and index <= last and runs.term_at(index) == entry_term(entries[k]):
            k += 1
            index += 1
        appended = False
        if k < n:
            if index <= last:
                self._truncate(index - 1)
            self._append_entries(index, entries[k:] if k else entries)
            appended = True
        if prev + n > self._verified:
            self._verified = prev + n
        c = min(m.commit, self._verified)
        if c > self.commit:
            self.commit = c
        if not appended or self.now - self._last_resp_at >= self.cfg.heartbeat_interval:
            self._ack_leader(True)
        # otherwise the response goes out when the driver reports these entries persisted
        self._check_repaired()

    def _check_repaired(self) -> None:
        """End the repair (module docstring) once we hold, durable and verified, an entry
        of the current leader's term: the leader wrote its no-op first in its term, after
        every entry committed before, so we then hold all of those too."""
        if not self.repairing or self.role != FOLLOWER or self.leader_id is None:
            return
        ack = self._ack_index()
        if ack < self.snap.index or self._runs.term_at(ack) != self.term:
            return
        self.repairing = False
        if self.vote is None:
            # We may have voted in this term before the damage: counting its leader as
            # our vote keeps us from granting another in it.
            self.vote = self.leader_id
        self._save_hard_state()

    def _reject(self, rejected: int, hint: int) -> None:
        self._last_resp_at = self.now
        self._send(self.leader_id, encode_message(
            MSG_APPEND_RESP, 0, self.term, self._sender, rejected,
            self._runs.term_at(hint), 0, hint))

    def _on_snapshot(self, m: Message) -> None:
        if self.role == LEADER:
            return
        self._heard_leader(m.sender)
        index, term = m.index, m.log_term
        if index <= self.snap.index or (index <= self.last_index and
                                        self._runs.term_at(index) == term):
            # We hold everything up to there already.
            self._recv = None
            if index > self._verified:
                self._verified = index
            c = min(m.commit, self._verified)
            if c > self.commit:
                self.commit = c
            self._ack_leader(True)
            self._check_repaired()
            return
        offset = m.hint
        if self._recv is None or self._recv[0] != index or self._recv[2] != m.term:
            # Chunks of one snapshot come from one leader: another leader's file for the
            # same index need not be byte-identical, so a new sender starts over.
            if offset != 0:
                self._send_snapshot_resp(index, 0)
                return
            self._recv = [index, 0, m.term]
        if offset != self._recv[1]:
            self._send_snapshot_resp(index, self._recv[1])
            return
        self._ready.ops.append((OP_SNAPSHOT_CHUNK, index, term, offset, m.data))
        self._recv[1] += len(m.data)
        if m.flags & FLAG_DONE:
            self._install_snapshot(index, term, tuple(m.peers), self._recv[1])
            self._recv = None
        else:
            self._send_snapshot_resp(index, self._recv[1])

    def _send_snapshot_resp(self, index: int, offset: int) -> None:
        self._last_resp_at = self.now
        self._send(self.leader_id, encode_message(MSG_SNAPSHOT_RESP, 0, self.term,
                                                  self._sender, index, 0, 0, offset))

    def _install_snapshot(self, index: int, term: int, peers: tuple, size: int) -> None:
        self._ready.ops.append((OP_SNAPSHOT_INSTALL, index, term, peers, size))
        self.snap = SnapshotMeta(index, term, peers, size)
        self._runs.reset(index, term)
        self._tail = []
        self._tail_first = index + 1
        self._tail_bytes = 0
        self._configs = [(index, peers)]
        self._set_voters(peers)
        # Nothing is durable until the driver says the snapshot and the emptied log are:
        # it then reports persisted(index), and the acknowledgement goes out.
        self.persisted_index = 0
        self._verified = index
        self.commit = max(self.commit, index)
        self.applied = index
        self._ready.restore = (index, term)

    # ---- leader side -------------------------------------------------------------------

    def _tick_leader(self) -> None:
        now = self.now
        cfg = self.cfg
        if self._transfer_to is not None and now >= self._transfer_deadline:
            self._retry_transfer()
        if now - self._leader_since >= cfg.election_timeout_max:
            active = 1 if self.id in self.voters else 0
            for peer in self.voters:
                pr = self._progress.get(peer)
                if pr is not None and now - pr.last_heard < cfg.election_timeout_max:
                    active += 1
            if active < self.quorum():
                # Check-quorum: a leader cut off from a majority steps down, so clients
                # go looking for the leader the majority has elected meanwhile.
                self._become_follower(self.term, None)
                return
        for pr_peer, pr in self._progress.items():
            if now - pr.last_sent >= cfg.heartbeat_interval:
                if pr.state == REPLICATE:
                    self._send_heartbeat(pr_peer, pr, pr.next - 1)
                elif pr.state == PROBE:
                    pr.paused = False
                    self._send_append(pr_peer, pr)
                else:
                    if pr.snap_offset >= self.snap.size and self.snap.size:
                        chunk = self.cfg.snapshot_chunk
                        pr.snap_offset = ((self.snap.size - 1) // chunk) * chunk
                    self._send_snapshot(pr_peer, pr)

    def _broadcast(self) -> None:
        last = self._runs.last
        commit = self.commit
        max_inflight = self.cfg.max_inflight
        for peer, pr in self._progress.items():
            state = pr.state
            if state == REPLICATE:
                sent = False
                while pr.next <= last and len(pr.inflight) < max_inflight:
                    self._send_append(peer, pr)
                    sent = True
                    if pr.state != REPLICATE:
                        break
                if not sent and pr.sent_commit < commit:
                    # A commit update at the match point cannot be rejected; it leaves the
                    # heartbeat clock alone, so a lost batch is still found by the next
                    # heartbeat (whose prev is next - 1).
                    self._send_heartbeat(peer, pr, pr.match, False)
            elif state == PROBE:
                if not pr.paused:
                    self._send_append(peer, pr)
            elif not pr.paused and pr.snap_offset < self.snap.size:
                self._send_snapshot(peer, pr)

    def _send_heartbeat(self, peer: str, pr: Progress, prev: int, beat: bool = True) -> None:
        if prev < self.snap.index:
            self._send_snapshot(peer, pr)
            return
        if beat:
            pr.last_sent = self.now
        pr.sent_commit = self.commit
        self._send(peer, encode_append(self.term, self._sender, prev,
                                       self._runs.term_at(prev), self.commit, []))

    def _send_append(self, peer: str, pr: Progress) -> None:
        prev = pr.next - 1
        if prev < self.snap.index:
            self._send_snapshot(peer, pr)
            return
        last = self._runs.last
        entries = self._entries(pr.next, last) if pr.next <= last else []
        pr.last_sent = self.now
        pr.sent_commit = self.commit
        self._send(peer, encode_append(self.term, self._sender, prev,
                                       self._runs.term_at(prev), self.commit, entries))
        if pr.state == REPLICATE:
            if entries:
                pr.next += len(entries)
                pr.inflight.append(pr.next - 1)
        else:
            pr.paused = True

    def _send_snapshot(self, peer: str, pr: Progress) -> None:
        snap = self.snap
        if pr.state != SNAPSHOT or pr.snap_index != snap.index:
            pr.state = SNAPSHOT
            pr.snap_index = snap.index
            pr.snap_offset = 0
            pr.inflight = []
        offset = pr.snap_offset
        size = min(self.cfg.snapshot_chunk, snap.size - offset)
        chunk = self._view.snapshot_chunk(offset, size) if size > 0 else b""
        done = offset + len(chunk) >= snap.size
        pr.last_sent = self.now
        pr.paused = True
        self._send(peer, encode_snapshot(self.term, self._sender, snap.index, snap.term,
                                         self.commit, offset, done, encode_peers(snap.peers),
                                         chunk))

    def _heard_from(self, m: Message) -> Progress | None:
        """The sender's progress if we lead it, marked as heard from now (check-quorum)."""
        if self.role != LEADER:
            return None
        pr = self._progress.get(m.sender)
        if pr is not None:
            pr.last_heard = self.now
        return pr

    def _on_append_resp(self, m: Message) -> None:
        pr = self._heard_from(m)
        if pr is None:
            return
        if m.flags & FLAG_SUCCESS:
            index = m.index
            if index > pr.match:
                pr.match = index
                if self._match.update(m.sender, index):
                    self._maybe_commit()
                    if self.role != LEADER:
                        return
            if pr.state == REPLICATE:
                if index + 1 > pr.next:
                    pr.next = index + 1
                inflight = pr.inflight
                if inflight and inflight[0] <= index:
                    k = 0
                    while k < len(inflight) and inflight[k] <= index:
                        k += 1
                    del inflight[:k]
            elif pr.state == PROBE:
                pr.state = REPLICATE
                pr.next = max(pr.next, pr.match + 1)
                pr.paused = False
                pr.inflight = []
            elif pr.match >= pr.snap_index:
                pr.state = REPLICATE
                pr.next = pr.match + 1
                pr.paused = False
                pr.inflight = []
            if self._transfer_to == m.sender and pr.match == self.last_index:
                self._send(m.sender, encode_message(MSG_TIMEOUT_NOW, 0, self.term,
                                                    self._sender))
            elif m.sender in self._learners:
                self._maybe_promote(m.sender, pr)
            return
        rejected = m.index
        if m.hint < pr.match <= rejected and pr.state != SNAPSHOT:
            # The follower lacks entries it acknowledged: its storage was damaged and it
            # is repairing (module docstring).  Nothing is known durable on it any more;
            # find its match point again.  (A stale rejection overtaken by an ack does the
            # same: harmless, the next ack restores the match.)
            pr.match = 0
            self._match.forget(m.sender)
            pr.state = PROBE
            pr.next = rejected + 1
        if pr.state == REPLICATE:
            if rejected <= pr.match:
                return  # answers an append that has been overtaken
        elif pr.state == PROBE:
            if rejected != pr.next - 1:
                return
        else:
            return
        hint = m.hint
        if hint >= self.snap.index:
            k = self._runs.last_at_most(hint, m.log_term)
        else:
            k = hint
        nxt = max(pr.match + 1, min(k + 1, rejected))
        # No step back possible means the follower lost entries it had acknowledged
        # (a wiped disk): retry at heartbeat pace instead of bouncing at network speed.
        pr.paused = pr.state == PROBE and nxt == pr.next
        pr.next = nxt
        pr.state = PROBE
        pr.inflight = []

    def _on_snapshot_resp(self, m: Message) -> None:
        pr = self._heard_from(m)
        if pr is None or pr.state != SNAPSHOT or m.index != pr.snap_index:
            return
        pr.snap_offset = m.hint
        pr.paused = False

    def _quorum_for_commit(self) -> int:
        return self.quorum()

    def _maybe_commit(self) -> None:
        c = self._match.commit_index(self._runs, self.term, self.commit,
                                     self._quorum_for_commit())
        if c <= self.commit:
            return
        self.commit = c
        if self.id not in self.voters and self._configs[-1][0] <= c:
            # Our own removal is committed: hand over to the most caught-up voter and go.
            best = max(sorted(p for p in self._progress if p in self.voters),
                       key=lambda p: self._progress[p].match, default=None)
            if best is not None and self._progress[best].match >= c:
                self._send(best, encode_message(MSG_TIMEOUT_NOW, 0, self.term,
                                                self._sender))
            self._broadcast()
            self._become_follower(self.term, None)

    # ---- effects -----------------------------------------------------------------------

    def _send(self, peer: str, data: bytes) -> None:
        self._ready.messages.append((peer, data))

    def _collect_apply(self) -> None:
        limit = min(self.commit, self.persisted_index)
        if self.restoring:
            limit = min(limit, self.snap.index)
        if self.applied >= limit:
            return
        hi = min(limit, self.applied + self.cfg.max_apply_entries)
        committed = self._ready.committed
        membership = self._ready.membership
        for index in range(self.applied + 1, hi + 1):
            etype, term, _, data = decode_entry(self._entry(index))
            if etype == ENTRY_NORMAL:
                committed.append((index, term, data))
            elif etype == ENTRY_CONFIG:
                membership.append((index, decode_peers(data)))
        self.applied = self._ready.applied = hi
        if hi < limit:
            self._ready.more = True
