"""Deterministic simulation of a Raft group, with a checker for what Raft promises.

What it runs: several ``RaftNode``s on the real ``RaftStorage`` (recovery rules included)
over a model file log that forgets every write that was not fsynced when its node
crashes (``SimLog``), a simulated clock, and a network that drops, delays, duplicates,
reorders and partitions; a crash may also damage the node's files (log records that
fail their checksums, a snapshot or term/vote file with a flipped bit), one node at a
time.  Faults are drawn from one seeded RNG, so a seed replays exactly:

    python -m natsjs.testing.raftsim --seeds 1000 [--nodes 5] [--first 0]

What it checks (``Checker``):

* election safety: at most one leader per term;
* log matching: two logs holding an entry with the same index and term hold the same
  entries up to there;
* state machine safety: every node applies index i with the same data, in order and
  exactly once per process lifetime (a restored snapshot must be a prefix of history);
* durability: an entry acknowledged to a client is never lost, even when every node
  crashes at once: it stays at its index and every voter applies it in the end;
* liveness: once the faults heal, a leader is elected, a new proposal commits and every
  voter catches up within ``liveness`` simulated seconds (3 s: about seven election
  timeouts of the simulation's config; 600 ms is the worst seen over thousands of seeds).

A violation raises ``Violation`` with the seed and a short event trail.
"""
from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
import time

from natsjs.jetstream.raft import LEADER, ConfigChangeInProgress, NotLeader, RaftConfig, RaftNode
from natsjs.jetstream.raft_storage import SNAPSHOT as SNAPSHOT_FILE
from natsjs.jetstream.raft_storage import STATE as STATE_FILE
from natsjs.jetstream.raft_storage import RaftStorage


class Violation(AssertionError):
    pass


# ---- storage models -------------------------------------------------------------------

class _SimSync:
    __slots__ = ("pos", "seq")

    def __init__(self, pos, seq):
        self.pos = pos
        self.seq = seq

    def run(self):
        pass


class SimLog:
    """The FileLog interface over a dict, with crash semantics: the durable state is
    what the last completed sync covered; ``crash`` throws the rest away (or, when the
    simulated OS happened to flush some of it, keeps a prefix of the later writes)."""

    def __init__(self):
        self.recs = {}
        self.first_seq = 1
        self.last_seq = 0
        self.synced_seq = 0
        self._durable = ({}, 1, 0)
        self._pending = []
        self.recovery = {}     # what the next open finds damaged, as FileLog reports it

    def append(self, subject, hdr, msg, ts, seq=0):
        if seq == 0:
            seq = self.last_seq + 1
        if seq != self.last_seq + 1:
            raise ValueError("append of %d after %d" % (seq, self.last_seq))
        self.recs[seq] = msg
        self.last_seq = seq
        self._pending.append(("a", seq, msg))
        return seq

    def load(self, seq):
        msg = self.recs.get(seq)
        return None if msg is None else (b"$NRG", None, msg, 0)

    def truncate(self, seq):
        _truncate(self.recs, seq)
        self.last_seq = seq
        self.first_seq = min(self.first_seq, seq + 1)   # as FileLog: truncate(0) empties
        self._pending.append(("t", seq, None))

    def compact(self, seq):
        _compact(self.recs, seq)
        self.first_seq = max(self.first_seq, seq)
        if seq > self.last_seq:
            self.last_seq = seq - 1
        self._pending.append(("c", seq, None))

    def begin_sync(self):
        return _SimSync(len(self._pending), self.last_seq)

    def mark_synced(self, s):
        self._flush(s.pos)
        self.synced_seq = s.seq
        return True

    def _flush(self, n):
        recs, first, last = self._durable
        for kind, seq, msg in self._pending[:n]:
            if kind == "a":
                recs[seq] = msg
                last = seq
            elif kind == "t":
                _truncate(recs, seq)
                last = seq
                first = min(first, seq + 1)
            else:
                _compact(recs, seq)
                first = max(first, seq)
                if seq > last:
                    last = seq - 1
        self._durable = (recs, first, last)
        del self._pending[:n]

    def crash(self, rng):
        if self._pending and rng.random() < 0.3:
            self._flush(rng.randrange(len(self._pending) + 1))
        self._pending = []
        recs, first, last = self._durable
        self.recs = dict(recs)
        self.first_seq, self.last_seq = first, last
        self.synced_seq = min(self.synced_seq, last)

    def damage(self, rng, seq=None):
        """Corrupt durable records of a crashed log as FileLog would find them: one
        record in the middle fails its checksum (a hole; ``seq``, else a random one), or
        the first ones do (the log seems to start later).  Returns what it did, or None
        if the log is empty."""
        recs, first, last = self._durable
        if last < first:
            return None
        if seq is not None or rng.random() < 0.5:
            seq = rng.randint(first, last) if seq is None else seq
            del recs[seq]
            self.recovery = {"corrupt": [{"seq": seq}], "lost": [seq]}
            what = "record %d" % seq
        else:
            upto = rng.randint(first, last)
            _compact(recs, upto + 1)
            self._durable = (recs, upto + 1, last)
            self.recovery = {"corrupt": [{"seq": None}], "lost": [(first, upto)]}
            what = "records %d-%d" % (first, upto)
        self.recs = dict(recs)
        self.first_seq, self.last_seq = self._durable[1], self._durable[2]
        return what

    def close(self):
        pass


def _truncate(recs, seq):
    for s in [s for s in recs if s > seq]:
        del recs[s]


def _compact(recs, seq):
    for s in [s for s in recs if s < seq]:
        del recs[s]


class SimFiles:
    """DirFiles' interface in memory: atomic writes are durable at once, scratch files
    (a snapshot being received) vanish in a crash."""

    def __init__(self):
        self.durable = {}
        self.scratch = {}

    def read_json(self, name):
        data = self.durable.get(name)
        return None if data is None else json.loads(data)

    def write_json(self, name, obj):
        self.durable[name] = json.dumps(obj).encode()

    def write_at(self, name, offset, data):
        buf = self.scratch.setdefault(name, bytearray())
        if offset == 0:
            buf.clear()
        buf[offset:offset + len(data)] = data

    def write_file(self, name, data):
        self.durable[name] = bytes(data)

    def promote(self, src, dst):
        self.durable[dst] = bytes(self.scratch.pop(src))

    def read_at(self, name, offset, size):
        src = self.durable.get(name)
        if src is None:
            src = self.scratch[name]
        return bytes(src[offset:offset + size])

    def remove(self, name):
        self.durable.pop(name, None)
        self.scratch.pop(name, None)

    def names(self):
        return list(self.durable) + list(self.scratch)

    def crash(self):
        self.scratch.clear()

    def damage(self, rng, name):
        """Flip a bit of a durable file (the checksums must catch it)."""
        data = bytearray(self.durable[name])
        off = rng.randrange(len(data))
        data[off] ^= 1 << rng.randrange(8)
        self.durable[name] = bytes(data)


# ---- the application: a list of values ----------------------------------------------------

def encode_state(items):
    return json.dumps(items).encode()


def decode_state(data):
    return [tuple(x) for x in json.loads(data)] if data else []


# ---- hosts, network, checker ----------------------------------------------------------

class SimHost:
    """One server process: a node, its storage, its application state."""

    def __init__(self, sim, node_id, peers):
        self.sim = sim
        self.id = node_id
        self.bootstrap = tuple(peers)
        self.log = SimLog()
        self.files = SimFiles()
        self.node = None
        self.storage = None
        self.up = False
        self.gen = 0
        self.syncing = None
        self.hold_sync = False  # tests: keep this host's writes unsynced
        self.damaged = False    # its files were damaged since it last started
        self.hold_restore = False  # tests: a received snapshot stays unrestored until
                                   # finish_restore() (a stream fetching its messages)
        self.restoring = 0      # > 0: a received snapshot is being restored
        self.app = []          # [(index, value)] applied, in order
        self.transfers_failed = 0  # leadership transfers given up, leading on

    def start(self):
        sim = self.sim
        self.gen += 1
        self.storage = RaftStorage(self.log, self.files)
        self.storage.recover(self.bootstrap)
        self.log.recovery = {}
        self.damaged = False
        if self.storage.damage:
            sim.trace("%s found damage: %s" % (self.id, "; ".join(self.storage.damage)))
        self.app = []
        applied_to = 0
        if self.storage.snapshot is not None:
            self.app = decode_state(self.storage.snapshot_bytes())
            applied_to = self.storage.snapshot.index
            sim.checker.restored(self.id, self.app, applied_to)
        self.applied_to = applied_to
        self.node = sim.node_cls(self.id, self.storage.peers, view=self.storage,
                                 config=sim.config, rng=random.Random(sim.rng.random()),
                                 term=self.storage.term, vote=self.storage.vote,
                                 snapshot=self.storage.snapshot, now=sim.now,
                                 repair=self.storage.repair)
        self.syncing = None
        self.restoring = 0
        self.up = True
        sim.trace("start %s term=%d last=%d" % (self.id, self.node.term, self.node.last_index))
        sim.at(sim.now + sim.rng.uniform(0, sim.tick), self._tick, self.gen)

    def crash(self):
        if not self.up:
            return
        self.up = False
        self.node = None
        self.log.crash(self.sim.rng)
        self.files.crash()
        self.sim.trace("crash %s" % self.id)

    def _tick(self, gen):
        if not self.up or gen != self.gen:
            return
        self.node.tick(self.sim.now)
        self.process()
        self.sim.at(self.sim.now + self.sim.tick, self._tick, gen)

    def receive(self, gen_unused, data):
        if not self.up:
            return
        self.node.tick(self.sim.now)
        self.node.step(data)
        self.process()

    def process(self):
        sim = self.sim
        node = self.node
        storage = self.storage
        while True:
            r = node.ready()
            if not r:
                break
            if r.hard_state is not None:
                storage.save_hard_state(*r.hard_state)
            for op in r.ops:
                storage.apply_op(op)
            for peer, data in r.messages:
                sim.net.send(self.id, peer, data)
            if r.role == LEADER:
                sim.checker.leader(self.id, node.term)
            if r.transfer_failed:
                self.transfers_failed += 1
            if r.restore is not None:
                if self.hold_restore or sim.slow_restore:
                    # The application needs a while to hold what the snapshot describes:
                    # the node waits for it (RaftNode.set_restoring).
                    node.set_restoring(True)
                    self.restoring += 1
                    if not self.hold_restore:
                        sim.at(sim.now + sim.rng.uniform(*sim.slow_restore),
                               self.finish_restore, self.gen, self.restoring)
                else:
                    self._restore(r.restore[0])
            for index, term, data in r.committed:
                sim.checker.applied(self.id, index, data, self.applied_to)
                self.app.append((index, data.decode()))
                self.applied_to = index
                sim.client_applied(self, index, data)
            if r.committed or r.membership:
                self.applied_to = max(self.applied_to, node.applied)
            if not r.more:
                break
        self.applied_to = max(self.applied_to, node.applied)
        if self.syncing is None and self.log._pending and not self.hold_sync:
            s = storage.begin_sync()
            self.syncing = s
            sim.at(sim.now + sim.rng.uniform(*sim.fsync), self._synced, self.gen, s)

    def _restore(self, index):
        self.app = decode_state(self.storage.snapshot_bytes())
        self.applied_to = index
        self.sim.checker.restored(self.id, self.app, index)

    def finish_restore(self, gen=None, which=None):
        """The application now holds the snapshot it received (the latest one)."""
        if not self.up or (gen is not None and gen != self.gen) or not self.restoring or \
                (which is not None and which != self.restoring):
            return
        self.restoring = 0
        self._restore(self.storage.snapshot.index)
        self.node.set_restoring(False)
        self.process()

    def _synced(self, gen, s):
        if not self.up or gen != self.gen or self.syncing is not s:
            return
        s.run()
        self.syncing = None
        self.node.persisted(self.storage.finish_sync(s))
        self.process()

    def snapshot(self):
        """The application compacts: snapshot at a random applied index."""
        node = self.node
        if node.applied <= node.snap.index:
            return
        index = self.sim.rng.randint(node.snap.index + 1, node.applied)
        items = [x for x in self.app if x[0] <= index]
        node.compact(index, encode_state(items))
        self.process()


class SimNetwork:
    def __init__(self, sim):
        self.sim = sim
        self.cut = set()          # frozenset({a, b}) pairs that cannot talk
        self.drop = 0.0
        self.dup = 0.0
        self.delay = (0.0005, 0.004)
        self.spike = 0.0          # chance of a long delay (reordering far)
        self.sent = 0

    def send(self, src, dst, data):
        sim = self.sim
        self.sent += 1
        if frozenset((src, dst)) in self.cut:
            return
        rng = sim.rng
        copies = 2 if self.dup and rng.random() < self.dup else 1
        for _ in range(copies):
            if self.drop and rng.random() < self.drop:
                continue
            d = rng.uniform(*self.delay)
            if self.spike and rng.random() < self.spike:
                d += rng.uniform(0.02, 0.3)
            host = sim.hosts.get(dst)
            if host is not None:
                sim.at(sim.now + d, host.receive, 0, data)

    def heal(self):
        self.cut = set()
        self.drop = self.dup = self.spike = 0.0

    def isolate(self, groups):
        """Nodes talk only within their group; a node in several groups is a bridge."""
        ids = list(self.sim.hosts)
        self.cut = set()
        for a in ids:
            for b in ids:
                if a < b and not any(a in g and b in g for g in groups):
                    self.cut.add(frozenset((a, b)))


class Checker:
    def __init__(self, sim):
        self.sim = sim
        self.leaders = {}         # term -> leader id
        self.history = {}         # index -> data, as first applied anywhere
        self.acked = {}           # index -> value acknowledged to a client

    def fail(self, msg):
        raise Violation("seed %s: %s\n  %s\n  %s" % (
            self.sim.seed, msg, "\n  ".join(self.sim.trail[-25:]),
            "\n  ".join(self.sim.status())))

    def leader(self, node_id, term):
        other = self.leaders.setdefault(term, node_id)
        if other != node_id:
            self.fail("two leaders in term %d: %s and %s" % (term, other, node_id))

    def applied(self, node_id, index, data, prev):
        if index <= prev:
            self.fail("%s applied %d after %d (not in order / twice)" % (node_id, index, prev))
        seen = self.history.setdefault(index, data)
        if seen != data:
            self.fail("%s applied %r at %d, others applied %r" % (node_id, data, index, seen))
        for i in range(prev + 1, index):
            # indexes skipped over must be non-data entries everywhere
            if i in self.history:
                self.fail("%s skipped entry %d" % (node_id, i))

    def restored(self, node_id, items, index):
        for i, value in items:
            seen = self.history.get(i)
            if seen is not None and seen.decode() != value:
                self.fail("%s restored %r at %d, history has %r" % (node_id, value, i, seen))
            if i > index:
                self.fail("%s snapshot at %d holds entry %d" % (node_id, index, i))

    def logs_match(self):
        hosts = [h for h in self.sim.hosts.values() if h.gen]
        for a_i, a in enumerate(hosts):
            for b in hosts[a_i + 1:]:
                la, lb = a.log, b.log
                hi = min(la.last_seq, lb.last_seq)
                lo = max(la.first_seq, lb.first_seq)
                agreed = False
                for i in range(hi, lo - 1, -1):
                    ea, eb = la.recs.get(i), lb.recs.get(i)
                    if ea is None or eb is None:
                        break
                    if agreed:
                        if ea != eb:
                            self.fail("logs of %s and %s differ at %d below a common entry"
                                      % (a.id, b.id, i))
                    elif ea[1:9] == eb[1:9]:   # same term at i
                        agreed = True
                        if ea != eb:
                            self.fail("logs of %s and %s: same index and term %d, other data"
                                      % (a.id, b.id, i))


class Sim:
    """One seeded run.  ``run()`` returns a dict of figures or raises Violation."""

    def __init__(self, seed, nodes=3, spares=1, duration=6.0, faults=True,
                 node_cls=RaftNode, config=None, fsync=(0.0005, 0.004), tick=0.01,
                 crash_rate=1.0, liveness=3.0, corrupt_rate=1.0, slow_restore=None):
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.tick = tick
        self.fsync = fsync
        self.duration = duration
        self.faults = faults
        self.crash_rate = crash_rate
        self.corrupt_rate = corrupt_rate
        self.liveness = liveness
        # (lo, hi) seconds: a received snapshot takes that long to restore (a stream
        # replica fetching the messages it describes); None: at once
        self.slow_restore = slow_restore
        self.node_cls = node_cls
        self.config = config or RaftConfig(heartbeat_interval=0.05, election_timeout_min=0.25,
                                           election_timeout_max=0.45, snapshot_chunk=256,
                                           max_append_entries=64, max_inflight=8)
        self._q = []
        self._n = 0
        self.trail = []
        self.net = SimNetwork(self)
        self.checker = Checker(self)
        ids = ["n%d" % i for i in range(nodes + spares)]
        voters = ids[:nodes]
        self.hosts = {i: SimHost(self, i, voters if i in voters else ()) for i in ids}
        self.proposed = {}        # value -> (host id, gen, index)
        self.next_value = 0
        self.acked_after = None   # time after which an ack proves liveness
        self.live_ack = None

    def status(self):
        out = []
        for h in self.hosts.values():
            n = h.node
            if n is None:
                out.append("%s down" % h.id)
                continue
            out.append("%s %s term=%d leader=%s commit=%d applied=%d last=%d persisted=%d "
                       "snap=%d voters=%s progress=%s" % (
                           h.id, n.role, n.term, n.leader_id, n.commit, n.applied,
                           n.last_index, n.persisted_index, n.snap.index, n.voters,
                           {p: (pr.state, pr.next, pr.match, pr.paused, len(pr.inflight))
                            for p, pr in n._progress.items()}))
        return out

    def start(self):
        """Start the bootstrap voters (for tests that drive the simulation by hand)."""
        for h in self.hosts.values():
            if h.bootstrap:
                h.start()

    def run_for(self, seconds, until=None, step=0.01):
        """Advance simulated time up to ``seconds``, stopping early once ``until()``;
        returns whether the condition held."""
        end = self.now + seconds
        while self.now < end:
            if until is not None and until():
                return True
            self.run_until(min(end, self.now + step))
        return until() if until is not None else True

    def trace(self, what):
        self.trail.append("%.3f %s" % (self.now, what))

    def at(self, t, fn, *args):
        self._n += 1
        heapq.heappush(self._q, (t, self._n, fn, args))

    def run_until(self, t):
        q = self._q
        while q and q[0][0] <= t:
            when, _, fn, args = heapq.heappop(q)
            self.now = when
            fn(*args)
        self.now = t

    # -- clients

    def leader_host(self):
        best = None
        for h in self.hosts.values():
            if h.up and h.node.role == LEADER and (best is None or h.node.term > best.node.term):
                best = h
        return best

    def propose(self):
        h = self.leader_host()
        if h is None:
            return
        value = "v%d" % self.next_value
        self.next_value += 1
        try:
            index = h.node.propose(value.encode())
        except NotLeader:
            return
        self.proposed[value] = (h.id, h.gen, index)
        h.process()

    def client_applied(self, host, index, data):
        value = data.decode()
        p = self.proposed.get(value)
        if p is not None and p[0] == host.id and p[1] == host.gen and p[2] == index:
            # the leader that took the proposal applied it where it put it: ack the client
            self.checker.acked[index] = data
            if self.acked_after is not None and self.now >= self.acked_after \
                    and self.live_ack is None:
                self.live_ack = self.now

    def _workload(self, until):
        if self.now >= until:
            return
        self.propose()
        self.at(self.now + self.rng.uniform(0.002, 0.03), self._workload, until)

    # -- faults

    def _fault(self):
        rng = self.rng
        ids = list(self.hosts)
        started = [h for h in self.hosts.values() if h.gen]
        kind = rng.choices(
            ["partition", "isolate_leader", "bridge", "heal", "lossy", "crash", "crash_all",
             "transfer", "snapshot", "membership", "corrupt"],
            [3, 2, 1, 3, 2, 3 * self.crash_rate, 0.7 * self.crash_rate, 1.5, 3, 1.2,
             0.8 * self.corrupt_rate])[0]
        net = self.net
        if kind == "partition":
            k = rng.randint(1, len(ids) // 2)
            minority = set(rng.sample(ids, k))
            net.isolate([minority, set(ids) - minority])
        elif kind == "isolate_leader":
            h = self.leader_host()
            if h is not None:
                net.isolate([{h.id}, set(ids) - {h.id}])
        elif kind == "bridge":
            b = rng.choice(ids)
            rest = [i for i in ids if i != b]
            rng.shuffle(rest)
            half = len(rest) // 2
            net.isolate([set(rest[:half]) | {b}, set(rest[half:]) | {b}])
        elif kind == "heal":
            net.heal()
        elif kind == "lossy":
            net.drop = rng.choice([0.0, 0.05, 0.2])
            net.dup = rng.choice([0.0, 0.05, 0.2])
            net.spike = rng.choice([0.0, 0.02, 0.1])
        elif kind == "crash":
            h = rng.choice(started)
            if h.up:
                h.crash()
                self.at(self.now + rng.uniform(0.01, 1.0), self._restart, h)
        elif kind == "corrupt":
            self._corrupt(rng.choice(started))
        elif kind == "crash_all":
            for h in started:
                h.crash()
            for h in started:
                self.at(self.now + rng.uniform(0.01, 0.5), self._restart, h)
        elif kind == "transfer":
            h = self.leader_host()
            if h is not None:
                try:
                    h.node.transfer_leadership()
                except (NotLeader, ValueError):
                    pass
                h.process()
        elif kind == "snapshot":
            h = rng.choice(started)
            if h.up:
                h.snapshot()
        elif kind == "membership":
            h = self.leader_host()
            # (not while a node repairs before voting: a change could leave it in a
            # group whose other voters are no majority, waiting for ever)
            if h is not None and not self._repairing():
                voters = h.node.voters
                outside = [i for i in ids if i not in voters]
                try:
                    if outside and (len(voters) <= len(ids) - 2 or rng.random() < 0.5):
                        new = rng.choice(outside)
                        h.node.add_peer(new)
                        if not self.hosts[new].gen:
                            self.hosts[new].start()
                    elif len(voters) > 2:
                        h.node.remove_peer(rng.choice(voters))
                except (ConfigChangeInProgress, NotLeader, ValueError):
                    pass
                h.process()
        self.trace("fault %s cut=%d drop=%.2f" % (kind, len(net.cut), net.drop))

    def _corrupt(self, h):
        """Crash ``h`` and damage its files: log records, the snapshot or the term and
        vote.  A minority at a time: only in a group of three voters or more, while no
        other node is still repairing (damage to a majority can lose what only they held,
        whatever the server does, and a node repairing before it votes cannot help
        elect the leader it repairs from)."""
        if not h.up or self._repairing() or any(
                len(o.node.voters) < 3 for o in self.hosts.values() if o.up):
            return
        h.crash()
        h.damaged = True
        rng = self.rng
        names = [n for n in (STATE_FILE, SNAPSHOT_FILE, h.storage._snap_file)
                 if n and n in h.files.durable]
        if rng.random() < 0.5 and names:
            name = rng.choice(names)
            h.files.damage(rng, name)
            what = name
        else:
            what = h.log.damage(rng)
        self.trace("corrupt %s: %s" % (h.id, what))
        self.at(self.now + rng.uniform(0.01, 1.0), self._restart, h)

    def _repairing(self):
        return any(h.damaged or h.storage is not None and h.storage.repair
                   for h in self.hosts.values())

    def _restart(self, h):
        if not h.up:
            h.start()

    def _faults(self, until):
        if self.now >= until:
            return
        self._fault()
        self.at(self.now + self.rng.uniform(0.05, 0.6), self._faults, until)

    # -- the run

    def run(self):
        """Start the voters and ``drive`` the seed's scenario."""
        self.start()
        return self.drive()

    def drive(self):
        """Workload and faults until ``duration``, then heal and check (started sim)."""
        try:
            return self._drive()
        except Violation:
            raise
        except AssertionError as exc:   # a node's own safety assertion fired
            self.checker.fail("node assertion: %s" % exc)

    def _drive(self):
        self.at(self.now + 0.1, self._workload, self.duration)
        if self.faults:
            self.at(self.now + 0.3, self._faults, self.duration)
        for t in range(1, int(self.duration) + 1):
            self.run_until(float(t))
            self.checker.logs_match()
        self.run_until(self.duration)
        # Heal everything, restart whoever is down, and demand progress.
        self.net.heal()
        for h in self.hosts.values():
            if h.gen and not h.up:
                h.start()
        healed = self.now
        self.acked_after = healed
        self.at(healed + 0.01, self._workload, healed + self.liveness)
        deadline = healed + self.liveness
        while self.now < deadline:
            self.run_until(self.now + 0.05)
            if self.live_ack is not None and self._caught_up():
                break
        else:
            h = self.leader_host()
            self.checker.fail("no progress within %.1fs of healing (leader %s, ack %s)"
                              % (self.liveness, h and h.id, self.live_ack))
        self.checker.logs_match()
        self._final_check()
        return {"seed": self.seed, "acked": len(self.checker.acked),
                "applied": len(self.checker.history), "messages": self.net.sent,
                "recover_time": self.live_ack - healed, "caught_up": self.now - healed}

    def _caught_up(self):
        h = self.leader_host()
        if h is None:
            return False
        commit = h.node.commit
        for v in h.node.voters:
            other = self.hosts[v]
            if not other.up or other.node.applied < commit:
                return False
        return True

    def _final_check(self):
        h = self.leader_host()
        history = self.checker.history
        for index, data in self.checker.acked.items():
            if history.get(index) != data:
                self.checker.fail("acknowledged entry %d lost" % index)
        for v in h.node.voters:
            other = self.hosts[v]
            got = dict(other.app)
            for index, data in self.checker.acked.items():
                if got.get(index) != data.decode():
                    self.checker.fail("%s lacks acknowledged entry %d" % (v, index))
            # everything a voter holds is history, in order
            if [i for i, _ in other.app] != sorted(i for i, _ in other.app):
                self.checker.fail("%s applied out of order" % v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--sabotage", choices=sorted(SABOTAGE), default=None)
    ap.add_argument("--corrupt-rate", type=float, default=1.0,
                    help="weight of the fault that damages a node's files (1 = default)")
    ap.add_argument("--slow-restore", type=float, default=0.0,
                    help="a received snapshot takes up to this many seconds to restore")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    acked = 0
    cls = SABOTAGE[args.sabotage] if args.sabotage else RaftNode
    for seed in range(args.first, args.first + args.seeds):
        r = Sim(seed, nodes=args.nodes, duration=args.duration, node_cls=cls,
                corrupt_rate=args.corrupt_rate,
                slow_restore=(0.01, args.slow_restore) if args.slow_restore else None).run()
        acked += r["acked"]
    print("%d seeds, %d nodes: ok, %d acknowledged entries checked, %.1fs"
          % (args.seeds, args.nodes, acked, time.perf_counter() - t0))


# ---- sabotaged nodes: the checker must catch each on some seed ---------------------------

class AckBeforePersist(RaftNode):
    """Follower acknowledges entries as soon as they arrive, before they are fsynced."""

    def _ack_index(self):
        return self._verified

    def _on_append(self, m):
        super()._on_append(m)
        if self.leader_id is not None and self.role != LEADER:
            self._ack_leader(False)


class MinorityCommit(RaftNode):
    """Leader commits what it alone has on disk."""

    def _quorum_for_commit(self):
        return 1


class NoPreVoteLease(RaftNode):
    """Grants votes while it still hears from a live leader (no lease)."""

    def _in_lease(self):
        return False


class VoteBeforeRepair(RaftNode):
    """Takes no notice of damage found on start: votes and stands at once."""

    def __init__(self, *args, repair=False, **kw):
        super().__init__(*args, **kw)


class CountedWhileRestoring(RaftNode):
    """Acknowledges, applies and campaigns while its application still lacks the
    snapshot it restored (run with ``slow_restore``)."""

    def set_restoring(self, restoring):
        pass


SABOTAGE = {"ack-before-persist": AckBeforePersist, "minority-commit": MinorityCommit,
            "no-lease": NoPreVoteLease, "vote-before-repair": VoteBeforeRepair,
            "counted-while-restoring": CountedWhileRestoring}


if __name__ == "__main__":
    sys.exit(main())
