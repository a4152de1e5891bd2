"""Replicated streams and consumers: a stream (or consumer) whose state is a Raft log.

Where it sits in a message's path (DESIGN.md, for R3/R5): the stream leader's capture
(natsjs/jetstream/stream.py) queues the publish; its ingest task proposes the batch to
the stream's Raft group instead of storing it; the group replicates the entries and
commits them once a quorum has them fsynced (natsjs/jetstream/raft_driver.py); every
replica then applies the committed entries in order to its own store through the same
``Stream.process`` a single server uses, so all replicas decide alike (the entry
carries its timestamp; duplicates are judged against it); the leader sends the PubAck
from what the apply returned.  Reads (consumers, direct gets) see only applied entries:
committed data.

The Raft log is the durable record; the store is not fsynced per entry.  Every
``SNAPSHOT_EVERY`` entries the store is fsynced and the log compacted to a snapshot
that says how far the store goes; on a restart the store is cut back to that point and
the log after it is applied again.

A store whose files were damaged (records failing their checksums) is never served from
and never passed on: on start it is cut back to before the first sequence the damage
can have touched (``_cut_damage``); what it lacks then comes from the leader (catch-up,
natsjs/jetstream/catchup.py) or from the log; while it catches up the replica neither
acknowledges nor applies nor stands for election (``RaftNode.set_restoring``), so it is
not counted and a leader's store is always whole.

A consumer of a replicated stream has its own group on the same peers: its leader
delivers and proposes what changes its state (acknowledgements, delivered positions),
and every replica applies them, so a new consumer leader knows what was acknowledged.
"""
from __future__ import annotations

import errno
import json
import os
import struct

import trio

from natsjs._core.filelog import FileLog
from natsjs._core.jsingest import apply_plain, decode_record
from natsjs.jetstream import batching, catchup
from natsjs.jetstream.entries import (E_ATOMIC, E_BATCH, E_MSG, E_OP, E_SOURCED, SEQ, decode_msg,
                                      encode_msg, encode_sourced)
from natsjs.jetstream.consumer import Consumer
from natsjs.jetstream.errors import ApiError
from natsjs.jetstream.jstime import now_ns
from natsjs.jetstream.priority import announce_paused
from natsjs.jetstream.raft import ConfigChangeInProgress, NotLeader, RaftConfig
from natsjs.jetstream.raft_driver import RaftService, StateMachine
from natsjs.jetstream.raft_storage import DirFiles, RaftStorage
from natsjs.jetstream.recovery import log_recovery
from natsjs.jetstream.snapshot import ClusterRestore
from natsjs.jetstream.store import (META, MSGS, OBS, ConsumerState, MemConsumerStore,
                                    open_message_log, write_json_atomic,
                                    OP_ACK, OP_FLOOR)
from natsjs.jetstream.stream import Stream

SNAPSHOT_EVERY = 8192

# Fault injection for tests, off unless set in the server's environment when it starts:
# "<stream>:<seq>" makes this server's replica of <stream> fail (once) to apply the
# message that would get sequence <seq>, as a disk error would (tests of the reset).
FAIL_APPLY_ENV = "NATSJS_TEST_FAIL_APPLY"


def _fail_apply_at(stream_name: str) -> int:
    name, _, seq = os.environ.get(FAIL_APPLY_ENV, "").rpartition(":")
    return int(seq) if name == stream_name and seq.isdigit() else 0


class _Replica(StateMachine):
    """What stream and consumer replicas share: their group's membership follows the
    peers the meta group assigns (stream updates changing replicas, peer removal)."""

    def assigned_peers(self) -> list:
        return self.peers

    leaving = False

    def membership_changed(self, index: int, peers: tuple) -> None:
        self.reconcile_members()

    def leave(self) -> None:
        """The meta group took this server out of the group: keep serving as a member
        until the group's leader says its committed configuration no longer counts on
        us (a replacement is caught up and made a voter before the peer it replaces is
        removed), then go.  A member cut off from the group stays (its data may be
        needed) until the leader can tell it."""
        if self.leaving:
            return
        self.leaving = True
        self.js.spawn(self._leave)

    async def _leave(self) -> None:
        def staying() -> bool:
            return self.closed or not self.leaving
        me = self.cluster.me
        while not staying():
            if self.raft.is_leader():
                try:
                    self.raft.transfer_leadership()     # the next leader removes us
                except Exception:
                    pass
                await trio.sleep(0.25)
                continue
            voters = await self.cluster.group_voters(self.group)
            if staying():
                return
            if voters is not None and me not in voters:
                break
            await trio.sleep(0.5)
        if staying():
            return
        self.cluster.drop_replica(self)

    def reconcile_members(self) -> None:
        """On the leader: move the group's voters one step toward the assigned peers
        (one change at a time, as Raft's single-server changes must go); called again
        when that change commits and when a new leader is ready."""
        svc = self.raft
        if self.closed or not svc.is_leader():
            return
        node = svc.node
        want = self.assigned_peers()
        me = self.cluster.me
        try:
            if node.changing_membership():
                return
            if me not in want:
                svc.transfer_leadership()        # the next leader removes us
                return
            for p in node.learners():
                if p not in want:
                    node.cancel_learner(p)       # a newcomer no longer wanted
            for p in want:
                if p not in node.voters:
                    svc.add_peer(p)
                    return
            for p in node.voters:
                if p not in want:
                    svc.remove_peer(p)
                    return
        except (NotLeader, ConfigChangeInProgress, ValueError) as exc:
            self.server.log.debug("JetStream cluster: membership of %s: %r", self.group, exc)


class ReplicatedStream(_Replica):
    """This server's replica of a stream of the cluster."""

    kind = "stream"

    @classmethod
    def create(cls, cluster, sa: dict):
        jsa = cluster.js.accounts.get(sa["acc"])
        if jsa is None:
            cluster.server.log.error("JetStream cluster: stream '%s > %s' is assigned here but "
                                     "the account has no JetStream on this server",
                                     sa["acc"], sa["cfg"]["name"])
            return None
        try:
            return cls(cluster, jsa, sa)
        except Exception as exc:     # a replica that cannot start never stops the server
            cluster.server.log.error("JetStream cluster: cannot start stream '%s > %s': %r",
                                     sa["acc"], sa["cfg"]["name"], exc)
            return None

    def __init__(self, cluster, jsa, sa: dict):
        self.cluster = cluster
        self.js = cluster.js
        self.server = cluster.server
        self.jsa = jsa
        self.acc_name = sa["acc"]
        cfg = sa["cfg"]
        self.name = cfg["name"]
        self.group = sa["group"]["name"]
        self.peers = list(sa["group"]["peers"])
        self.sa = sa
        self.path = os.path.join(jsa.dir, "streams", self.name)
        os.makedirs(os.path.join(self.path, MSGS), exist_ok=True)
        write_json_atomic(os.path.join(self.path, META),
                          {"config": cfg, "created": sa["created"], "group": sa["group"]})
        store = open_message_log(os.path.join(self.path, MSGS) if cfg["storage"] == "file"
                                 else None, cfg)
        self._cut_damage(store)
        self.stream = Stream(jsa, cfg, sa["created"], store, self.path)
        self.stream.replica = self
        self._replies: dict[int, bytes] = {}       # raft index -> reply (leader)
        self._waiters: dict[int, list] = {}        # raft index -> [event, result] (ops)
        self._answered_create = False
        self._scope = trio.CancelScope()
        self.closed = False
        self._snapshotting = False
        self._since_snapshot = 0
        files = DirFiles(os.path.join(self.path, "raft"))
        log = FileLog(os.path.join(self.path, "raft", "log"))
        storage = RaftStorage(log, files)
        transport, self._inbox = cluster.transport.attach(self.group)
        self.catch_up_to = None        # last sequence a snapshot says we must fetch up to
        self._held: list = []          # entries after a 'restored' one, until caught up
        # A stream assigned with a backup to restore (snapshot.ClusterRestore): settled
        # once the group's log says it was restored.
        self.restore_settled = False
        self._restore = None           # the restore this leader runs
        self._snapshot_after_catch_up = False
        self._collect = None           # (datas, replies) of the batch being proposed
        # A replica that failed to apply an entry for a reason of its own (not a limit
        # every replica reaches alike) is reset from the leader: the error, until done.
        self.resetting: str | None = None
        self._reset_index = 0          # the entry it failed on
        self.reset_through = 0         # entries up to here are in what it fetched
        self._fail_apply_at = _fail_apply_at(self.name)
        # The store goes back to where the last snapshot says it was (restore(), called
        # by the service when there is one; empty otherwise); the log after that point
        # is applied again.
        self.raft = RaftService(cluster.me, storage, transport, self, peers=self.peers,
                                config=RaftConfig(), fsync=self.js.fsync,
                                fsync_submit=self.js.fsync_submit)
        cluster.report_damage(repr(self), storage)
        if storage.snapshot is None:
            self._reset_store(None)
        self._cu_sub = self.js.subscribe(
            self.server.system_account, b"$JSC.CU.%s" % self.group.encode(),
            lambda *a: catchup.serve(self, *a))
        jsa.streams[self.name] = self.stream
        self.js.start_stream(self.stream)
        self.js.spawn(self._run)

    async def _run(self) -> None:
        with self._scope:
            await self.raft.run(self._inbox)

    def __repr__(self) -> str:
        return "stream %s > %s (%s)" % (self.acc_name, self.name, self.group)

    # ---- leadership ------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.raft.is_leader()

    def leader_changed(self, leader, term: int) -> None:
        stream = self.stream
        if leader == self.cluster.me:
            self.server.log.info("JetStream cluster new stream leader for '%s > %s'",
                                 self.acc_name, self.name)
            stream.rebuild_state()
            stream.lseq = stream.store.last_seq
            if not self.awaiting_restore():
                stream.subscribe_capture()
            if not self._answered_create and self.sa.get("reply") and \
                    not self.sa.get("restore"):
                self._answered_create = True
                self._answer_create()
        else:
            stream.unsubscribe_capture()
            stream.lead_sourcing(False)
            self._replies.clear()
        for c in stream.consumers.values():
            c.signal()

    def handing_over(self, active: bool) -> None:
        """A leader handing over refuses proposals: it stops taking publishes at once, so
        that a publisher hears "no responders" from its own server and retries (as with
        nats-server, whose old leader drops its interest) instead of waiting out its
        timeout on a message that would be dropped here.  The interest's removal leaves
        before the step-down's answer.  A transfer that fails leaves this node leading:
        it takes publishes again."""
        stream = self.stream
        if active:
            stream.unsubscribe_capture()
        elif self.is_leader() and not self.awaiting_restore():
            stream.subscribe_capture()

    def _answer_create(self) -> None:
        """The stream's first leader answers the create request (as nats-server's does)."""
        reply = self.sa["reply"].encode()
        resp = {"type": "io.nats.jetstream.api.v1.stream_create_response",
                **self.stream.info(), "did_create": True}
        self.js.api.answer(reply, resp)

    # ---- the write path: propose, then apply -------------------------------------------

    def propose_batch(self, batch: list) -> None:
        """The leader's ingest: every queued publish becomes one entry."""
        datas = []
        replies = []
        ts = self.stream.batch_time()
        self._collect = (datas, replies)
        try:
            for subject, reply, hdr, msg in batch:
                if reply is not None and reply.__class__ is not bytes:
                    # A handler (a mirror's or source's delivery, a subject delete
                    # marker) runs here on the leader, in order; what it writes comes
                    # back through write_sourced into this batch.
                    reply(subject, hdr, msg)
                    continue
                if hdr is not None and batching.BATCH_ID in hdr and \
                        batching.batch_id(hdr) is not None:
                    # Staged here; the committed batch is one entry (batching.py).
                    entry, answer = batching.stage_on_leader(self.stream, subject, reply,
                                                             hdr, msg, ts)
                    if entry is not None:
                        datas.append(entry)
                        replies.append(reply)
                    elif reply and not self.stream.cfg["no_ack"]:
                        self.stream.send_replies([(reply, answer)])
                    continue
                datas.append(encode_msg(subject, hdr, msg, ts))
                replies.append(reply)
        finally:
            self._collect = None
        if not datas:
            return
        try:
            last = self.raft.propose_many(datas)
        except NotLeader:
            return                # clients time out and retry; nothing was accepted
        first = last - len(datas) + 1
        for i, reply in enumerate(replies):
            if reply:
                self._replies[first + i] = reply

    def propose_sourced(self, subject: bytes, hdr: bytes | None, msg: bytes, ts: int,
                        mirror_seq: int) -> None:
        """What the stream writes itself (Stream.write_sourced) on the leader: into the
        batch being proposed, or an entry of its own."""
        data = encode_sourced(subject, hdr, msg, ts or now_ns(), mirror_seq)
        if self._collect is not None:
            self._collect[0].append(data)
            self._collect[1].append(None)
            return
        try:
            self.raft.propose(data)
        except NotLeader:
            pass

    def propose_records(self, data: bytes, replies: list) -> None:
        """The leader's C capture: a batch of records (jsingest.StreamSink.take) as one
        entry; ``replies`` has each record's reply subject or None."""
        try:
            index = self.raft.propose(E_BATCH + data)
        except NotLeader:
            return                # clients time out and retry; nothing was accepted
        if any(replies):
            self._replies[index] = replies

    async def propose_op(self, op: dict, timeout: float = 5.0):
        """Propose an operation (purge, delete) and wait for its result at apply."""
        index = self.raft.propose(E_OP + json.dumps(op, separators=(",", ":")).encode())
        ev = trio.Event()
        slot = [ev, None]
        self._waiters[index] = slot
        with trio.move_on_after(timeout):
            await ev.wait()
        self._waiters.pop(index, None)
        if not ev.is_set():
            raise ApiError.of("JSClusterNotAvailErr")
        if isinstance(slot[1], ApiError):
            raise slot[1]
        return slot[1]

    def apply(self, entries: list) -> None:
        stream = self.stream
        replies = []
        for i, (index, term, data) in enumerate(entries):
            if index <= self.reset_through:
                continue             # in the leader's store that a reset fetched
            try:
                if self._apply_entry(index, data, replies):
                    # What comes after waits until the restored messages are here.
                    self._held.extend(entries[i + 1:])
                    break
            except Exception as exc:
                # Not one of the outcomes every replica reaches alike (those come back
                # as an ApiError): this store may now differ from the others.
                self.server.log.error("JetStream cluster: error applying stream entries "
                                      "to '%s > %s': %r", self.acc_name, self.name, exc)
                if self.raft.node.voters == (self.cluster.me,):
                    continue     # no other replica to differ from, nor to reset from
                self._reset(index, exc)
                self._held.extend(entries[i + 1:])
                break
        stream.lseq = stream.store.last_seq
        stream.synced_seq = stream.store.last_seq
        stream.send_replies(replies, signal=True)
        if self._since_snapshot >= SNAPSHOT_EVERY and not self._snapshotting and \
                not self.resetting:
            self._snapshotting = True
            self.js.spawn(self._snapshot)

    def _apply_entry(self, index: int, data: bytes, replies: list) -> bool:
        """One committed entry into the store; True when later entries must wait for
        a catch-up (a 'restored' entry on a follower)."""
        stream = self.stream
        kind = data[:1]
        if kind == E_BATCH:
            self._since_snapshot += self._apply_records(data, self._replies.pop(index, None),
                                                        replies)
            return False
        if kind == E_MSG:
            subject, hdr, msg, ts = decode_msg(data)
            stream.lift_budget()
            self._apply_one(subject, hdr, msg, ts, self._replies.pop(index, None), replies)
        elif kind == E_ATOMIC:
            stream.lift_budget()
            out = batching.apply_entry(stream, data)
            reply = self._replies.pop(index, None)
            if reply and not stream.cfg["no_ack"]:
                replies.append((reply, out))
        elif kind == E_SOURCED:
            mirror_seq = SEQ.unpack_from(data, 1)[0]
            subject, hdr, msg, ts = decode_msg(data, 1 + SEQ.size)
            stream.lift_budget()
            out = stream.process_sourced(subject, hdr, msg, ts, mirror_seq)
            if isinstance(out, ApiError):
                self.server.log.warn("JetStream cluster: stream '%s > %s' could not "
                                     "store a sourced message: %s", self.acc_name,
                                     self.name, out)
            stream.forget_gone_markers()
        elif kind == E_OP:
            op = json.loads(data[1:])
            if op.get("op") == "restored":
                self._since_snapshot += 1
                return self._follow_restore(op, index)
            result = self._apply_op(op)
            slot = self._waiters.get(index)
            if slot is not None:
                slot[1] = result
                slot[0].set()
        self._since_snapshot += 1
        return False

    def _apply_records(self, data: bytes, rreplies: list | None, replies: list) -> int:
        """Apply a batch entry: plain records straight into the log (C), the others
        through the stream's checks.  Returns how many records it held."""
        stream = self.stream
        store = stream.store
        off = 1
        i = 0
        end = len(data)
        stream.lift_budget()
        while off < end:
            if stream.plain:
                off, first, n = apply_plain(store, data, off)
                if n:
                    if rreplies is not None:
                        for k in range(n):
                            r = rreplies[i + k]
                            if r is not None:
                                replies.append((r, first + k))
                    i += n
                    stream.lseq = first + n - 1
                    stream.lmsgid = ""
                    if off >= end:
                        break
            off, ts, subject, hdr, msg = decode_record(data, off)
            self._apply_one(subject, hdr, msg, ts,
                            rreplies[i] if rreplies is not None else None, replies)
            i += 1
        return i

    def _apply_one(self, subject, hdr, msg, ts: int, reply, replies: list) -> None:
        """One message through the stream's checks, as every replica decides it."""
        stream = self.stream
        stream.set_batch_time(ts)
        if self._fail_apply_at and stream.store.last_seq + 1 >= self._fail_apply_at:
            self._fail_apply_at = 0
            raise OSError(errno.EIO, "apply failure injected by " + FAIL_APPLY_ENV)
        # What every replica reaches alike (limits, duplicates, expected last
        # sequence...) comes back as an error reply; an exception is this replica's own.
        out = stream.process(subject, reply or b"_", hdr, msg, ts)
        if reply and out is not None:
            replies.append((reply, out))

    def _apply_op(self, op: dict):
        stream = self.stream
        kind = op.get("op")
        try:
            if kind == "purge":
                return stream.purge(op.get("filter", ""), op.get("seq", 0), op.get("keep", 0))
            if kind == "delete":
                return stream.delete_msg(op["seq"], op.get("erase", False))
        except ApiError as err:
            return err
        return None

    # ---- snapshots and restarts ----------------------------------------------------------

    def _state(self) -> dict:
        st = self.stream.store.state()
        out = {"first_seq": st["first_seq"], "last_seq": st["last_seq"],
               "messages": st["messages"]}
        if self.restore_settled:
            out["restored"] = True
        return out

    async def _snapshot(self) -> None:
        """Make the store durable, then let the log forget what it holds."""
        try:
            store = self.stream.store
            index = self.raft.applied
            state = self._state()
            if self.stream.is_file:
                s = store.begin_sync()
                await self.js.fsync(s)
                store.mark_synced(s)
            await self.raft.compact(index, json.dumps(state).encode())
            self._since_snapshot = 0
        except Exception as exc:
            self.server.log.error("JetStream cluster: snapshot of '%s > %s' failed: %r",
                                  self.acc_name, self.name, exc)
        finally:
            self._snapshotting = False

    def _cut_damage(self, store) -> None:
        """A store with damaged records (its recovery report) goes back to before the
        first sequence the damage can have touched, durably, and the damaged bytes are
        overwritten (FileLog.scrub); the snapshot and the log then say what is missing."""
        report = getattr(store, "recovery", None) or {}
        if not report.get("corrupt") and not report.get("lost"):
            return
        log = self.server.log
        log_recovery(log, self.acc_name, self.name, report)
        first = report.get("damaged_from") or 1
        log.error("JetStream cluster: stream '%s > %s': message store damaged: cut back to "
                  "%d (was %d); the rest comes from the leader", self.acc_name, self.name,
                  first - 1, store.last_seq)
        if store.last_seq >= first:
            store.truncate(first - 1)
        s = store.begin_sync()
        s.run()
        store.mark_synced(s)
        store.scrub()
        report["lost"] = []     # not lost: fetched again (stream state reports no loss)

    def _reset_store(self, state) -> None:
        """Cut the store back to a snapshot's state (or to empty without one)."""
        store = self.stream.store
        last = state["last_seq"] if state else (self.stream.cfg.get("first_seq") or 1) - 1
        if store.last_seq > last:
            store.truncate(last)
        self.stream.lseq = store.last_seq
        self.stream.synced_seq = store.last_seq

    def restore(self, storage: RaftStorage, index: int, term: int):
        """The snapshot says how far the stream goes, not what it holds: a store behind
        it fetches the rest from the leader (natsjs/jetstream/catchup.py) and, until it
        has it, this member is not counted (returns False; ``caught_up`` ends that)."""
        try:
            state = json.loads(storage.snapshot_bytes() or b"{}")
        except ValueError:
            state = {}
        if state.get("restored"):
            self.restore_settled = True
        last = state.get("last_seq")
        if last is None:
            return None
        store = self.stream.store
        if store.last_seq >= last:
            self._reset_store(state)
            if self.catch_up_to is None:
                return None
        elif self.catch_up_to is None:
            self.server.log.warn("JetStream cluster: stream '%s > %s' is behind its "
                                 "snapshot (%d < %d); catching up", self.acc_name,
                                 self.name, store.last_seq, last)
            self.js.spawn(self._catch_up)
        self.catch_up_to = last          # a fetch under way goes on to the newer snapshot
        return False

    async def _catch_up(self) -> None:
        await catchup.fetch(self)

    # ---- resetting a replica that failed to apply ------------------------------------------

    def _reset(self, index: int, exc: Exception) -> None:
        """Entry ``index`` failed here for a reason of this replica's own (a disk error,
        a bug): its store may no longer be what the others hold.  As nats-server's
        resetClusteredState (server/jetstream_cluster.go) does, it gives up its contents
        and takes the leader's: the store is emptied, the member is not counted, does not
        apply and does not stand for election (``RaftNode.set_restoring``), then hands
        over if it leads and fetches the leader's messages (``_reset_from_leader``)."""
        log = self.server.log
        log.warn("JetStream cluster: resetting stream cluster state for '%s > %s'",
                 self.acc_name, self.name)
        self.resetting = repr(exc)
        self._reset_index = index
        self.raft.node.set_restoring(True)
        self._reset_store(None)
        if self.catch_up_to is None:
            self.js.spawn(self._reset_from_leader)

    async def _reset_from_leader(self) -> None:
        """Ask another leader how far its store goes and which entries that covers,
        then fetch those messages (natsjs/jetstream/catchup.py); the entries after them
        apply as usual, those before are skipped."""
        cluster = self.cluster
        while not self.closed:
            leader = self.raft.leader
            if leader == cluster.me and not self.raft.node.transferring():
                try:
                    self.raft.transfer_leadership()      # again if a transfer failed
                except (NotLeader, ValueError) as err:
                    self.server.log.warn("JetStream cluster: stream '%s > %s' cannot hand "
                                         "over while resetting: %r", self.acc_name,
                                         self.name, err)
            if leader is None or leader == cluster.me:
                await trio.sleep(0.2)
                continue
            resp = await cluster.request_raw(b"$JSC.CU.%s" % self.group.encode(),
                                             {"state": True}, 2.0)
            try:
                state = json.loads(resp)
                applied, last = int(state["applied"]), int(state["last_seq"])
            except (TypeError, ValueError, KeyError):
                await trio.sleep(0.2)
                continue
            if applied < self._reset_index:
                await trio.sleep(0.05)         # the leader has not applied it yet
                continue
            self.reset_through = applied
            if self.catch_up_to is not None:
                # A snapshot installed meanwhile started a fetch: it goes on to here.
                self.catch_up_to = max(self.catch_up_to, last)
                return
            self.catch_up_to = last
            break
        if not self.closed:
            await catchup.fetch(self)

    def caught_up(self) -> None:
        """The store holds (durably) what the snapshot or a 'restored' entry described:
        apply what waited for it, and count this member again."""
        self.catch_up_to = None
        if self.resetting is not None:
            self.server.log.info("JetStream cluster: stream '%s > %s' reset from the "
                                 "leader", self.acc_name, self.name)
            self.resetting = None
        stream = self.stream
        stream.lseq = stream.synced_seq = stream.store.last_seq
        stream.rebuild_state()         # the duplicate window, as the others judge it
        held, self._held = self._held, []
        if held and not self.closed:
            self.apply(held)
        self.raft.restored()
        if self._snapshot_after_catch_up and not self.closed and not self._snapshotting:
            # Restored messages are in no log entry: only a snapshot keeps them.
            self._snapshot_after_catch_up = False
            self._snapshotting = True
            self.js.spawn(self._snapshot)

    # ---- restoring a backup (snapshot.ClusterRestore) ----------------------------------------

    def awaiting_restore(self) -> bool:
        """Assigned with a backup to restore that the group's log does not say is in."""
        return bool(self.sa.get("restore")) and not self.restore_settled

    def _follow_restore(self, op: dict, index: int) -> bool:
        """The ``restored`` entry: the leader already has the messages; a follower
        fetches them from it.  True while catching up (later entries wait)."""
        self.restore_settled = True
        slot = self._waiters.get(index)
        if slot is not None:
            slot[1] = True
            slot[0].set()
        store = self.stream.store
        if store.last_seq >= op["last_seq"]:
            return False
        self._snapshot_after_catch_up = True
        # Not counted until it holds the restored messages (RaftNode.set_restoring).
        self.raft.node.set_restoring(True)
        if self.catch_up_to is None:
            self.js.spawn(self._catch_up)
        self.catch_up_to = max(self.catch_up_to or 0, op["last_seq"])
        return True

    async def restored(self, consumers: list) -> None:
        """The leader filled its store from the archive: tell the group, make it
        durable here, then have the meta leader assign the archive's consumers."""
        stream = self.stream
        store = stream.store
        stream.lseq = stream.synced_seq = store.last_seq
        stream.rebuild_state()
        try:
            await self.propose_op({"op": "restored", "last_seq": store.last_seq}, timeout=10.0)
        except NotLeader:
            raise ApiError.of("JSClusterNotAvailErr") from None
        while self._snapshotting:
            await trio.sleep(0.05)
        self._snapshotting = True
        await self._snapshot()
        if consumers:
            await self._assign_restored_consumers(consumers)
        self._restore = None
        if self.is_leader() and not self.closed:
            stream.subscribe_capture()
            stream.lead_sourcing(True)

    async def _assign_restored_consumers(self, consumers: list) -> None:
        cluster = self.cluster
        payload = {"acc": self.acc_name, "stream": self.name, "group": self.group,
                   "leader": cluster.me,
                   "consumers": [{"name": c["name"], "config": c["config"],
                                  "created": c.get("created"), "state": c["state"]}
                                 for c in consumers]}
        with trio.move_on_after(20.0):
            while not self.closed:
                if await cluster.request(b"$JSC.RESTORED", payload, 2.0) is not None:
                    break
            # ... and until they run here, so the answer counts them
            while not self.closed and any(c["name"] not in self.stream.consumers
                                          for c in consumers):
                await trio.sleep(0.05)

    def restore_failed(self) -> None:
        """The restore did not complete: the meta leader removes the stream."""
        self._restore = None
        if not self.closed:
            self.js.spawn(self._report_restore_failed)

    async def _report_restore_failed(self) -> None:
        payload = {"acc": self.acc_name, "stream": self.name, "group": self.group,
                   "failed": True}
        with trio.move_on_after(20.0):
            while not self.closed:
                if await self.cluster.request(b"$JSC.RESTORED", payload, 2.0) is not None:
                    return

    # ---- membership and lifecycle ----------------------------------------------------------

    def assignment_changed(self, sa: dict) -> None:
        self.sa = sa
        old_peers = self.peers
        self.peers = list(sa["group"]["peers"])
        if sa["cfg"] != self.stream.cfg:
            self.stream.config_for_update(sa["cfg"])
        if self.peers != old_peers:
            self.reconcile_members()

    def leader_ready(self, term: int) -> None:
        if self.awaiting_restore():
            if self._restore is None:
                self._restore = ClusterRestore(self)
                self._restore.start()
        else:
            self.stream.lead_sourcing(True)      # from what every earlier term wrote
        self.reconcile_members()
        self.js.api.unpark(self)

    def stop(self, delete: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self._scope.cancel()
        self.cluster.transport.detach(self.group)
        self.js.unsubscribe(self.server.system_account, self._cu_sub)
        if self.jsa.streams.get(self.name) is self.stream:
            del self.jsa.streams[self.name]
        self.raft.stop()
        self.stream.stop(delete=delete)
        try:
            self.raft.storage.close()
        except Exception:
            pass

    # ---- info ------------------------------------------------------------------------------

    def cluster_info(self) -> dict:
        return self.cluster.cluster_info(self)


class ReplicatedConsumer(_Replica):
    """This server's replica of a consumer of a replicated stream."""

    kind = "consumer"

    @classmethod
    def create(cls, cluster, srep: ReplicatedStream, ca: dict):
        try:
            return cls(cluster, srep, ca)
        except Exception as exc:     # a replica that cannot start never stops the server
            cluster.server.log.error("JetStream cluster: cannot start consumer '%s > %s > %s': "
                                     "%r", ca["acc"], ca["stream"], ca["name"], exc)
            return None

    def __init__(self, cluster, srep: ReplicatedStream, ca: dict):
        self.cluster = cluster
        self.js = cluster.js
        self.server = cluster.server
        self.srep = srep
        self.ca = ca
        self.name = ca["name"]
        self.group = ca["group"]["name"]
        self.peers = list(ca["group"]["peers"])
        self.closed = False
        self._scope = trio.CancelScope()
        self._answered_create = False
        self._waiters: dict[int, list] = {}
        self._since_snapshot = 0
        self._snapshotting = False
        self._active = False
        stream = srep.stream
        self.path = os.path.join(srep.path, OBS, self.name)
        os.makedirs(self.path, exist_ok=True)
        write_json_atomic(os.path.join(self.path, META),
                          {"config": ca["cfg"], "created": ca["created"], "group": ca["group"]})
        # A consumer restored from a backup starts from the state the archive had.
        state = ConsumerState.from_json(ca["state"]) if ca.get("state") else None
        self.consumer = Consumer(stream, ca["cfg"], self.name, ca["created"],
                                 ReplicaStateStore(self), state, replicated=True)
        self.consumer.replica = self
        files = DirFiles(os.path.join(self.path, "raft"))
        log = FileLog(os.path.join(self.path, "raft", "log"))
        storage = RaftStorage(log, files)
        transport, self._inbox = cluster.transport.attach(self.group)
        self.raft = RaftService(cluster.me, storage, transport, self, peers=self.peers,
                                config=RaftConfig(), fsync=self.js.fsync,
                                fsync_submit=self.js.fsync_submit)
        cluster.report_damage(repr(self), storage)
        stream.add_consumer(self.consumer)
        self.js.spawn(self._run)

    async def _run(self) -> None:
        with self._scope:
            await self.raft.run(self._inbox)

    def __repr__(self) -> str:
        return "consumer %s > %s > %s" % (self.ca["acc"], self.ca["stream"], self.name)

    def is_leader(self) -> bool:
        # The API sees a leader once it leads (leader_ready): a client that learns the
        # new leader from consumer info finds its subscriptions in place.
        return self._active and self.raft.is_leader()

    def may_deliver(self) -> bool:
        """Deliveries need a leader that is surely still the leader: one resumed after a
        pause (or cut off) would hand out messages the group's real leader already
        delivered and had acknowledged meanwhile (found by natsjs/testing/chaos)."""
        return self._active and self.raft.has_lease()

    def leader_changed(self, leader, term: int) -> None:
        if leader == self.cluster.me:
            self.server.log.info("JetStream cluster new consumer leader for '%s > %s > %s'",
                                 self.ca["acc"], self.ca["stream"], self.name)
        if self._active:
            # Leadership lost: stop delivering at once (leader_ready starts it again).
            self._active = False
            self.consumer.set_active_leader(False)

    def handing_over(self, active: bool) -> None:
        """As a stream's (ReplicatedStream.handing_over): a leader handing over stops
        taking pull requests and acks at once, so a fetch sent meanwhile hears "no
        responders" and is retried with the next leader instead of waiting out its
        expiry; if the transfer fails it takes them again.  It still answers info
        until another leads (``is_leader``: the API holds info at a replica electing)."""
        if self._active:
            self.consumer.set_active_leader(not active)

    def leader_ready(self, term: int) -> None:
        """Lead only once every entry of earlier terms is applied, so deliveries start
        from what the group acknowledged, not from this replica's last view."""
        c = self.consumer
        self._active = True
        c.set_active_leader(True)
        self.reconcile_members()
        self.js.api.unpark(self)
        if not self._answered_create and self.ca.get("reply"):
            self._answered_create = True
            resp = {"type": "io.nats.jetstream.api.v1.consumer_create_response", **c.info()}
            self.js.api.answer(self.ca["reply"].encode(), resp)
            # Created paused: said so with the answer (server/jetstream_cluster.go
            # processConsumerLeaderChange; a later leader does not repeat it).
            announce_paused(c)

    # ---- state changes through the log ----------------------------------------------------

    def propose_state(self, op: int, a: int, b: int) -> int | None:
        """An ack, term or floor move, with the ack floor it left (consumer.py records
        after moving the floor)."""
        st = self.consumer.st
        return self._propose(E_STATE + _STATE.pack(op, a, b, st.asflr, st.adflr))

    def propose_delivered(self, batch: list, st: ConsumerState) -> None:
        """What the leader delivered in one round: followers track the same pending
        messages, so a new leader redelivers what was never acknowledged."""
        parts = [E_DELIVERED, _DHEAD.pack(st.sseq, st.dseq, st.asflr, st.adflr, len(batch))]
        parts.extend(_DITEM.pack(*item) for item in batch)
        self._propose(b"".join(parts))

    def propose_reset(self, seq: int, reply: bytes) -> None:
        """A CONSUMER.RESET: every replica (the leader too) resets when the group has
        it, and the leader answers then (server/consumer.go resetSeqOp)."""
        self._propose(E_RESET + _RESET.pack(seq) + reply)

    def _propose(self, data: bytes) -> int | None:
        try:
            return self.raft.propose(data)
        except NotLeader:
            return None

    def apply(self, entries: list) -> None:
        c = self.consumer
        # While active, every entry applied is this leader's own: its state changed when
        # it proposed.  Before (catching up as leader) or as a follower, apply them.
        leading = self._active
        for index, term, data in entries:
            self._since_snapshot += 1
            if data[:1] == E_RESET:
                seq = _RESET.unpack_from(data, 1)[0]
                c.reset_to(seq)
                if leading and len(data) > 1 + _RESET.size:
                    c.answer_reset(bytes(data[1 + _RESET.size:]), seq)
            elif not leading:
                # The leader changed its state when it happened; followers follow here.
                kind = data[:1]
                if kind == E_STATE:
                    self._follow_state(c, *_STATE.unpack_from(data, 1))
                elif kind == E_DELIVERED:
                    self._follow_delivered(c, data)
            slot = self._waiters.pop(index, None)
            if slot is not None:
                # Ours only if the term is the one it was proposed in: a later leader
                # may have put its own entry at this index.
                slot[2] = term == slot[1]
                slot[0].set()
        if self._since_snapshot >= CONSUMER_SNAPSHOT_EVERY and not self._snapshotting:
            self._snapshotting = True
            self.js.spawn(self._snapshot)

    @staticmethod
    def _follow_floor(st: ConsumerState, asflr: int, adflr: int) -> None:
        if asflr > st.asflr:
            st.asflr = asflr
            for s in [s for s in st.pending if s <= asflr]:
                del st.pending[s]
                st.rdc.pop(s, None)
            st.acked_ahead = {s for s in st.acked_ahead if s > asflr}
        if adflr > st.adflr:
            st.adflr = adflr
        if st.sseq <= st.asflr:
            st.sseq = st.asflr + 1
        if st.dseq <= st.adflr:
            st.dseq = st.adflr + 1

    def _follow_state(self, c, op: int, a: int, b: int, asflr: int, adflr: int) -> None:
        st = c.st
        if op == OP_ACK:
            st.pending.pop(a, None)
            st.rdc.pop(a, None)
            if c.stream.cfg["retention"] != "limits":
                # Interest and work queues: every replica drops what is acked.
                c.stream.check_interest_retention(a)
        elif op == OP_FLOOR and c.stream.cfg["retention"] != "limits":
            for s in [s for s in st.pending if s <= a]:
                c.stream.check_interest_retention(s)
        self._follow_floor(st, asflr, adflr)

    def _follow_delivered(self, c, data: bytes) -> None:
        st = c.st
        sseq, dseq, asflr, adflr, n = _DHEAD.unpack_from(data, 1)
        now = now_ns()
        off = 1 + _DHEAD.size
        for _ in range(n):
            s, d, dc = _DITEM.unpack_from(data, off)
            off += _DITEM.size
            if s <= st.asflr:
                continue
            p = st.pending.get(s)
            if p is None:
                st.pending[s] = [d, now]
            else:
                p[1] = now
            if dc > 1:
                st.rdc[s] = dc - 1
        if sseq > st.sseq:
            st.sseq = sseq
        if dseq > st.dseq:
            st.dseq = dseq
        if c.ack_none and c.stream.cfg["retention"] != "limits" and asflr > st.asflr:
            for s in range(st.asflr + 1, asflr + 1):
                c.stream.check_interest_retention(s)
        self._follow_floor(st, asflr, adflr)

    async def _snapshot(self) -> None:
        """The consumer's whole state replaces the log entries that built it."""
        try:
            index = self.raft.applied
            state = self.consumer.st.to_json()
            await self.raft.compact(index, json.dumps(state, separators=(",", ":")).encode())
            self._since_snapshot = 0
        except Exception as exc:
            self.server.log.error("JetStream cluster: snapshot of %r failed: %r", self, exc)
        finally:
            self._snapshotting = False

    def expect(self, index: int) -> list:
        """Watch for the entry this leader just proposed at ``index``: registered at once,
        since the group may commit and apply it before anyone waits (``committed``)."""
        slot = self._waiters[index] = [trio.Event(), self.raft.term, False]
        return slot

    @staticmethod
    async def committed(slot: list, timeout: float = 5.0) -> bool:
        """Whether the entry ``expect`` watches was committed (and applied) as proposed,
        within ``timeout``."""
        with trio.move_on_after(timeout):
            await slot[0].wait()
        return slot[2]

    def restore(self, storage: RaftStorage, index: int, term: int) -> None:
        try:
            d = json.loads(storage.snapshot_bytes() or b"{}")
            if d:
                self.consumer.st = ConsumerState.from_json(d)
        except (ValueError, KeyError):
            pass

    def assignment_changed(self, ca: dict) -> None:
        old_peers = self.peers
        self.ca = ca
        self.peers = list(ca["group"]["peers"])
        if ca["cfg"] != self.consumer.cfg:
            self.consumer.update_config(ca["cfg"])
            if len(self.peers) == 1 and self.is_leader():
                # nats-server runs an R1 consumer's leader change again on each update
                # of its assignment (processClusterCreateConsumer), and with it the
                # paused advisory.
                announce_paused(self.consumer)
        if self.peers != old_peers:
            self.reconcile_members()

    def stop(self, delete: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self._scope.cancel()
        self.cluster.transport.detach(self.group)
        self.raft.stop()
        self.consumer.stop(delete=delete)
        try:
            self.raft.storage.close()
        except Exception:
            pass
        if delete:
            import shutil
            shutil.rmtree(self.path, ignore_errors=True)

    def cluster_info(self) -> dict:
        return self.cluster.cluster_info(self)


E_STATE = b"S"          # <BQQqq> op, a, b and the ack floor after it
E_DELIVERED = b"D"      # <QQqqI> next stream and delivery seq, ack floor, count; items
E_RESET = b"R"          # <Q> the sequence a CONSUMER.RESET starts at, then its reply
_STATE = struct.Struct("<BQQqq")
_RESET = struct.Struct("<Q")
_DHEAD = struct.Struct("<QQqqI")
_DITEM = struct.Struct("<QQI")     # stream seq, delivery seq, delivery count
CONSUMER_SNAPSHOT_EVERY = 4096


class ReplicaStateStore(MemConsumerStore):
    """A replicated consumer's state store: changes go to the consumer's Raft group;
    an acknowledgement that asks for a reply is answered once its entry is committed."""

    durable = True
    inline = True        # snapshot() proposes, so it runs on the event loop

    def __init__(self, rep: ReplicatedConsumer):
        self.rep = rep
        self._last = None
        self._refused = False     # a change the group did not take (we no longer lead)

    def record(self, op: int, a: int, b: int) -> None:
        index = self.rep.propose_state(op, a, b)
        if index is None:
            # Not proposed: an acknowledgement waiting on this must get no reply, or the
            # client would count as confirmed an ack the next leader never saw.
            self._refused = True
        else:
            self._last = self.rep.expect(index)

    def delivered(self, batch: list, state: ConsumerState) -> None:
        self.rep.propose_delivered(batch, state)

    def dirty(self) -> bool:
        return self._last is not None or self._refused

    async def sync(self) -> None:
        slot, refused = self._last, self._refused
        self._last, self._refused = None, False
        if refused:
            raise OSError("no longer the consumer's leader: acknowledgements not recorded")
        if slot is not None:
            if not await self.rep.committed(slot):
                raise OSError("consumer state not committed in time")

    def snapshot(self, state: ConsumerState) -> None:
        # The group's log carries every change; its own snapshots compact it.
        pass
