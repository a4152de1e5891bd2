"""A stream: step 4 of a message's path when it lands in JetStream.

Before it: a client's PUB went through the fan-out (natsjs/_core/fanout.pyx), which
found this stream's capture subscription among the subject's matches and called
``_capture``.  Capture does not wait: it queues the message on the stream's inbox and
wakes the stream's ingest task.  The ingest task takes everything queued, runs each
message through nats-server's checks (``process``: expected-* headers, duplicates,
limits, rollups, TTLs) and appends it to the store (natsjs/_core/filelog.pyx, or the
memory log); then one fsync covers the whole batch (group commit) and only then are
the PubAcks sent and the consumers (natsjs/jetstream/consumer.py) told that there is
more to deliver.  After it: consumers read the store and deliver (step 4 again, for
their subscribers), and acknowledgements come back to them.

``process`` is the stream's state machine: it takes a message and returns the reply,
touching only the store and in-memory state.  The trio side (``_ingest_loop``) owns
the waiting, the fsync and the sending; the JetStream clustering layer will feed the
same ``process``/``apply`` from committed Raft entries.
"""
from __future__ import annotations

import collections
import errno
import heapq
import json
import os
import shutil

import trio

from natsjs._core.jsingest import StreamSink
from natsjs.jetstream import batching, counters
from natsjs.jetstream import headers as H
from natsjs.jetstream import schedules
from natsjs.jetstream import sourcing
from natsjs.jetstream.errors import ApiError, error_text
from natsjs.jetstream.jstime import now_ns, parse_rfc3339, rfc3339_nano
from natsjs.jetstream.markers import SubjectDeleteMarkers, min_ttl
from natsjs.jetstream.streamcfg import config_json, with_dynamic_metadata
from natsjs.jetstream.store import write_store_state
from natsjs.jetstream.subjects import subject_matches, valid_publish_subject
from natsjs.subject_transform import TransformError, new_transform

# A stream's inbox holds at most this much before captures are refused with an error
# reply (bounded memory; nats-server bounds its ipQueue the same way).
MAX_INBOX_MSGS = 100_000
MAX_INBOX_BYTES = 128 * 1024 * 1024
# A replicated stream's leader proposes what it captured in entries of at most this size.
MAX_ENTRY_BYTES = 1024 * 1024
# How often limits by age and per-message TTLs are looked at when nothing is due sooner.
EXPIRE_CHECK = 1.0
MAX_HDR_SIZE = 65535


def file_msg_size(subject: bytes, hdr: bytes | None, msg: bytes) -> int:
    """server/filestore.go fileStoreMsgSize: what a message counts in ``bytes``."""
    if not hdr:
        return 22 + len(subject) + len(msg) + 8
    return 22 + len(subject) + 4 + len(hdr) + len(msg) + 8


def mem_msg_size(subject: bytes, hdr: bytes | None, msg: bytes) -> int:
    """server/memstore.go memStoreMsgSize."""
    return len(subject) + len(hdr or b"") + len(msg) + 16


class StoreError(Exception):
    """A message the store refused (limits with discard new): the text is the reply's."""


class Stream:
    """One stream of an account on this server (its leader, for R1: the only copy)."""

    def __init__(self, jsa, cfg: dict, created: int, store, path: str | None):
        self.jsa = jsa
        self.js = jsa.js
        self.server = jsa.js.server
        self.cfg = cfg
        self.name = cfg["name"]
        self.created = created
        self.store = store
        self.path = path
        self.consumers: dict = {}
        self.closed = False
        self._subs: list = []
        self._direct_subs: list = []
        self._inbox: list = []
        self._inbox_bytes = 0
        self._wake = trio.lowlevel.ParkingLot()
        self._commit_wake = trio.lowlevel.ParkingLot()
        self._unsynced: list = []          # replies waiting for the next fsync
        self._dirty = False
        self._scope = trio.CancelScope()
        self._expire_wake = trio.lowlevel.ParkingLot()
        self._expire_idle = False
        self._budget = 0
        self._batch_ts = 0
        # A replica of a clustered stream (natsjs/jetstream/replicated.py), or None.
        self.replica = None
        # Plain messages go from the fan-out straight into the log (jsingest.pyx).
        self._sink = StreamSink(store, self._capture, self._sink_woke,
                                cfg["storage"] == "file")
        self._sink.replies = self._unsynced
        self._sink.inbox = self._inbox
        self._set_plain()
        # Duplicate window: msg id -> (seq, ts), oldest first.
        self._ddmap: dict[str, tuple[int, int]] = {}
        self._ddq: collections.deque = collections.deque()
        self.lmsgid = ""
        self.lseq = store.last_seq
        # Per-message TTLs: heap of (expires_ns, seq).
        self._ttls: list = []
        self.synced_seq = store.last_seq
        self.is_file = cfg["storage"] == "file"
        self.msg_size = file_msg_size if self.is_file else mem_msg_size
        self.sync_always = self.js.sync_always
        self.write_error: str | None = None
        self.sourcing = None        # the mirror or sources (sourcing.py), while running
        self.batches = None         # open atomic batches (batching.py), once there are any
        self._pub_ack_prefix = self._make_pub_ack_prefix()
        self._make_transforms()
        self._sdm = None
        self._make_markers()
        self.schedules = None
        self._make_schedules()

    # ---- lifecycle -----------------------------------------------------------------------

    def _make_pub_ack_prefix(self) -> bytes:
        domain = self.js.domain
        if domain:
            return b'{"stream":%s,"domain":%s,"seq":' % (
                json.dumps(self.name).encode(), json.dumps(domain).encode())
        return b'{"stream":%s,"seq":' % json.dumps(self.name).encode()

    def _make_markers(self) -> None:
        """subject_delete_marker_ttl: expiry leaves markers (markers.py)."""
        on = self.cfg["subject_delete_marker_ttl"] > 0
        if on and self._sdm is None:
            self._sdm = SubjectDeleteMarkers(self)
        elif not on:
            self._sdm = None

    def _make_schedules(self) -> None:
        """allow_msg_schedules: the stream fires its schedules (schedules.py)."""
        cur = self.schedules
        self.schedules = schedules.MsgSchedules.for_stream(self, cur)
        nursery = getattr(self, "_nursery", None)
        if self.schedules is not None and cur is None and nursery is not None:
            self.schedules.rebuild()
            nursery.start_soon(self.schedules.run)

    def _make_transforms(self) -> None:
        """The stream's subject transform (applied to every message it takes in) and
        the republish mapping, parsed once (checked when the configuration was)."""
        tr = self.cfg["subject_transform"]
        self._itr = new_transform(tr.get("src", ""), tr.get("dest", "")) if tr else None
        rp = self.cfg["republish"]
        self._rptr = new_transform(rp.get("src") or ">", rp.get("dest") or "") if rp else None

    def start(self, nursery: trio.Nursery) -> None:
        self._set_plain()
        self.rebuild_state()
        if self.replica is None:
            self._subscribe()
        else:
            self._update_direct()      # the capture is the leader's (replicated.py)
        # A replicated stream's mirror or sources run on its leader (lead_sourcing).
        self.sourcing = sourcing.for_stream(self) if self.replica is None else None
        nursery.start_soon(self._run)

    def lead_sourcing(self, on: bool) -> None:
        """A replicated stream's leader takes its mirror or sources from where the
        stream stands; a replica that stops leading lets them go."""
        if on and self.sourcing is None and not self.closed:
            self.sourcing = sourcing.for_stream(self)
            nursery = getattr(self, "_nursery", None)
            if self.sourcing is not None and nursery is not None:
                nursery.start_soon(self.sourcing.run)
        elif not on and self.sourcing is not None:
            self.sourcing.stop()
            self.sourcing = None

    async def _run(self) -> None:
        with self._scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._ingest_loop)
                if self.replica is None:
                    nursery.start_soon(self._commit_loop)
                nursery.start_soon(self._expire_loop)
                if self.is_file and not self.sync_always:
                    nursery.start_soon(self._lazy_sync_loop)
                for c in list(self.consumers.values()):
                    c.start(nursery)
                if self.sourcing is not None:
                    nursery.start_soon(self.sourcing.run)
                if self.schedules is not None:
                    nursery.start_soon(self.schedules.run)
                self._nursery = nursery
                await trio.sleep_forever()

    def add_consumer(self, consumer) -> None:
        self.consumers[consumer.name] = consumer
        nursery = getattr(self, "_nursery", None)
        if nursery is not None:
            consumer.start(nursery)

    def _subscribe(self) -> None:
        acc = self.jsa.account
        if self.cfg["mirror"] is None:
            self._subs = self.js.subscribe_all(acc, self.cfg["subjects"] or [], self._sink)
        self._update_direct()

    def _update_direct(self) -> None:
        acc = self.jsa.account
        want = self.cfg["allow_direct"]
        if want and not self._direct_subs:
            # A queue group, as nats-server does, so that one replica answers.
            base = b"$JS.API.DIRECT.GET." + self.name.encode()
            self._direct_subs = [
                self.js.subscribe(acc, base, self.on_direct_get, queue=b"_sys_"),
                self.js.subscribe(acc, base + b".>", self.on_direct_get_last, queue=b"_sys_")]
        elif not want and self._direct_subs:
            for sub in self._direct_subs:
                self.js.unsubscribe(acc, sub)
            self._direct_subs = []

    def subscribe_capture(self) -> None:
        """A replica that became its stream's leader starts taking publishes: the
        stream's subjects feed its capture (a mirror takes none).  Idempotent; does
        nothing once the stream is stopped."""
        if not self._subs and not self.closed and self.cfg["mirror"] is None:
            self._subs = self.js.subscribe_all(self.jsa.account, self.cfg["subjects"] or [],
                                               self._sink)

    def unsubscribe_capture(self) -> None:
        """A replica no longer leading stops taking publishes at once: its subjects'
        interest goes (a publisher hears "no responders" from this server) and what was
        captured but not yet proposed is dropped (its publishers time out and retry).
        Idempotent."""
        self.js.unsubscribe_all(self.jsa.account, self._subs)
        self._subs = []
        self._inbox = self._sink.inbox = []
        self._sink.clear_batch()

    def _unsubscribe(self) -> None:
        self.js.unsubscribe_all(self.jsa.account, self._subs + self._direct_subs)
        self._subs = []
        self._direct_subs = []

    def stop(self, delete: bool = False) -> None:
        """Stop taking messages, stop the consumers, close (and with ``delete`` remove)."""
        if self.closed:
            return
        self.closed = True
        self._sink.plain = False
        if self.batches is not None:
            self.batches.clear()
        self._unsubscribe()
        if self.sourcing is not None:
            self.sourcing.stop()
        for c in list(self.consumers.values()):
            c.stop(delete=delete, from_stream=True)
        for _, reply, _, _ in self._inbox:
            if reply and reply.__class__ is bytes and not self.cfg["no_ack"]:
                self._respond_error(reply, ApiError.of("JSStreamNotFoundErr"))
        self._inbox = []
        self._scope.cancel()
        try:
            self.store.close()
            if self.path and self.is_file and self.replica is None and not delete:
                # How far the stream had come, for a recovery that finds blocks missing.
                write_store_state(self.path, self.store)
        except OSError as exc:
            self.server.log.error("JetStream error closing stream '%s > %s': %s",
                                  self.jsa.name, self.name, exc)
        if delete and self.path:
            shutil.rmtree(self.path, ignore_errors=True)

    def rebuild_state(self) -> None:
        """After recovery, and whenever the store was filled other than message by
        message (a replica's catch-up, a restore): the duplicate window and the TTL
        schedule are read again from what the store holds, so duplicates are then
        judged as by any other replica holding the same messages."""
        store = self.store
        if self.schedules is not None:
            self.schedules.rebuild()
        window = self.cfg["duplicate_window"]
        now = now_ns()
        has_ttl = self.cfg["allow_msg_ttl"]
        if not (window or has_ttl) or store.msgs == 0:
            return
        seq = store.first_seq
        while True:
            rec = store.load_next(seq)
            if rec is None:
                break
            seq, subject, hdr, msg, ts = rec
            if hdr:
                mid = H.get(hdr, H.MSG_ID)
                if mid and window and ts > now - window:
                    self._store_msg_id(mid.decode("utf-8", "replace"), seq, ts)
                    self.lmsgid = mid.decode("utf-8", "replace")
                if has_ttl:
                    ttl = _ttl_seconds(hdr)
                    if ttl > 0:
                        heapq.heappush(self._ttls, (ts + ttl * 1_000_000_000, seq))
            seq += 1

    # ---- capture (inside the publisher's fan-out: no waiting here) -----------------------

    def _sink_woke(self) -> None:
        """The C capture took a message while idle: a replica's leader proposes it
        (ingest), a stream of its own makes it durable (commit)."""
        if self.replica is not None:
            self._wake.unpark()
        else:
            self._commit_wake.unpark()

    def _capture(self, sub, subject, reply, hdr, msg) -> None:
        if hdr is not None and hdr > 0:
            h, payload = msg[:hdr], msg[hdr:]
        else:
            h, payload = None, msg
        if len(self._inbox) >= MAX_INBOX_MSGS or \
                self._inbox_bytes + self._sink.batch_bytes >= MAX_INBOX_BYTES:
            if reply and not self.cfg["no_ack"]:
                self._respond_error(reply, ApiError.of("JSStreamTooManyRequests"))
            return
        self._inbox.append((subject, reply, h, payload))
        self._inbox_bytes += len(msg)
        if len(self._inbox) == 1:
            self._wake.unpark()

    def enqueue(self, subject: bytes, reply, hdr: bytes | None, msg: bytes) -> None:
        """A message from server code.  ``reply`` may be a handler instead of a reply
        subject: mirrors and sources (natsjs/jetstream/sourcing.py) queue what their
        origins deliver that way, so that it is processed in order with everything
        else, inside the same batch and fsync."""
        self._inbox.append((subject, reply, hdr, msg))
        self._inbox_bytes += len(msg)
        if len(self._inbox) == 1:
            self._wake.unpark()

    # ---- ingest and commit: process batches, fsync in groups, then acknowledge ---------
    #
    # Two tasks.  The ingest task runs every queued message through ``process`` (which
    # appends to the store's buffer) and leaves the replies with the commit task.  The
    # commit task makes everything appended so far durable with one fsync and then
    # sends the replies that fsync covers; messages that arrive meanwhile are processed
    # at once and go with the next fsync.  So the disk and the CPU work at the same time,
    # and no reply leaves before its message is on disk.

    async def _ingest_loop(self) -> None:
        sink = self._sink
        while True:
            if not self._inbox and not (self.replica is not None and sink.batch_bytes):
                if self.replica is not None:
                    sink.dirty = False
                await self._wake.park()
                continue
            if self.replica is not None:
                # Clustered: what was captured goes to the stream's Raft group, the C
                # capture's batch first (it holds the earlier messages); every replica
                # processes it when it is committed (replicated.py).
                sink.dirty = False
                while True:
                    data, replies = sink.take(MAX_ENTRY_BYTES)
                    if data is None:
                        break
                    self.replica.propose_records(data, replies)
                batch = self._inbox
                self._inbox = sink.inbox = []
                self._inbox_bytes = 0
                self._batch_ts = now_ns()
                if batch:
                    self.replica.propose_batch(batch)
                self.replica.raft.kick()
                await trio.lowlevel.checkpoint()
                continue
            batch = self._inbox
            self._inbox = self._sink.inbox = []
            self._inbox_bytes = 0
            self._budget = self.jsa.storage_budget(self)
            self._batch_ts = now_ns()
            replies = self._unsynced
            for subject, reply, hdr, msg in batch:
                try:
                    if reply is not None and reply.__class__ is not bytes:
                        # From a mirror or source: its handler stores it (sourcing.py).
                        reply(subject, hdr, msg)
                        continue
                    out = self.process(subject, reply, hdr, msg)
                except Exception as exc:   # a bug must cost one message, not the stream
                    self.server.log.error("JetStream error processing message on '%s > %s': "
                                          "%r", self.jsa.name, self.name, exc)
                    if reply is not None and reply.__class__ is not bytes:
                        continue    # a handler's message: nobody to answer
                    out = self._error_reply(ApiError.of("JSStreamStoreFailedF",
                                                        err=error_text(exc)))
                if reply and out is not None:
                    replies.append((reply, out))
            self._dirty = True
            self._commit_wake.unpark()
            await trio.lowlevel.checkpoint()

    async def _commit_loop(self) -> None:
        store = self.store
        sink = self._sink
        sink.budget = self.jsa.storage_budget(self)
        while True:
            if self.closed:
                # Stopped after waking this task and before it ran (a stream that
                # captured its own delete request): the store is closed already.
                return
            if not self._dirty and not sink.dirty:
                await self._commit_wake.park()
                continue
            self._dirty = sink.dirty = False
            replies = self._unsynced
            self._unsynced = sink.replies = []
            # One fsync for everything appended so far (free when nothing is new).
            if not await self._sync():
                # Whatever was not durable is gone from the store again, including what
                # was processed while this fsync ran: all of it is refused.
                err = self._error_reply(ApiError.of(
                    "JSStreamStoreFailedF", err=self.write_error or "write failed"))
                replies = [(r, err) for r, _ in replies + self._unsynced]
                self._unsynced = sink.replies = []
            self.send_replies(replies, signal=True)
            sink.budget = self.jsa.storage_budget(self)
            if self._expire_idle and self.cfg["max_age"] and store.msgs:
                self._expire_idle = False
                self._expire_wake.unpark()

    async def _sync(self) -> bool:
        """Make everything appended durable; False on failure, after which what was
        not yet durable is gone from the store again."""
        store = self.store
        if not self.is_file or not self.sync_always:
            self.synced_seq = store.last_seq
            return True
        try:
            s = store.begin_sync()
            await self.js.fsync(s)
        except OSError as exc:
            self.write_error = os.strerror(exc.errno) if exc.errno else str(exc)
            self.server.log.error("JetStream failed to store a msg on stream '%s > %s': %s",
                                  self.jsa.name, self.name, exc)
            self._discard_unsynced()
            if exc.errno == errno.ENOSPC:
                self.js.out_of_storage(self)
            return False
        store.mark_synced(s)
        self.synced_seq = max(self.synced_seq, s.seq)
        self.write_error = None
        return True

    def _discard_unsynced(self) -> None:
        """Forget every message no fsync covered, in memory and on disk: each is
        answered with an error, so none may be there after a restart (a client that
        retries would find it twice).  FileLog.discard_unsynced cuts the block files
        back to their durable length; a TRUNC record would need the space that just
        ran out."""
        try:
            n = self.store.discard_unsynced()
        except Exception as exc:   # the disk refuses even a truncation
            self.server.log.error("JetStream could not roll back stream '%s > %s': %r",
                                  self.jsa.name, self.name, exc)
        else:
            if n:
                self.server.log.warn("JetStream stream '%s > %s': %d messages not stored "
                                     "(answered with an error)", self.jsa.name, self.name, n)
        self.lseq = self.synced_seq = self.store.last_seq
        for mid, (seq_, _) in list(self._ddmap.items()):
            if seq_ > self.lseq:
                del self._ddmap[mid]

    async def _lazy_sync_loop(self) -> None:
        """``sync_interval: <d>``: nats-server's behaviour, fsync in the background."""
        while True:
            await trio.sleep(self.js.sync_interval)
            try:
                s = self.store.begin_sync()
                await self.js.fsync(s)
                self.store.mark_synced(s)
            except OSError as exc:
                self.server.log.error("JetStream background sync of '%s > %s' failed: %s",
                                      self.jsa.name, self.name, exc)

    def send_replies(self, replies: list, signal: bool = False) -> None:
        """Send a batch's answers: ``replies`` holds ``(reply subject, answer)`` pairs,
        the answer being a PubAck or error body (bytes) or a stored sequence (int, whose
        PubAck is formatted in C).  Through one publisher: each connection is written
        once for the whole batch.

        With ``signal`` the consumers are signalled, and deliver what they can, before
        the connections are written: a PubAck and the deliveries of its message reach
        a client in one write, as nats-server queues both on the stream's one outq
        (nats.py counts a subscription's pending messages per read: a delivery that
        came with the next PubAck would make two at once, a slow consumer)."""
        if not replies:
            if signal:
                self.signal_consumers()
            return
        pub = self.js.publisher(self.jsa.account)
        try:
            # an int is a sequence from the C capture: its PubAck is formatted in C
            pub.core.publish_replies(replies, self._pub_ack_prefix)
            if signal:
                self.signal_consumers()
        finally:
            pub.done()

    def signal_consumers(self) -> None:
        """New messages (or removals) are in the store: every consumer looks again at
        what it can deliver."""
        for c in self.consumers.values():
            c.signal()

    # ---- what a replica's apply sets (natsjs/jetstream/replicated.py) ----------------------

    def lift_budget(self) -> None:
        """The messages that follow were committed by the stream's group: the account's
        storage budget (which differs from server to server) refuses none of them, so
        every replica stores alike.  Holds until the next local batch sets it again."""
        self._budget = 1 << 62

    def set_batch_time(self, ts: int) -> None:
        """The time (ns) messages without one of their own are stored with, until the
        next batch: a replica passes each committed entry's time."""
        self._batch_ts = ts

    def batch_time(self) -> int:
        """The time (ns) of the batch being taken in (one clock read per batch)."""
        return self._batch_ts

    @property
    def plain(self) -> bool:
        """A message without headers needs nothing but an append (no limits, seal,
        interest, republish or transform): it may go straight into the store."""
        return self._plain

    def forget_gone_markers(self) -> None:
        """Stop guarding subject delete markers whose expired message is gone."""
        if self._sdm is not None:
            self._sdm.forget_gone()

    # ---- the state machine -----------------------------------------------------------------

    def _error_reply(self, err: ApiError) -> bytes:
        return json.dumps({"error": err.to_dict(), "stream": self.name, "seq": 0},
                          separators=(",", ":")).encode()

    def _respond_error(self, reply: bytes, err: ApiError) -> None:
        self.server.deliver(self.jsa.account, reply, None, self._error_reply(err))

    def process(self, subject: bytes, reply: bytes | None, hdr: bytes | None, msg: bytes,
                ts: int = 0) -> bytes | None:
        """Store one message if nats-server's checks allow it; the PubAck (or None)."""
        cfg = self.cfg
        respond = bool(reply) and not cfg["no_ack"]
        if hdr is not None and batching.BATCH_ID in hdr and self.replica is None and \
                batching.batch_id(hdr) is not None:
            out = batching.publish(self, subject, hdr, msg)
        else:
            out = self._process(subject, hdr, msg, ts)
        if isinstance(out, ApiError):
            return self._error_reply(out) if respond else None
        return out if respond else None

    def process_sourced(self, subject: bytes, hdr: bytes | None, msg: bytes, ts: int = 0,
                        mirror_seq: int = 0):
        """A message a mirror or source took from its origin (natsjs/jetstream/sourcing.py):
        the PubAck it would have had, or the ApiError.  ``mirror_seq`` stores it at the
        origin's sequence (a mirror keeps them; what the origin no longer has is a gap)."""
        return self._process(subject, hdr, msg, ts, True, mirror_seq)

    def write_sourced(self, subject: bytes, hdr: bytes | None, msg: bytes, ts: int = 0,
                      mirror_seq: int = 0):
        """What the stream writes itself (mirrors, sources, subject delete markers):
        stored now, or on a replicated stream's leader proposed to its group and stored
        by every replica when committed (then None: the outcome is the replicas')."""
        if self.replica is None:
            return self.process_sourced(subject, hdr, msg, ts, mirror_seq)
        self.replica.propose_sourced(subject, hdr, msg, ts, mirror_seq)
        return None

    def _set_plain(self) -> None:
        self._plain = self._plain_config()
        # A replica's messages go through its Raft group, never straight to the store.
        self._sink.plain = self._plain and not self.closed and self.replica is None
        # Atomic batches are staged by the leader's Python path (batching.py).
        self._sink.batching = self.replica is not None and not self.closed and \
            not self.cfg["allow_atomic"]
        self._sink.max_batch = MAX_INBOX_BYTES
        self._sink.no_ack = self.cfg["no_ack"]

    def _plain_config(self) -> bool:
        """True when a message without headers needs nothing but an append: no limits,
        no seal, no interest tracking, no republish, no subject transform (the common
        stream)."""
        c = self.cfg
        return (not c["sealed"] and c["retention"] == "limits" and c["max_msg_size"] < 0
                and c["max_msgs"] <= 0 and c["max_bytes"] <= 0
                and c["max_msgs_per_subject"] <= 0 and not c["republish"]
                and not c["subject_transform"] and not c["allow_msg_counter"])

    def _process(self, subject: bytes, hdr: bytes | None, msg: bytes, ts: int,
                 sourced: bool = False, mirror_seq: int = 0):
        if self._sink.captured:
            # The C capture appended plain messages since: they are the last ones.
            self._sink.captured = 0
            self.lseq = self.store.last_seq
            self.lmsgid = ""
        if hdr is None and self._plain and not mirror_seq:
            # The fast path: the checks below would all pass.
            size = self.msg_size(subject, None, msg)
            if size <= self._budget:
                self._budget -= size
                seq = self.store.append(subject, None, msg, ts or self._batch_ts)
                self.lseq = seq
                self.lmsgid = ""
                return self._pub_ack_prefix + b"%d}" % seq
        cfg = self.cfg
        store = self.store
        if self._itr is not None:
            # server/stream.go: the input transform comes before every other check.
            subject = self._itr.apply(subject.decode()).encode()
        if cfg["sealed"]:
            return ApiError.of("JSStreamSealedErr")
        if mirror_seq and mirror_seq <= store.last_seq:
            return ApiError.of("JSStreamSequenceNotMatchErr")
        if self.write_error is not None and self.is_file:
            # Try again: space may have come back.
            self.write_error = None
        msg_id = ""
        rollup = None
        ttl = 0
        incr = None
        if hdr:
            if not hdr.startswith(b"NATS/1.0"):
                hdr = None
            elif len(hdr) > 12 and hdr[8:9] == b" ":
                # A status line (a message relayed with one) is not stored.
                hdr = H.HDR_LINE + hdr[hdr.find(H.CRLF) + 2:]
        if hdr and cfg["allow_msg_counter"] and not sourced:
            # An increment and no other header: none of the checks below applies.
            incr = counters.only_incr(hdr)
            if incr is not None and msg:
                return ApiError.of("JSMessageIncrPayloadErr")
        # A batch's messages carry only the batch's own headers: nothing below reads them.
        if incr is None and hdr and b"Nats-" in hdr and \
                not H.nats_keys_all_of(hdr, batching.BATCH_KEYS):
            if counters.INCR in hdr:
                incr = counters.check_incr(cfg, hdr, msg, sourced)
                if incr.__class__ is ApiError:
                    return incr
            if incr is None and cfg["allow_msg_counter"] and self.replica is not None:
                hdr = counters.clustered_missing(hdr)
            name = H.get(hdr, H.EXPECTED_STREAM)
            if name and name.decode("utf-8", "replace") != self.name:
                return ApiError.of("JSStreamNotMatchErr")
            raw_ttl = H.get(hdr, H.MSG_TTL)
            if raw_ttl and sourced:
                # The origin checked it; kept as it is, honoured only if we allow TTLs.
                ttl = (H.parse_ttl(raw_ttl) or 0) if cfg["allow_msg_ttl"] else 0
            elif raw_ttl:
                ttl = H.parse_ttl(raw_ttl)
                if ttl is None:
                    if not cfg["allow_msg_ttl"]:
                        return ApiError.of("JSMessageTTLDisabledErr")
                    return ApiError.of("JSMessageTTLInvalidErr")
                if ttl != 0 and not cfg["allow_msg_ttl"]:
                    return ApiError.of("JSMessageTTLDisabledErr")
            exp = H.get(hdr, H.EXPECTED_LAST_SUBJ_SEQ)
            if exp is not None:
                want = _parse_uint(exp)
                seq_subj = H.get(hdr, H.EXPECTED_LAST_SUBJ_SEQ_SUBJ) or subject
                last = store.load_last(seq_subj)
                have = last[0] if last is not None else 0
                if want is None or have != want:
                    return ApiError.of("JSStreamWrongLastSequenceErrF", seq=have)
            elif H.get(hdr, H.EXPECTED_LAST_SUBJ_SEQ_SUBJ):
                return ApiError.of("JSStreamExpectedLastSeqPerSubjectInvalid")
            exp = H.get(hdr, H.EXPECTED_LAST_SEQ)
            if exp is not None:
                want = _parse_uint(exp)
                if want is None or want != self.lseq:
                    return ApiError.of("JSStreamWrongLastSequenceErrF", seq=self.lseq)
            if not sourced and schedules.has_headers(hdr):
                hdr = schedules.check(cfg, store, subject, hdr)
                if hdr.__class__ is ApiError:
                    return hdr
            if not sourced and H.get(hdr, H.STREAM_SOURCE):
                return ApiError.of("JSMessageSourceHdrNotAllowedErr")
            mid = H.get(hdr, H.MSG_ID)
            if mid:
                msg_id = mid.decode("utf-8", "replace")
                # A mirror cannot deduplicate on its own: the origin did.
                dd = self._check_msg_id(msg_id, ts) if not mirror_seq else None
                if dd is not None:
                    return self._pub_ack_prefix + b"%d,\"duplicate\": true}" % dd
            exp = H.get(hdr, H.EXPECTED_LAST_MSG_ID)
            if exp is not None and exp.decode("utf-8", "replace") != self.lmsgid:
                return ApiError.of("JSStreamWrongLastMsgIDErrF", id=self.lmsgid)
            # server/stream.go getRollup: an empty value is none, the case is ignored.
            r = H.get(hdr, H.ROLLUP) or None
            if r is not None and sourced and not (cfg["allow_rollup_hdrs"] and
                                                  not cfg["deny_purge"]):
                r = None    # the origin's rollup is ours only if we allow rollups
            if r is not None:
                if not (cfg["allow_rollup_hdrs"] and not cfg["deny_purge"]):
                    return ApiError.of("JSStreamRollupFailedF", err="rollup not permitted")
                r = r.decode("utf-8", "replace").lower()
                if r == "sub":
                    rollup = "sub"
                elif r == "all":
                    rollup = "all"
                else:
                    return ApiError.of("JSStreamRollupFailedF",
                                       err="rollup value invalid: %s"
                                       % json.dumps(r, ensure_ascii=False))
        total = None
        if cfg["allow_msg_counter"]:
            out = counters.apply(store, subject, hdr, msg, incr, self.server.opts.max_payload)
            if out.__class__ is ApiError:
                return out
            hdr, msg, total = out
        if ttl > 0 and self._sdm is not None:
            ttl, hdr = min_ttl(cfg, ttl, hdr)
        max_size = cfg["max_msg_size"]
        hlen = len(hdr) if hdr else 0
        if max_size >= 0 and (hlen > max_size or len(msg) > max_size - hlen):
            return ApiError.of("JSStreamMessageExceedsMaximumErr")
        if hlen > MAX_HDR_SIZE:
            return ApiError.of("JSStreamHeaderExceedsMaximumErr")
        size = self.msg_size(subject, hdr, msg)
        if size > self._budget:
            err = self.jsa.check_storage(self, size)
            if err is not None:
                return err
        self._budget -= size
        if not ts:
            # One clock read per batch: stored times stay in sequence order.
            ts = self._batch_ts
        if cfg["retention"] == "interest" and not self._has_interest(subject):
            # Nobody would ever consume it: the sequence is used, nothing is kept
            # (server/stream.go noInterest -> SkipMsg).
            seq = mirror_seq or store.last_seq + 1
            store.append(subject, hdr, msg, ts, seq)
            store.remove(seq)
            self._stored(seq, msg_id, ts)
            if rollup:
                self._rollup(subject, rollup, keep=0)
            return self._pub_ack_prefix + b"%d}" % seq
        try:
            self._discard_new_check(subject, hdr, msg, size)
        except StoreError as exc:
            return ApiError.of("JSStreamStoreFailedF", err=str(exc))
        seq = store.append(subject, hdr, msg, ts, mirror_seq)
        self._stored(seq, msg_id, ts)
        if rollup:
            self._rollup(subject, rollup, keep=1)
        if self.schedules is not None and hdr and self.schedules.stored(seq, subject, hdr, ts):
            self.purge(subject=H.get(hdr, schedules.SCHEDULER).decode())
        self._enforce_limits(subject)
        if ttl > 0:
            heapq.heappush(self._ttls, (ts + ttl * 1_000_000_000, seq))
            self._expire_wake.unpark()
        rp = self._rptr
        if rp is not None:
            self._republish(rp, subject, hdr, msg, seq, ts)
        if total is not None:
            return self._pub_ack_prefix + counters.pub_ack_tail(seq, total)
        return self._pub_ack_prefix + b"%d}" % seq

    def _stored(self, seq: int, msg_id: str, ts: int) -> None:
        self.lseq = seq
        self.lmsgid = msg_id
        if msg_id:
            self._store_msg_id(msg_id, seq, ts)

    # ---- duplicates ---------------------------------------------------------------------

    def _store_msg_id(self, msg_id: str, seq: int, ts: int) -> None:
        self._ddmap[msg_id] = (seq, ts)
        self._ddq.append((msg_id, ts))

    def _check_msg_id(self, msg_id: str, now: int = 0) -> int | None:
        """The sequence a message id was stored at within the duplicate window.  A
        replicated stream passes the entry's time, so every replica decides alike."""
        window = self.cfg["duplicate_window"]
        if not window:
            return None
        cutoff = (now or now_ns()) - window
        q = self._ddq
        while q and q[0][1] < cutoff:
            old, ts = q.popleft()
            entry = self._ddmap.get(old)
            if entry is not None and entry[1] == ts:
                del self._ddmap[old]
        entry = self._ddmap.get(msg_id)
        return entry[0] if entry is not None else None

    # ---- limits ---------------------------------------------------------------------------

    def _discard_new_check(self, subject, hdr, msg, size) -> None:
        """server/filestore.go storeRawMsg: what discard new refuses."""
        cfg = self.cfg
        if cfg["discard"] != "new":
            return
        store = self.store
        mmp = cfg["max_msgs_per_subject"]
        at_subject_limit = False
        first_of_subject = 0
        if mmp > 0:
            count, first_of_subject, _ = store.subject_state(subject)
            if count + 1 > mmp:
                if cfg["discard_new_per_subject"] and not (hdr and H.get(hdr, H.ROLLUP)):
                    raise StoreError("maximum messages per subject exceeded")
                at_subject_limit = True
        if cfg["max_msgs"] > 0 and store.msgs >= cfg["max_msgs"] and not at_subject_limit:
            raise StoreError("maximum messages exceeded")
        if cfg["max_bytes"] > 0 and store.bytes + size > cfg["max_bytes"]:
            if not at_subject_limit or self._size_of(first_of_subject) < size:
                raise StoreError("maximum bytes exceeded")

    def _size_of(self, seq: int) -> int:
        rec = self.store.load(seq) if seq else None
        return self.msg_size(rec[0], rec[1], rec[2]) if rec else 0

    def _enforce_limits(self, subject: bytes) -> None:
        cfg = self.cfg
        store = self.store
        mmp = cfg["max_msgs_per_subject"]
        if mmp > 0:
            count, first, _ = store.subject_state(subject)
            while count > mmp and first:
                self._remove_for_limits(first)
                count, first, _ = store.subject_state(subject)
        if cfg["discard"] == "old":
            mm = cfg["max_msgs"]
            if mm > 0:
                while store.msgs > mm:
                    self._remove_for_limits(store.first_seq)
            mb = cfg["max_bytes"]
            if mb > 0:
                while store.bytes > mb and store.msgs:
                    self._remove_for_limits(store.first_seq)

    def _remove_for_limits(self, seq: int) -> None:
        if not self.store.remove(seq):
            rec = self.store.load_next(seq)
            if rec is None or not self.store.remove(rec[0]):
                return
            seq = rec[0]
        self.message_gone(seq)

    def message_gone(self, seq: int) -> None:
        """One message left the store: consumers waiting for its acknowledgement hear of
        it (server/stream.go storeUpdates -> decStreamPending)."""
        for c in self.consumers.values():
            st = c.st
            if seq in st.pending or seq in st.rdc:
                c.message_removed(seq)

    def _messages_gone_below(self, first: int) -> None:
        """Many left from the front (age): the same for each one a consumer waits for."""
        for c in list(self.consumers.values()):
            st = c.st
            for seq in sorted(s for s in st.pending if s < first):
                c.message_removed(seq)

    def _rollup(self, subject: bytes, kind: str, keep: int) -> None:
        if kind == "sub":
            self.purge(subject=subject.decode("utf-8", "replace"), keep=keep)
        else:
            self.purge(keep=keep)

    def _has_interest(self, subject: bytes) -> bool:
        s = subject.decode("utf-8", "replace")
        return any(c.wants(s) for c in self.consumers.values())

    # ---- expiry: max_age and per-message TTLs ---------------------------------------------

    async def _expire_loop(self) -> None:
        while True:
            delay = self._expire_now()
            self._expire_idle = delay >= EXPIRE_CHECK * 10
            with trio.move_on_after(delay):
                await self._expire_wake.park()

    def _expire_now(self) -> float:
        """Remove what is too old; seconds until the next check."""
        now = now_ns()
        next_due = None
        max_age = self.cfg["max_age"]
        store = self.store
        removed = False
        sdm = self._sdm
        if max_age and store.msgs:
            if sdm is not None:
                removed = sdm.expire_by_age(now - max_age)
            else:
                n = store.expire(now - max_age)
                removed = removed or n > 0
                if n:
                    self._messages_gone_below(store.first_seq if store.msgs else
                                              store.last_seq + 1)
            first = store.load(store.first_seq) if store.msgs else None
            if first is not None:
                next_due = first[3] + max_age
        ttls = self._ttls
        while ttls and ttls[0][0] <= now:
            _, seq = heapq.heappop(ttls)
            if sdm is not None:
                removed = sdm.expire(seq) or removed
            elif store.remove(seq):
                removed = True
                self.message_gone(seq)
        if ttls:
            next_due = ttls[0][0] if next_due is None else min(next_due, ttls[0][0])
        if removed:
            self.jsa.note_usage()
            for c in self.consumers.values():
                c.stream_changed()
        if next_due is None:
            return EXPIRE_CHECK * 10
        # Markers proposed are on their way through the inbox: no need to spin.
        least = 0.05 if sdm is not None and sdm.waiting() else 0.001
        return min(max((next_due - now) / 1e9, least), EXPIRE_CHECK * 10)

    # ---- republish ------------------------------------------------------------------------

    def _republish(self, tr, subject: bytes, hdr, msg, seq: int, ts: int) -> None:
        try:
            dest = tr.match(subject.decode("utf-8", "replace"))
        except TransformError:
            return
        if not valid_publish_subject(dest):
            self.server.log.warn("Stream '%s > %s' suppressing republish with invalid subject "
                                 "%r", self.jsa.name, self.name, dest)
            return
        last = self.store.load_prev(seq - 1, subject)
        pairs = [(H.STREAM, self.name.encode()), (H.SUBJECT, subject),
                 (H.SEQUENCE, b"%d" % seq), (H.TIME_STAMP, rfc3339_nano(ts).encode()),
                 (H.LAST_SEQUENCE, b"%d" % (last[0] if last else 0))]
        if self.cfg["republish"].get("headers_only"):
            pairs.append((H.MSG_SIZE, b"%d" % len(msg)))
            body = b""
        else:
            body = msg
        new_hdr = hdr or H.HDR_LINE + H.CRLF
        for k, v in pairs:
            new_hdr = H.add(new_hdr, k, v)
        out = new_hdr + body
        self.server.deliver(self.jsa.account, dest.encode(), None, out, len(new_hdr))

    # ---- operations from the API ---------------------------------------------------------

    def purge(self, subject: str = "", seq: int = 0, keep: int = 0) -> int:
        if self.cfg["sealed"]:
            raise ApiError.of("JSStreamPurgeFailedF", err="sealed stream")
        store = self.store
        waited = set()
        for c in self.consumers.values():
            waited.update(s for s in c.st.pending if store.load(s) is not None)
        n = store.purge(subject.encode() if subject else None, seq, keep)
        first, last = store.first_seq, store.last_seq
        if n == 1:
            # One message purged is one message removed (the reference's stores report
            # it that way): whoever waited for it has it terminated.
            for s in waited:
                if store.load(s) is None:
                    self.message_gone(s)
        if last > self.lseq:
            self.lseq = last
        fseq = first
        if subject:
            # Consumers within the purged subject go on from what is left of it.
            rec = store.load_next(first, subject.encode())
            fseq = rec[0] if rec is not None else 0
        for c in list(self.consumers.values()):
            scope = c.purge_scope(subject) if subject else "all"
            if scope == "all":
                c.purged(fseq, last)
            elif scope == "wider":
                c.purged(first, last, wider=True)
            else:
                c.stream_changed()
        self.jsa.note_usage()
        return n

    def delete_refusal(self, seq: int):
        """The store error a message delete of ``seq`` answers with (an ApiError), or
        None when it either removes the message or finds it already gone.  nats-server's
        file store refuses sequence 0 and anything outside first..last
        (server/filestore.go removeMsg: ErrStoreMsgNotFound, ErrStoreEOF past the end);
        its memory store only ever says "not found"."""
        if self.cfg["storage"] == "memory":
            return None
        store = self.store
        if seq and store.msgs and store.first_seq <= seq <= store.last_seq:
            return None
        return ApiError.of("JSStreamMsgDeleteFailedF", err="stream store EOF"
                           if seq > store.last_seq else "no message found")

    def delete_msg(self, seq: int, erase: bool) -> bool:
        ok = self.store.remove(seq, secure=erase)
        if ok:
            self.message_gone(seq)
            for c in self.consumers.values():
                c.stream_changed()
            self.jsa.note_usage()
        return ok

    def remove_acked(self, seq: int) -> None:
        """A message every interested consumer has acknowledged (interest/workqueue)."""
        if self.store.remove(seq):
            self.jsa.note_usage()

    def check_interest_retention(self, seq: int, subject: bytes | None = None) -> None:
        if self.cfg["retention"] == "limits":
            return
        if subject is None:
            rec = self.store.load(seq)
            if rec is None:
                return
            subject = rec[0]
        s = subject.decode("utf-8", "replace")
        for c in self.consumers.values():
            if c.wants(s) and not c.has_acked(seq):
                return
        self.remove_acked(seq)

    def load_for_read(self, seq: int):
        """A stored message readers may see (durable: up to what is synced)."""
        if seq > self.synced_seq:
            return None
        return self.store.load(seq)

    # ---- direct get (allow_direct) -------------------------------------------------------

    def on_direct_get(self, sub, subject, reply, hdr, msg) -> None:
        """The subscription handler of ``$JS.API.DIRECT.GET.<stream>`` (a message
        handler's signature): answers ``reply`` with the message(s) asked for, or a
        status (408 for a bad request, 404 when there is none)."""
        if not reply:
            return
        body = msg[hdr:] if hdr and hdr > 0 else msg
        if not body:
            return self._status(reply, 408, "Empty Request")
        req = self._direct_request(reply, body)
        if req is None:
            return
        seq = req.get("seq") or 0
        last_for = req.get("last_by_subj") or ""
        next_for = req.get("next_by_subj") or ""
        multi = req.get("multi_last") or []
        start_time = req.get("start_time")
        batch = req.get("batch") or 0
        if not seq and not last_for and not next_for and not multi and not start_time:
            return self._status(reply, 408, "Empty Request")
        if (seq and last_for) or (seq and start_time) or (start_time and last_for) or \
                (last_for and next_for) or (last_for and batch) or (last_for and multi) or \
                (next_for and multi) or (req.get("up_to_seq") and req.get("up_to_time")):
            return self._status(reply, 408, "Bad Request")
        self.direct_get(req, reply)

    def on_direct_get_last(self, sub, subject, reply, hdr, msg) -> None:
        """The subscription handler of ``$JS.API.DIRECT.GET.<stream>.<subject>``: the
        last message on that subject, answered as ``on_direct_get`` answers."""
        if not reply:
            return
        body = msg[hdr:] if hdr and hdr > 0 else msg
        req = self._direct_request(reply, body) if body else {}
        if req is None:
            return
        parts = subject.split(b".", 5)
        key = parts[5] if len(parts) == 6 else b""
        if not key:
            return self._status(reply, 408, "Bad Request")
        if any(req.get(k) for k in ("last_by_subj", "next_by_subj", "multi_last", "seq",
                                    "batch", "start_time", "up_to_seq", "up_to_time")):
            return self._status(reply, 408, "Bad Request")
        req["last_by_subj"] = key.decode("utf-8", "replace")
        self.direct_get(req, reply)

    def _direct_request(self, reply: bytes, body: bytes) -> dict | None:
        """The JSON object of a direct get, or None after answering 408 for bad JSON."""
        try:
            req = json.loads(body)
            if isinstance(req, dict):
                return req
        except ValueError:
            pass
        self._status(reply, 408, "Malformed Request")
        return None

    def _status(self, reply: bytes, code: int, text: str) -> None:
        h = H.make(code, text)
        self.server.deliver(self.jsa.account, reply, None, h, len(h))

    def direct_get(self, req: dict, reply: bytes) -> None:
        """server/stream.go getDirectRequest (and getDirectMulti for multi_last)."""
        store = self.store
        if req.get("multi_last"):
            return self._direct_multi(req, reply)
        seq = req.get("seq") or 0
        if req.get("start_time"):
            seq = self._seq_from_time(req["start_time"])
        next_for = (req.get("next_by_subj") or "").encode()
        last_for = (req.get("last_by_subj") or "").encode()
        batch = req.get("batch") or 0
        is_batch = batch > 0
        batch = batch or 1
        np = 0
        if is_batch:
            np = store.num_pending(seq, next_for or None)
        mb = req.get("max_bytes") or self.server.opts.max_pending
        sent_bytes = 0
        lseq = 0
        deliver = self.server.deliver
        acc = self.jsa.account
        for i in range(batch):
            if seq > 0 and not next_for:
                if i == 0 and not is_batch:
                    rec = self.load_for_read(seq)
                    rec = (seq,) + rec if rec is not None else None
                else:
                    rec = store.load_next(seq)
            elif next_for:
                rec = store.load_next(seq, next_for)
            else:
                rec = store.load_last(last_for)
            if rec is not None and rec[0] > self.synced_seq:
                rec = None
            if rec is None:
                if batch > 1 and i > 0:
                    break
                return self._status(reply, 404, "Message Not Found")
            mseq, subj, mhdr, mmsg, ts = rec
            seq = mseq + 1
            if req.get("no_hdr"):
                out_hdr = None
            else:
                pairs = [(H.STREAM, self.name.encode()), (H.SUBJECT, subj),
                         (H.SEQUENCE, b"%d" % mseq), (H.TIME_STAMP, rfc3339_nano(ts).encode())]
                if is_batch:
                    if np > 0:
                        np -= 1
                    pairs += [(H.NUM_PENDING, b"%d" % np), (H.LAST_SEQUENCE, b"%d" % lseq)]
                if mhdr:
                    out_hdr = mhdr
                    for k, v in pairs:
                        out_hdr = H.add(out_hdr, k, v)
                else:
                    out_hdr = H.make(0, "", pairs)
            lseq = mseq
            if out_hdr:
                deliver(acc, reply, None, out_hdr + mmsg, len(out_hdr))
            else:
                deliver(acc, reply, None, mmsg)
            sent_bytes += len(subj) + len(mhdr or b"") + len(mmsg)
            if sent_bytes >= mb:
                break
        if is_batch:
            h = H.make(204, "EOB", [(H.NUM_PENDING, b"%d" % np), (H.LAST_SEQUENCE, b"%d" % lseq)])
            deliver(acc, reply, None, h, len(h))

    def _direct_multi(self, req: dict, reply: bytes) -> None:
        store = self.store
        up_to = req.get("up_to_seq") or store.last_seq
        if req.get("up_to_time"):
            up_to = self._seq_from_time(req["up_to_time"])
            if up_to <= store.first_seq:
                return self._status(reply, 404, "No Results")
            up_to -= 1
        start = req.get("seq") or 0
        found = {}
        for filt in req["multi_last"]:
            f = filt.encode()
            for subj in store.subjects(f):
                rec = store.load_prev(up_to, subj)
                if rec is not None and rec[0] >= start:
                    found[rec[0]] = rec
        if not found:
            return self._status(reply, 404, "No Results")
        if len(found) > 1024:
            return self._status(reply, 413, "Too Many Results")
        mb = req.get("max_bytes") or self.server.opts.max_pending
        batch = req.get("batch") or 0
        sent = sent_bytes = 0
        lseq = 0
        seqs = sorted(found)
        deliver = self.server.deliver
        acc = self.jsa.account
        np = len(seqs)
        for mseq in seqs:
            np -= 1
            _, subj, mhdr, mmsg, ts = found[mseq]
            pairs = [(H.STREAM, self.name.encode()), (H.SUBJECT, subj),
                     (H.SEQUENCE, b"%d" % mseq), (H.TIME_STAMP, rfc3339_nano(ts).encode()),
                     (H.NUM_PENDING, b"%d" % np), (H.LAST_SEQUENCE, b"%d" % lseq)]
            out_hdr = mhdr or None
            if out_hdr:
                for k, v in pairs:
                    out_hdr = H.add(out_hdr, k, v)
            else:
                out_hdr = H.make(0, "", pairs)
            lseq = mseq
            deliver(acc, reply, None, out_hdr + mmsg, len(out_hdr))
            sent_bytes += len(subj) + len(mhdr or b"") + len(mmsg)
            sent += 1
            if sent_bytes >= mb or (batch and sent >= batch):
                break
        h = H.make(204, "EOB", [(H.NUM_PENDING, b"%d" % np), (H.LAST_SEQUENCE, b"%d" % lseq),
                                (H.UP_TO_SEQUENCE, b"%d" % up_to)])
        deliver(acc, reply, None, h, len(h))

    def _seq_from_time(self, text: str) -> int:
        """The first sequence at or after a time (store.GetSeqFromTime)."""
        try:
            ts = parse_rfc3339(text)
        except ValueError:
            return self.store.last_seq + 1
        store = self.store
        lo, hi = store.first_seq, store.last_seq
        # Timestamps only grow with sequences: binary search over live messages.
        ans = hi + 1
        while lo <= hi:
            mid = (lo + hi) // 2
            rec = store.load_next(mid)
            if rec is None:
                hi = mid - 1
                continue
            if rec[4] >= ts:
                ans = min(ans, rec[0])
                hi = mid - 1
            else:
                lo = rec[0] + 1
        return ans

    # ---- info ----------------------------------------------------------------------------

    def state(self, subjects_filter: str = "", deleted_details: bool = False) -> dict:
        st = self.store.state()
        out = {"messages": st["messages"], "bytes": st["bytes"],
               "first_seq": st["first_seq"], "first_ts": rfc3339_nano(st["first_ts"]),
               "last_seq": st["last_seq"], "last_ts": rfc3339_nano(st["last_ts"])}
        if st["num_subjects"]:
            out["num_subjects"] = st["num_subjects"]
        if subjects_filter:
            subs = self.store.subjects(subjects_filter.encode())
            if subs:
                out["subjects"] = {k.decode("utf-8", "replace"): v for k, v in subs.items()}
        if st["num_deleted"]:
            out["num_deleted"] = st["num_deleted"]
        if deleted_details:
            dl = self.store.deleted()
            if dl:
                out["deleted"] = dl
        lost = getattr(self.store, "recovery", None) or {}
        if lost.get("lost"):
            out["lost"] = {"msgs": _flatten_lost(lost["lost"]), "bytes": 0}
        # Consumers of mirrors and sources are not the stream's (server/stream.go).
        out["consumer_count"] = sum(1 for c in self.consumers.values() if not c.direct)
        return out

    def info(self, subjects_filter: str = "", deleted_details: bool = False,
             dynamic: bool = True) -> dict:
        """StreamInfo; ``dynamic`` adds the server's version and API level to the
        metadata (every reply but STREAM.LIST's, server/jetstream_api.go)."""
        cfg = with_dynamic_metadata(self.cfg, self.js.version) if dynamic else self.cfg
        out = {"config": config_json(cfg), "created": rfc3339_nano(self.created),
               "state": self.state(subjects_filter, deleted_details)}
        if self.js.domain:
            out["domain"] = self.js.domain
        # A standalone server names itself as the leader in STREAM.INFO only (the API
        # adds it there); a replicated stream reports its group everywhere.
        if self.replica is not None:
            out["cluster"] = self.replica.cluster_info()
        if self.sourcing is not None:
            out.update(self.sourcing.info())
        out["ts"] = rfc3339_nano(now_ns())
        return out

    def config_for_update(self, cfg: dict) -> None:
        """Apply an accepted update (the checks were done by the API)."""
        old = self.cfg
        self.cfg = cfg
        if self.batches is not None and not cfg["allow_atomic"]:
            self.batches.clear()
        self._set_plain()
        leading = self.replica is None or self.replica.is_leader()
        if old["subjects"] != cfg["subjects"]:
            acc = self.jsa.account
            self.js.unsubscribe_all(acc, self._subs)
            self._subs = []
            if cfg["mirror"] is None and leading:
                self._subs = self.js.subscribe_all(acc, cfg["subjects"] or [], self._sink)
        self._make_transforms()
        self._make_markers()
        self._make_schedules()
        self._update_direct()
        if leading:
            self.sourcing = sourcing.update_for_stream(self, old)
        self._enforce_all_limits()
        self._expire_wake.unpark()
        for c in self.consumers.values():
            c.stream_changed()

    def _enforce_all_limits(self) -> None:
        cfg = self.cfg
        store = self.store
        mmp = cfg["max_msgs_per_subject"]
        if mmp > 0:
            for subj, count in list(store.subjects().items()):
                while count > mmp:
                    _, first, _ = store.subject_state(subj)
                    self._remove_for_limits(first)
                    count -= 1
        mm = cfg["max_msgs"]
        while mm > 0 and store.msgs > mm:
            self._remove_for_limits(store.first_seq)
        mb = cfg["max_bytes"]
        while mb > 0 and store.bytes > mb and store.msgs:
            self._remove_for_limits(store.first_seq)


def _flatten_lost(lost) -> list:
    out = []
    for item in lost:
        if isinstance(item, (list, tuple)):
            out.extend(range(item[0], item[1] + 1))
        else:
            out.append(item)
    return out


def _parse_uint(v: bytes) -> int | None:
    v = v.strip()
    return int(v) if v.isdigit() else None


def _ttl_seconds(hdr: bytes) -> int:
    raw = H.get(hdr, H.MSG_TTL)
    if not raw:
        return 0
    return H.parse_ttl(raw) or 0


__all__ = ["Stream", "subject_matches"]
