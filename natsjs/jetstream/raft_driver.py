"""Raft on trio: the task that drives a RaftNode over its storage and transport.

Where it sits on the clustered write path::

    RaftNode.ready() -> RaftService: hard state (atomic file) -> log append (file log) ->
    send (transport: routes, natsjs/testing/raftnet.LocalNetwork in tests) ... fsync in a
    worker thread (group commit) -> RaftNode.persisted -> commit -> StateMachine.apply

The storage (files, log, recovery) is natsjs/jetstream/raft_storage.py.  ``RaftService``
owns the timers and the tasks; every call into the node happens under one lock and the
effects of one ``ready()`` are carried out before the node sees another input, so the
node's read-only view of the log is always current.
"""
from __future__ import annotations

import collections
import random

import trio

from natsjs.jetstream.raft import (
    OP_APPEND,
    OP_SNAPSHOT_INSTALL,
    OP_SNAPSHOT_SAVE,
    OP_TRUNCATE,
    LEADER,
    RaftConfig,
    RaftNode,
)
from natsjs.jetstream.jstime import now_ns
from natsjs.jetstream.raft_storage import RaftStorage

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


__all__ = ["RaftService", "StateMachine", "hand_to"]
