"""A consumer: delivers a stream's stored messages and keeps track of acknowledgements.

Where it sits in a message's path: the stream (natsjs/jetstream/stream.py) has stored
and fsynced a batch and calls ``signal``; the consumer's task reads what its filters
match from the store, up to the stream's durable sequence, and delivers each message
(step 4 again) to its deliver subject (push) or to the reply subject of a waiting pull
request, with the reply subject clients acknowledge to:

    $JS.ACK.<stream>.<consumer>.<delivery count>.<stream seq>.<consumer seq>.<ts>.<pending>

(server/consumer.go ackReply; clients parse these tokens for metadata).
Acknowledgements come back through an internal subscription on ``$JS.ACK.<stream>.
<consumer>.>``; they change the in-memory state at once (cheap, no waiting inside the
publisher's fan-out) and are appended to the consumer's state log, which the task
fsyncs in groups; a reply to an acknowledgement (AckAck) is sent only after that.

Everything nats-server's clients see follows server/consumer.go: the deliver policies,
ack policies, redelivery with ack_wait/backoff/max_deliver, max_ack_pending, the pull
request queue and its 404/408/409 status messages, idle heartbeats and flow control.
"""
from __future__ import annotations

import collections
import json
import random
import re
import string

import trio

from natsjs._core.jsdeliver import deliver_run
from natsjs.accounts import exact_interest
from natsjs.jetstream import headers as H
from natsjs.jetstream import priority as P
from natsjs.jetstream.apicore import check_api_level
from natsjs.jetstream.consumercfg import (config_json, filters_of, is_durable, pause_ns,
                                          with_dynamic_metadata)
from natsjs.jetstream.errors import ApiError
from natsjs.jetstream.gojson import go_json
from natsjs.jetstream.jstime import go_duration, now_ns, parse_go_duration, rfc3339_nano
from natsjs.jetstream.pacing import Pacer
from natsjs.jetstream.schema import DecodeError, Struct, unmarshal
from natsjs.jetstream.store import OP_ACK, OP_FLOOR, ConsumerState
from natsjs.jetstream.subjects import filter_matches, subset_match

# Deliveries made per turn of the loop before other tasks get the event loop: by the
# Python path, and by the C path (jsdeliver), which costs far less a message.  A pull
# request of 500 then goes out in one turn and one write: split in two, it waited a
# pass of the event loop in the middle, and R3 fetch was 13-25% slower.
DELIVER_BURST = 256
FAST_BURST = 1024
# ... and about this many bytes at most, whichever comes first: nothing is sent before
# the turn ends, and a burst must not fill a client's pending buffer (max_pending,
# 64 MB) by itself -- 256 messages of 512 KB did, and the client was cut off as a slow
# consumer.  (The C path goes by the stream's mean message size.)
BURST_BYTES = 4 << 20
# How often a replicated consumer's leader without a lease looks again (seconds).
LEASE_RECHECK = 0.05
# A flow-controlled push consumer stops at this many unconfirmed bytes: a window that
# starts at 1/16 of JsFlowControlMaxPending and doubles with each answered flow control
# request up to all of it (server/consumer.go setMaxPendingBytes, processFlowControl).
# A request goes out once more than half the window is unconfirmed.
FC_MAX_BYTES = 32 * 1024 * 1024
FC_START_BYTES = FC_MAX_BYTES // 16
# How often state with nothing logged (ack none, deliveries) is written as a snapshot.
SNAPSHOT_INTERVAL = 1.0
STATE_RETRY = 1.0            # seconds before a failed state sync is tried again

ACK_ACK = b"+ACK"
ACK_OK = b"+OK"
ACK_NAK = b"-NAK"
ACK_PROGRESS = b"+WPI"
ACK_NEXT = b"+NXT"
ACK_TERM = b"+TERM"
# The reason of the terminated advisory for a pending message the stream no longer has
# (server/consumer.go ackTermUnackedLimitsReason).
TERM_DELETED = "Unacknowledged message was deleted"

_NAME_CHARS = string.ascii_letters + string.digits


def ephemeral_name() -> str:
    return "".join(random.choice(_NAME_CHARS) for _ in range(8))


class PullRequest:
    __slots__ = ("reply", "n", "b", "no_wait", "expires", "hb", "hbt", "d", "max_bytes_set",
                 "seen", "pg")

    def __init__(self, reply, n, b, no_wait, expires, hb, pg=None):
        self.reply = reply
        self.n = n
        self.b = b
        self.max_bytes_set = b > 0
        self.no_wait = no_wait
        self.expires = expires          # trio time, 0 for none
        self.hb = hb                    # seconds, 0 for none
        self.hbt = trio.current_time() + hb if hb else 0.0
        self.d = 0
        self.seen = False      # interest in the reply subject checked once
        self.pg = pg           # its priority group (priority.py), None: none given


class Consumer:
    def __init__(self, stream, cfg: dict, name: str, created: int, cstore,
                 state: ConsumerState | None = None, replicated: bool = False):
        self.stream = stream
        self.js = stream.js
        self.server = stream.server
        self.cfg = cfg
        self.name = name
        self.created = created
        self.cstore = cstore
        self.closed = False
        self.filters = filters_of(cfg)
        self._bfilters = [f.encode() for f in self.filters]
        self.push = bool(cfg["deliver_subject"])
        self.watched = None       # the deliver subject JetStream passes interest of
        # Consumers that mirrors and sources create: no limits apply, and direct ones
        # are neither stored nor listed.
        self.direct = bool(cfg["direct"])
        self.internal = self.direct or bool(cfg["sourcing"])
        self.ack_none = cfg["ack_policy"] == "none"
        self.ack_all = cfg["ack_policy"] in ("all", "flow_control")
        # Acknowledged by the replies to flow control (a source's durable consumer).
        self.ack_fc = cfg["ack_policy"] == "flow_control"
        if state is None:
            state = self._initial_state()
        self.st = state
        self.waiting: collections.deque = collections.deque()
        self.rdq: list[int] = []            # to redeliver, in order
        self._rdq_set: set[int] = set()
        self._lss: list[int] | None = None  # last-per-subject sequences still to deliver
        self._lss_resume = 0
        self._wake = trio.lowlevel.ParkingLot()
        self._scope = trio.CancelScope()
        self._subs = []
        self.active = not self.push
        self._ack_waiters: list = []        # replies waiting for the state to be durable
        self._last_hb = trio.current_time()
        self._last_activity = trio.current_time()
        self._ldt = 0                       # last delivery time (ns) for info
        self._lat = 0                       # last time acks moved (ns) for info
        self._pbytes = 0
        self._fcid = None
        self._fcsz = 0
        self._maxpb = FC_START_BYTES
        self._state_changed = False
        self._state_idle = False      # the state loop sleeps until a change wakes it
        self.paused_until = _pause_ahead(cfg)
        # Priority groups (priority.py): the policy, and the pinned client's pin.
        self.policy = cfg["priority_policy"]
        self.pin = P.Pin(self)
        self._passed_over = False     # every waiting request passed the last message by
        self._npc = None                    # num pending cache, valid through _npf
        self._npf = 0
        self._now = 0                       # the clock, read once per delivery burst
        # A replicated consumer's replica (natsjs/jetstream/replicated.py) delivers only
        # while it leads its group.
        self.replica = None
        # A replicated consumer's leader notes each delivery here, (stream seq, delivery
        # seq, delivery count); the batch goes to the group after each round.
        self._dlog: list | None = None
        # A replica of a replicated consumer starts as a follower: it delivers nothing
        # until its group makes it leader (set_active_leader).
        self._leading = not replicated
        # replay_policy original / rate_limit_bps (pacing.py): a message taken from the
        # store that must wait is held until the time it may go.
        self.pacer = Pacer.for_consumer(self)
        self._held = None
        self._pace_until = 0.0
        if cfg["deliver_policy"] == "last_per_subject" and state.dseq == 1:
            self._setup_lss()

    # ---- positions ------------------------------------------------------------------

    def _initial_state(self) -> ConsumerState:
        """server/consumer.go setStartingSequenceForConsumer."""
        store = self.stream.store
        dp = self.cfg["deliver_policy"]
        first, last = store.first_seq, store.last_seq
        if dp == "all":
            seq = first
            rec = self._load_next(first) if self.filters else None
            if rec is not None:
                seq = rec[0]
        elif dp == "last":
            seq = last
            if self.filters:
                recs = [store.load_last(f) for f in self._bfilters]
                recs = [r for r in recs if r is not None]
                seq = max(r[0] for r in recs) if recs else last + 1
            seq = max(seq, 1)
        elif dp == "new":
            seq = last + 1
        elif dp == "by_start_sequence":
            seq = self.cfg["opt_start_seq"]
        elif dp == "by_start_time":
            try:
                seq = self.stream._seq_from_time(self.cfg["opt_start_time"])
            except ValueError:
                seq = last + 1
        else:   # last_per_subject: the skip list decides, then new messages
            seq = first
        seq = max(seq, 1)
        return ConsumerState(seq, 1)

    def _setup_lss(self) -> None:
        store = self.stream.store
        seqs = set()
        for f in self._bfilters or [None]:
            for subj in store.subjects(f):
                rec = store.load_last(subj)
                if rec is not None:
                    seqs.add(rec[0])
        self._lss = sorted(seqs)
        self._lss_resume = store.last_seq + 1
        if self._lss:
            self.st.sseq = self._lss[0]
            self.st.asflr = self.st.sseq - 1
        else:
            self.st.sseq = self._lss_resume
            self.st.asflr = self.st.sseq - 1
            self._lss = None

    def wants(self, subject: str) -> bool:
        """Does this consumer's filter take messages on ``subject``?"""
        if not self.filters:
            return True
        return any(filter_matches(f, subject) for f in self.filters)

    def purge_scope(self, subject: str) -> str | None:
        """How a purge of ``subject`` concerns this consumer (server/stream.go
        purgeLocked): "all" when our filters lie within it, "wider" when it lies within
        our filters (or we have none), None when it does not concern us."""
        if any(f == subject or subset_match(f, subject) for f in self.filters):
            return "all"
        if not self.filters or any(subset_match(subject, f) for f in self.filters):
            return "wider"
        return None

    def has_acked(self, seq: int) -> bool:
        st = self.st
        if seq <= st.asflr:
            return True
        if seq in st.pending:
            return False
        return seq < st.sseq or seq in st.acked_ahead

    def _load_next(self, seq: int):
        store = self.stream.store
        if not self._bfilters:
            return store.load_next(seq)
        if len(self._bfilters) == 1:
            return store.load_next(seq, self._bfilters[0])
        best = None
        for f in self._bfilters:
            rec = store.load_next(seq, f)
            if rec is not None and (best is None or rec[0] < best[0]):
                best = rec
        return best

    def num_pending(self) -> int:
        """Messages matching the filters not yet delivered (server/consumer.go npc)."""
        store = self.stream.store
        last = min(self.stream.synced_seq, store.last_seq)
        st = self.st
        if self._lss is not None:
            return len([s for s in self._lss if s >= st.sseq])
        if self._npc is None or self._npf < st.sseq - 1:
            self._npc = self._count_pending(st.sseq)
            self._npf = max(last, st.sseq - 1)
        elif last > self._npf:
            self._npc += self._count_pending(self._npf + 1, last)
            self._npf = last
        return max(self._npc, 0)

    def _count_pending(self, start: int, last: int | None = None) -> int:
        store = self.stream.store
        last_seq = min(self.stream.synced_seq, store.last_seq)
        if last is None:
            last = last_seq
        if start > last:
            return 0
        if self._bfilters:
            n = sum(store.num_pending(start, f) for f in self._bfilters)
        else:
            n = store.num_pending(start)
        if last < store.last_seq:
            if self._bfilters:
                n -= sum(store.num_pending(last + 1, f) for f in self._bfilters)
            else:
                n -= store.num_pending(last + 1)
        return max(n, 0)

    def _pending_reset(self) -> None:
        self._npc = None

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        if self.replica is None or self._leading:
            self._subscribe()
        nursery.start_soon(self._run)

    def _subscribe(self) -> None:
        if self._subs or self.closed:
            return
        acc = self.stream.jsa.account
        base = ("%s.%s" % (self.stream.name, self.name)).encode()
        self._subs.append(self.js.subscribe(acc, b"$JS.ACK." + base + b".>", self._on_ack))
        # A push consumer listens too, to say it is push based (server/consumer.go).
        self._subs.append(self.js.subscribe(
            acc, b"$JS.API.CONSUMER.MSG.NEXT." + base, self._on_next))
        self._subs.append(self.js.subscribe(
            acc, b"$JS.API.CONSUMER.RESET." + base, self._on_reset))
        if self.push:
            self._subs.append(self.js.subscribe(acc, b"$JS.FC." + base + b".*", self._on_fc))
            self.js.watch_deliver(self, self.cfg["deliver_subject"])
            self.check_interest()

    def set_active_leader(self, leading: bool) -> None:
        """A replicated consumer's replica: only the leader takes requests, acks and
        delivers (natsjs/jetstream/replicated.py)."""
        self._leading = leading
        self._dlog = [] if leading else None
        # A pause that ended while another led was announced there; the pin is the
        # leader's alone (server/consumer.go setLeader: unassignPinId).
        self.paused_until = _pause_ahead(self.cfg)
        self.pin.clear()
        if leading:
            self._subscribe()
            self._pending_reset()
            self._wake.unpark()
            return
        acc = self.stream.jsa.account
        for sub in self._subs:
            self.js.unsubscribe(acc, sub)
        self._subs = []
        self.waiting.clear()
        self.rdq = []
        self._rdq_set = set()

    def stop(self, delete: bool = False, from_stream: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        acc = self.stream.jsa.account
        for sub in self._subs:
            self.js.unsubscribe(acc, sub)
        self._subs = []
        if self.watched is not None:
            self.js.watch_deliver(self, None)
        for wr in self.waiting:
            self._status(wr.reply, 409, "Consumer Deleted")
        self.waiting.clear()
        self._scope.cancel()
        if not delete:
            try:
                self.cstore.snapshot(self.st)
            except OSError as exc:
                self.server.log.error("JetStream could not save consumer '%s > %s > %s': %s",
                                      self.stream.jsa.name, self.stream.name, self.name, exc)
        try:
            self.cstore.close()
        except OSError as exc:     # a full disk: what was not written is reported, not raised
            self.server.log.error("JetStream could not close consumer '%s > %s > %s': %s",
                                  self.stream.jsa.name, self.stream.name, self.name, exc)
        if not from_stream:
            self.stream.consumers.pop(self.name, None)
            if self.stream.cfg["retention"] != "limits":
                self.js.recheck_interest(self.stream)

    async def _run(self) -> None:
        with self._scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._state_loop)
                await self._deliver_loop()

    def signal(self) -> None:
        """The stream has new durable messages: what is ready goes out now, in the
        stream's turn right after its PubAcks, and the loop delivers the rest.
        nats-server queues a PubAck and the deliveries it causes on the stream's one
        outq, so a client reads them together; delivered later from this consumer's
        own task, they could reach a publishing client with the next PubAck, two at
        once, where nats.py's pending limits count per read (a slow consumer)."""
        if not self.closed and self._leading and \
                (self.replica is None or self.replica.may_deliver()):
            self._deliver_some()
        self._wake.unpark()

    def stream_changed(self) -> None:
        """Messages went away (purge, delete, limits): counts are stale."""
        self._pending_reset()
        self._wake.unpark()

    def purged(self, start: int, last_seq: int, wider: bool = False) -> None:
        """The stream purged up to ``start`` (0: everything this consumer wants is gone);
        with ``wider`` the purge took only part of what we want, so pending messages are
        dropped only if they are gone (server/consumer.go purge)."""
        st = self.st
        if start == 0 and not wider:
            start = last_seq + 1
        if st.sseq < start:
            st.sseq = start
        if st.asflr < start:
            st.asflr = start - 1
            store = self.stream.store
            for seq in list(st.pending):
                if seq <= st.asflr or (wider and store.load(seq) is None):
                    dseq = st.pending.pop(seq)[0]
                    st.rdc.pop(seq, None)
                    self._lat = now_ns()
                    if dseq > st.adflr:
                        st.adflr = dseq
                        if st.adflr > st.dseq:
                            st.dseq = st.adflr
        if not st.pending:
            st.adflr, st.asflr = st.dseq - 1, st.sseq - 1
        self.rdq = [s for s in self.rdq if s >= st.sseq]
        self._rdq_set = set(self.rdq)
        self._note_state_change()
        self.stream_changed()

    def message_removed(self, seq: int) -> None:
        """A message left the stream (deleted, limits, age, a purge of one): if we were
        waiting for its acknowledgement it is terminated now, as an acknowledgement
        with an advisory (server/consumer.go decStreamPending)."""
        st = self.st
        if seq in st.pending:
            self._term(seq, st.pending[seq][0], TERM_DELETED, st.rdc.get(seq, 0) + 1)
        elif st.rdc.pop(seq, None) is not None:
            self._note_state_change()

    def reset_to_ack_floor(self) -> None:
        """A source's durable consumer asked for again: deliver anew from after the last
        acknowledged message, delivery sequences from 1 (server/consumer.go
        resetStartingSeq)."""
        self.reset_to(self.st.asflr + 1)

    def reset_seq(self, seq: int) -> int:
        """server/consumer.go resetStartingSeqLocked: where a CONSUMER.RESET to ``seq``
        (0: the ack floor) starts; ValueError with nats-server's words when the deliver
        policy does not allow it."""
        cfg = self.cfg
        dp = cfg["deliver_policy"]
        if seq == 0:
            seq = self.st.asflr + 1
        elif dp == "by_start_sequence":
            if seq < cfg["opt_start_seq"]:
                raise ValueError("below start seq")
        elif dp == "by_start_time":
            try:
                first = self.stream._seq_from_time(cfg["opt_start_time"])
            except ValueError:
                first = self.stream.store.last_seq + 1
            if seq < first:
                raise ValueError("below start time")
        elif dp != "all":
            raise ValueError("not allowed")
        return max(seq, 1)

    def _on_reset(self, sub, subject, reply, hdr, msg) -> None:
        """$JS.API.CONSUMER.RESET.<stream>.<consumer> (server/consumer.go
        processResetReq): the consumer starts again at a sequence; a replicated one once
        its group has the reset (answered then, replicated.py)."""
        if not reply:
            return
        h, body = (msg[:hdr], msg[hdr:]) if hdr and hdr > 0 else (None, msg)
        try:
            check_api_level(h)
            req = unmarshal(body, RESET_REQUEST) if body else {}
        except DecodeError as exc:
            return self.answer_reset(reply, error=ApiError.of("JSInvalidJSONErr", err=str(exc)))
        except ApiError as exc:
            return self.answer_reset(reply, error=exc)
        try:
            seq = self.reset_seq(req.get("seq", 0))
        except ValueError as exc:
            return self.answer_reset(reply, error=ApiError.of("JSConsumerInvalidResetErr",
                                                              err=str(exc)))
        if self.replica is not None:
            self.replica.propose_reset(seq, reply)
            return
        self.reset_to(seq)
        self.answer_reset(reply, seq)

    def answer_reset(self, reply: bytes, seq: int = 0, error: ApiError | None = None) -> None:
        """The consumer_reset_response: the consumer's info and ``reset_seq``, or the
        error (``reset_seq`` is always written, as Go does)."""
        resp = {"type": RESET_RESPONSE}
        if error is not None:
            resp["error"] = error.to_dict()
        else:
            resp.update(self.info())
        resp["reset_seq"] = seq
        self.server.deliver(self.stream.jsa.account, reply, None, go_json(resp))

    def reset_to(self, seq: int) -> None:
        """Deliver anew from stream sequence ``seq``, delivery sequences from 1, nothing
        pending (server/consumer.go resetLocalStartingSeq)."""
        st = self.st
        st.pending.clear()
        st.rdc.clear()
        self.rdq = []
        self._rdq_set = set()
        st.acked_ahead.clear()
        st.sseq, st.dseq = seq, 1
        st.adflr, st.asflr = 0, seq - 1
        self._fcid = None
        self._fcsz = self._pbytes = 0
        self._ldt = self._lat = 0
        self._note_state_change()
        self.stream_changed()

    # ---- interest (push) ------------------------------------------------------------------

    def check_interest(self) -> None:
        if not self.push or self.closed:
            return
        # Only a subscription on the deliver subject itself (in the deliver group, if
        # there is one) makes the consumer deliver, not a wildcard that also matches
        # it (server/consumer.go waits on the sublist's interest notifications).
        active = exact_interest(self.stream.jsa.account, self.cfg["deliver_subject"].encode(),
                                (self.cfg.get("deliver_group") or "").encode())
        if active != self.active:
            self.active = active
            if active:
                self._last_activity = trio.current_time()
                self._wake.unpark()

    # ---- the delivery task ------------------------------------------------------------------

    async def _deliver_loop(self) -> None:
        while True:
            if self.closed:
                return
            if not self._leading:
                await self._wake.park()
                continue
            if self.replica is not None and not self.replica.may_deliver():
                # A replicated consumer's leader that has not heard from a quorum lately
                # may have been replaced: nothing goes out until it hears again (or
                # learns it lost; then set_active_leader stops this loop).
                with trio.move_on_after(LEASE_RECHECK):
                    await self._wake.park()
                continue
            if self._deliver_some():
                await trio.lowlevel.checkpoint()
                continue
            timeout = self._housekeeping()
            if self._pace_until:
                left = self._pace_until - trio.current_time()
                timeout = left if timeout is None else min(timeout, left)
            if timeout is None:
                await self._wake.park()
            else:
                with trio.move_on_after(max(timeout, 0.0005)):
                    await self._wake.park()

    def _deliver_some(self) -> bool:
        """Deliver what is ready, up to a turn's burst; True when the turn stopped at its
        burst (more may be ready)."""
        self._passed_over = False
        if self.paused_until and now_ns() < self.paused_until:
            return False
        if self._pace_until:
            if trio.current_time() < self._pace_until:
                return False
            self._pace_until = 0.0
        if self.push:
            if not self.active or (self.cfg["flow_control"] and self._pbytes > self._maxpb):
                return False
        elif not self.waiting:
            return False
        delivered = 0
        full = False
        acc = self.stream.jsa.account
        pub = self.js.publisher(acc)
        self._now = now_ns()
        nbytes = 0
        try:
            if self._fast_ok():
                delivered, full = self._deliver_fast(pub)
            while not full:
                if delivered >= DELIVER_BURST or nbytes >= BURST_BYTES:
                    full = True
                    break
                if not self.push and not self.waiting:
                    break
                got = self._held or self._next_msg()
                self._held = None
                if got is None:
                    if self.pacer is not None:
                        self.pacer.caught_up(self.st.sseq)
                    break
                seq, subj, hdr, msg, ts, dc = got
                if self.pacer is not None:
                    # Counted as the reference does, ack reply included (near enough).
                    size = len(subj) + len(hdr or b"") + len(msg) + len(self.name) + \
                        len(self.stream.name) + 48
                    wait = self.pacer.wait(seq, ts, size)
                    if wait > 0:
                        self._held = got
                        self._pace_until = trio.current_time() + wait
                        break
                if not self.push:
                    wr = self._next_waiting(seq, subj, hdr, msg)
                    if wr is None:
                        self._unget(seq, dc)
                        break
                    dsubj = wr.reply
                    if self.policy == "pinned_client":
                        hdr = H.add(hdr, P.PIN_ID, self.pin.id.encode())
                else:
                    wr = None
                    dsubj = self.cfg["deliver_subject"].encode()
                self._deliver(pub, dsubj, seq, subj, hdr, msg, ts, dc)
                delivered += 1
                nbytes += len(subj) + len(msg) + (len(hdr) if hdr else 0)
                if wr is not None:
                    self._after_pull_delivery(pub, wr)
                if self.push and self.cfg["flow_control"] and self._pbytes > self._maxpb:
                    break
        finally:
            pub.done()
            if self._dlog is not None and (self._dlog or (delivered and self.ack_none)):
                self.cstore.delivered(self._dlog, self.st)
                self._dlog = []
        if delivered:
            self._last_hb = trio.current_time()
        return full

    # ---- the fast path: first deliveries straight from the log (natsjs/_core/jsdeliver) ---

    def _fast_ok(self) -> bool:
        """Can the next deliveries go through jsdeliver.deliver_run?  Only the plain case:
        first deliveries in order, one filter at most, nothing to pace or rewrite."""
        return (not self.rdq and self._lss is None and self._held is None
                and self.pacer is None and not self.st.acked_ahead
                and not self.cfg["headers_only"] and len(self._bfilters) <= 1
                and self.policy == "none" and not self.pin.id
                and not (self.push and self.cfg["flow_control"])
                and not (self.ack_none and self.stream.cfg["retention"] != "limits"))

    def _deliver_fast(self, pub) -> tuple[int, bool]:
        """First deliveries straight from the log, up to the fast path's burst: returns how
        many went out and whether the burst was reached."""
        st = self.st
        stream = self.stream
        limit = min(stream.synced_seq, stream.store.last_seq)
        filt = self._bfilters[0] if self._bfilters else None
        ack_prefix = b"$JS.ACK.%s.%s." % (stream.name.encode(), self.name.encode())
        core = pub.core
        total = 0
        out: list = []
        store = stream.store
        burst = FAST_BURST
        if store.msgs:
            burst = max(1, min(burst, BURST_BYTES * store.msgs // max(store.bytes, 1)))
        while total < burst and st.sseq <= limit:
            room = burst - total
            if not self.ack_none and self.cfg["max_ack_pending"] > 0:
                room = min(room, self.cfg["max_ack_pending"] - len(st.pending))
                if room <= 0:
                    break
            if self.push:
                wr = None
                route = self.cfg["deliver_subject"].encode()
                max_bytes = 0
            else:
                wr = self._first_waiting()
                if wr is None:
                    break
                route = wr.reply
                room = min(room, wr.n)
                max_bytes = wr.b
            pending = self.num_pending()
            del out[:]
            nxt, n, sent, stopped = deliver_run(
                stream.store, core, route, ack_prefix, st.sseq, limit, filt, st.dseq,
                pending, room, max_bytes, out)
            st.sseq = nxt
            if n:
                self._after_fast(out, n, pending)
                total += n
            if wr is not None:
                wr.n -= n
                wr.d += n
                if max_bytes:
                    wr.b -= sent
                if stopped:
                    # The next message does not fit the request's max_bytes.
                    self.waiting.popleft()
                    self._status(wr.reply, 409, "Message Size Exceeds MaxBytes",
                                 [(H.PENDING_MESSAGES, wr.n), (H.PENDING_BYTES, wr.b)])
                elif wr.n <= 0:
                    self.waiting.popleft()
                    if wr.max_bytes_set and wr.b > 0:
                        h = H.make(409, "Batch Completed", [(H.PENDING_MESSAGES, b"0"),
                                                           (H.PENDING_BYTES, b"%d" % wr.b)])
                        pub(wr.reply, None, h, len(h))
                elif wr.hb:
                    wr.hbt = trio.current_time() + wr.hb
            if n == 0 and not stopped:
                break
        return total, total >= burst

    def _after_fast(self, out: list, n: int, pending: int) -> None:
        st = self.st
        first_dseq = st.dseq
        st.dseq += n
        if self._npc is not None:
            self._npc = max(pending - n, 0)
        self._ldt = self._now
        self._note_state_change()
        if self.ack_none:
            st.adflr, st.asflr = st.dseq - 1, out[-1][0]
            return
        now = self._now
        pend = st.pending
        dseq = first_dseq
        dlog = self._dlog
        for seq, _, _ in out:
            pend[seq] = [dseq, now]
            if dlog is not None:
                dlog.append((seq, dseq, 1))
            dseq += 1

    def _first_waiting(self) -> PullRequest | None:
        """The pull request the next message goes to, after dropping expired ones and
        those whose requester went away (the checks _next_waiting does per message)."""
        now = trio.current_time()
        acc = self.stream.jsa.account
        while self.waiting:
            wr = self.waiting[0]
            if wr.expires and now >= wr.expires:
                self.waiting.popleft()
                self._status(wr.reply, 408, "Request Timeout",
                             [(H.PENDING_MESSAGES, wr.n), (H.PENDING_BYTES, wr.b)])
                continue
            if not wr.seen:
                if not acc.sublist.match(wr.reply):
                    self.waiting.popleft()
                    continue
                wr.seen = True
            return wr
        return None

    def _next_msg(self):
        """server/consumer.go getNextMsg: redeliveries first, then new messages."""
        st = self.st
        store = self.stream.store
        maxdc = self.cfg["max_deliver"]
        while self.rdq:
            seq = self.rdq.pop(0)
            self._rdq_set.discard(seq)
            if seq not in st.pending:
                continue
            dc = st.rdc.get(seq, 0) + 2
            if maxdc > 0 and dc > maxdc:
                continue
            rec = store.load(seq)
            if rec is None:
                # Gone from the stream (limits, purge): stop tracking it.
                self._term(seq, st.pending[seq][0], TERM_DELETED, dc - 1)
                continue
            st.rdc[seq] = dc - 1
            return (seq,) + rec + (dc,)
        if not self.ack_none and self.cfg["max_ack_pending"] > 0 and \
                len(st.pending) >= self.cfg["max_ack_pending"]:
            return None
        limit = self.stream.synced_seq
        if self._lss is not None:
            while self._lss:
                seq = self._lss[0]
                if seq > limit:
                    return None
                self._lss.pop(0)
                rec = store.load(seq)
                st.sseq = seq + 1
                if rec is not None:
                    if not self._lss:
                        self._lss = None
                        st.sseq = max(st.sseq, self._lss_resume)
                    return (seq,) + rec + (1,)
            self._lss = None
            st.sseq = max(st.sseq, self._lss_resume)
        while True:
            if st.sseq > limit:
                return None
            rec = self._load_next(st.sseq)
            if rec is None or rec[0] > limit:
                if rec is None:
                    st.sseq = max(st.sseq, min(limit, store.last_seq) + 1)
                return None
            seq = rec[0]
            st.sseq = seq + 1
            if seq in st.acked_ahead:
                st.acked_ahead.discard(seq)
                continue
            if self._npc is not None and self._npf >= seq:
                self._npc -= 1
            return rec + (1,)

    def _unget(self, seq: int, dc: int) -> None:
        """A message taken for a pull request that could not go: put it back."""
        st = self.st
        if dc == 1 and seq == st.sseq - 1:
            st.sseq = seq
            if self._npc is not None and self._npf >= seq:
                self._npc += 1
        else:
            st.rdc[seq] = dc - 2
            if st.rdc[seq] <= 0:
                st.rdc.pop(seq, None)
            if seq not in self._rdq_set:
                self.rdq.insert(0, seq)
                self._rdq_set.add(seq)

    def _ack_reply(self, seq: int, dseq: int, dc: int, ts: int, pending: int) -> bytes:
        return b"$JS.ACK.%s.%s.%d.%d.%d.%d.%d" % (
            self.stream.name.encode(), self.name.encode(), dc, seq, dseq, ts, pending)

    def _deliver(self, pub, dsubj: bytes, seq: int, subj: bytes, hdr, msg: bytes, ts: int,
                 dc: int) -> None:
        st = self.st
        dseq = st.dseq
        st.dseq += 1
        pending = self.num_pending()
        reply = self._ack_reply(seq, dseq, dc, ts, pending)
        if self.cfg["headers_only"]:
            hdr = H.add(hdr, H.MSG_SIZE, b"%d" % len(msg))
            msg = b""
        if hdr:
            pub(dsubj, reply, hdr + msg, len(hdr), subj)
        else:
            pub(dsubj, reply, msg, -1, subj)
        self._ldt = now = self._now
        if self.push and self.cfg["flow_control"]:
            # server/consumer.go jsPubMsg.size: what goes out, by the deliver subject.
            size = len(dsubj) + len(reply) + len(hdr or b"") + len(msg)
            self._pbytes += size
            if self._fcid is None:
                if self._pbytes > self._maxpb // 2:
                    self._send_flow_control(pub)
            elif self._pbytes - self._fcsz >= self._maxpb:
                # needFlowControl: the outstanding request also covers this one.
                self._fcsz += size
        if self.ack_none:
            st.adflr, st.asflr = dseq, seq
            self._note_state_change()
            if self.stream.cfg["retention"] != "limits":
                self.stream.check_interest_retention(seq, subj)
        else:
            p = st.pending.get(seq)
            if p is None:
                st.pending[seq] = [dseq, now]
            else:
                # A redelivery keeps the original delivery sequence (trackPending).
                p[1] = now
            if self._dlog is not None:
                self._dlog.append((seq, st.pending[seq][0], dc))
            self._note_state_change()
            if self.ack_fc and self._fcid is None and \
                    0 < self.cfg["max_ack_pending"] <= len(st.pending):
                # Nothing else would acknowledge: ask now (server/consumer.go
                # needFlowControl).
                self._send_flow_control(pub)
        if dc > 1 and self.cfg["max_deliver"] > 0 and dc == self.cfg["max_deliver"]:
            pass   # the advisory goes out when its ack wait expires without an ack

    # ---- pull requests --------------------------------------------------------------------

    def _on_next(self, sub, subject, reply, hdr, msg) -> None:
        if not reply:
            return
        if self.push:
            return self._status(reply, 409, "Consumer is push based")
        body = msg[hdr:] if hdr and hdr > 0 else msg
        try:
            req = _parse_next_request(body)
        except ValueError as exc:
            return self._status(reply, 400, "Bad Request - %s" % exc)
        batch, expires, max_bytes, no_wait, hb, pg = req
        cfg = self.cfg
        if cfg["max_batch"] > 0 and batch > cfg["max_batch"]:
            return self._status(reply, 409, "Exceeded MaxRequestBatch of %d" % cfg["max_batch"])
        if expires and cfg["max_expires"] > 0 and expires > cfg["max_expires"]:
            return self._status(reply, 409, "Exceeded MaxRequestExpires of %s"
                                % go_duration(cfg["max_expires"]))
        if max_bytes > 0 and cfg["max_bytes"] > 0 and max_bytes > cfg["max_bytes"]:
            return self._status(reply, 409, "Exceeded MaxRequestMaxBytes of %d" % cfg["max_bytes"])
        refused = P.refusal(self.policy, cfg["priority_groups"], self.pin, pg)
        if refused is not None:
            return self._status(reply, *refused)
        self._last_activity = trio.current_time()
        if no_wait:
            avail = self.num_pending() + len(self.rdq)
            if avail == 0 and not expires:
                return self._status(reply, 404, "No Messages")
            if avail > 0:
                waiting_batches = sum(w.n for w in self.waiting)
                if avail < waiting_batches:
                    return self._status(reply, 408, "Requests Pending")
        if len(self.waiting) >= cfg["max_waiting"]:
            self._expire_waiting(trio.current_time())
            if len(self.waiting) >= cfg["max_waiting"]:
                if not hb:
                    self._status(reply, 409, "Exceeded MaxWaiting")
                return
        now = trio.current_time()
        wr = PullRequest(reply, max(batch, 1), max_bytes, no_wait,
                         now + expires / 1e9 if expires else 0.0, hb / 1e9 if hb else 0.0, pg)
        if self.policy == "prioritized":
            P.insert_prioritized(self.waiting, wr)
        else:
            self.waiting.append(wr)
        self._wake.unpark()

    def _next_waiting(self, seq, subj, hdr, msg) -> PullRequest | None:
        """The request the next message goes to (server/consumer.go nextWaiting)."""
        now = trio.current_time()
        size = len(subj) + len(hdr or b"") + len(msg) + 64
        acc = self.stream.jsa.account
        passed = 0
        while self.waiting:
            wr = self.waiting[0]
            if wr.expires and now >= wr.expires:
                self.waiting.popleft()
                self._status(wr.reply, 408, "Request Timeout",
                             [(H.PENDING_MESSAGES, wr.n), (H.PENDING_BYTES, wr.b)])
                continue
            assigned = False
            if self.policy in ("overflow", "pinned_client") or self.pin.id:
                had_pin = self.pin.id
                verdict = self._priority_verdict(wr)
                assigned = not had_pin and bool(self.pin.id)
                if verdict == P.PASS:
                    # It waits at the back; the next one is asked (Go's cycle).
                    self.waiting.rotate(-1)
                    passed += 1
                    if passed >= len(self.waiting):
                        self._passed_over = True
                        return None
                    continue
                if verdict == P.REFUSE:
                    self.waiting.popleft()
                    h = P.wrong_pin(wr)
                    self.server.deliver(acc, wr.reply, None, h, len(h))
                    continue
            if wr.b > 0:
                if size <= wr.b:
                    wr.b -= size
                    if wr.b == 0:
                        wr.n = 1
                else:
                    self.waiting.popleft()
                    self._status(wr.reply, 409, "Message Size Exceeds MaxBytes",
                                 [(H.PENDING_MESSAGES, wr.n), (H.PENDING_BYTES, wr.b)])
                    if assigned:
                        self.pin.clear()      # the pin it just took goes to the next
                    continue
            if not wr.seen:
                if not acc.sublist.match(wr.reply):
                    self.waiting.popleft()
                    continue
                wr.seen = True
            return wr
        return None

    def _priority_verdict(self, wr: PullRequest) -> int:
        """server/consumer.go nextWaiting for an ``overflow`` or ``pinned_client``
        consumer: may the request at the head have the next message (priority.py)?
        A pin outlives a change of policy, and still decides (as in nats-server)."""
        if self.policy == "pinned_client" or self.pin.id:
            verdict = self.pin.check(wr)
            if verdict != P.SERVE:
                return verdict
        # The message being handed out counts as pending still (Go's npc+1).
        if self.policy == "overflow" and \
                P.overflow_waits(wr.pg, self.num_pending() + 1, len(self.st.pending)):
            return P.PASS
        return P.SERVE

    def _after_pull_delivery(self, pub, wr: PullRequest) -> None:
        wr.n -= 1
        wr.d += 1
        if wr.n > 0 and self.policy == "prioritized":
            P.requeue_prioritized(self.waiting, wr)
        if wr.n <= 0:
            if self.waiting and self.waiting[0] is wr:
                self.waiting.popleft()
            if wr.max_bytes_set and wr.b > 0:
                h = H.make(409, "Batch Completed", [(H.PENDING_MESSAGES, b"0"),
                                                   (H.PENDING_BYTES, b"%d" % wr.b)])
                pub(wr.reply, None, h, len(h))
        elif wr.hb:
            wr.hbt = trio.current_time() + wr.hb

    def _expire_waiting(self, now: float, end_of_stream: bool = False) -> float | None:
        """Time out pull requests; answer no_wait ones when nothing is left
        (server/consumer.go processWaiting). The next deadline, or None."""
        nxt = None
        keep = collections.deque()
        acc = self.stream.jsa.account
        for wr in self.waiting:
            expired = wr.expires and now >= wr.expires
            if (end_of_stream and wr.no_wait) or expired:
                if expired:
                    self._status(wr.reply, 408, "Request Timeout",
                                 [(H.PENDING_MESSAGES, wr.n), (H.PENDING_BYTES, wr.b)])
                    continue
                if not wr.expires or wr.d > 0:
                    self._status(wr.reply, 404, "No Messages")
                    continue
            if not acc.sublist.match(wr.reply):
                continue
            if wr.hb:
                if now >= wr.hbt:
                    self._heartbeat(wr.reply)
                    wr.hbt = now + wr.hb
                nxt = wr.hbt if nxt is None else min(nxt, wr.hbt)
            if wr.expires:
                nxt = wr.expires if nxt is None else min(nxt, wr.expires)
            keep.append(wr)
        self.waiting = keep
        return nxt

    def _status(self, reply: bytes, code: int, text: str, pairs=()) -> None:
        h = H.make(code, text, [(k, b"%d" % v if isinstance(v, int) else v) for k, v in pairs])
        self.server.deliver(self.stream.jsa.account, reply, None, h, len(h))

    def _heartbeat(self, subject: bytes) -> None:
        st = self.st
        pairs = [(H.LAST_CONSUMER, b"%d" % (st.dseq - 1)), (H.LAST_STREAM, b"%d" % (st.sseq - 1))]
        if self._fcid is not None:
            pairs.append((H.CONSUMER_STALLED, self._fcid))
        self._status(subject, 100, "Idle Heartbeat", pairs)

    # ---- housekeeping: timeouts, heartbeats, redeliveries, ephemerals ----------------------

    def _housekeeping(self) -> float | None:
        """Everything time-driven; seconds until something is next due (None: nothing)."""
        now = trio.current_time()
        due = []
        if not self.push:
            nxt = self._expire_waiting(now, end_of_stream=self._at_end() or
                                       self._waiting_due(now))
            if nxt is not None:
                due.append(nxt - now)
        hb = self.cfg["idle_heartbeat"]
        if self.push and hb and self.active:
            period = hb / 1e9
            if now - self._last_hb >= period:
                self._heartbeat(self.cfg["deliver_subject"].encode())
                self._last_hb = now
                if self.ack_fc and self.st.pending and self._fcid is None:
                    # Idle with deliveries unacknowledged: a flow control request
                    # collects the acknowledgement.
                    self._send_flow_control(self._publish_now)
            due.append(self._last_hb + period - now)
        if self.st.pending and self.cfg["ack_wait"] > 0:
            nxt = self._check_pending()
            if nxt is not None:
                due.append(nxt)
        t = self._inactive_deadline(now)
        if t is not None:
            if t <= 0:
                self.js.delete_consumer(self.stream, self, reason="inactive")
                return None
            due.append(t)
        if self.paused_until:
            left = (self.paused_until - now_ns()) / 1e9
            if left > 0:
                due.append(left)
            else:
                # server/consumer.go updatePauseState's timer: resumed, and said so.
                self.paused_until = 0
                P.pause_advisory(self, self.cfg, 0)
        left = self.pin.expire(now)
        if left is not None:
            due.append(left)
        return min(due) if due else None

    def _waiting_due(self, now: float) -> bool:
        """A pull request's heartbeat or expiry is due: nats-server's timer for them fired,
        and its processWaiting(true) then answers no_wait requests as at the end of the
        stream, also those max_ack_pending holds messages back from (a no_wait request
        that got some ends with 404 at its first heartbeat instead of lingering)."""
        return any((wr.hb and now >= wr.hbt) or (wr.expires and now >= wr.expires)
                   for wr in self.waiting)

    def _at_end(self) -> bool:
        """Nothing to deliver now: the end of the stream, paused, or no waiting request
        may have the next message (server/consumer.go loopAndGatherMsgs answers no_wait
        requests whenever it has to wait)."""
        if self.paused_until and now_ns() < self.paused_until:
            return True
        if self._passed_over:
            return True       # no waiting request may have the next message
        return not self.rdq and self.num_pending() == 0

    def _inactive_deadline(self, now: float) -> float | None:
        thresh = self.cfg["inactive_threshold"]
        if not thresh:
            return None
        if self.push:
            if self.active:
                self._last_activity = now
                return None
        elif self.waiting:
            self._last_activity = now
            return thresh / 1e9
        return self._last_activity + thresh / 1e9 - now

    def _check_pending(self) -> float | None:
        """Messages whose ack wait ran out go to the redelivery queue
        (server/consumer.go checkPending); seconds until the next one is due."""
        st = self.st
        now = now_ns()
        cfg = self.cfg
        backoff = cfg["backoff"] or []
        ack_wait = cfg["ack_wait"]
        maxdc = cfg["max_deliver"]
        nxt = None
        expired = []
        for seq, p in st.pending.items():
            dc = st.rdc.get(seq, 0)
            deadline = ack_wait
            if backoff:
                deadline = backoff[min(dc, len(backoff) - 1)]
            elapsed = now - p[1]
            if elapsed >= deadline:
                if seq in self._rdq_set:
                    continue
                if maxdc > 0 and dc + 1 >= maxdc:
                    expired.append((seq, True))
                    continue
                expired.append((seq, False))
            else:
                left = deadline - elapsed
                nxt = left if nxt is None else min(nxt, left)
        if expired:
            expired.sort()
            for seq, exhausted in expired:
                if exhausted:
                    self._max_deliveries(seq)
                    continue
                self.rdq.append(seq)
                self._rdq_set.add(seq)
                st.pending[seq][1] = now
            self._wake.unpark()
            nxt = 0
        return None if nxt is None else nxt / 1e9

    def _max_deliveries(self, seq: int) -> None:
        """Delivered max_deliver times without an ack: no longer pending, still counted
        as redelivered (server/consumer.go hasMaxDeliveries)."""
        st = self.st
        deliveries = st.rdc.get(seq, 0) + 1
        p = st.pending.pop(seq)
        st.rdc[seq] = deliveries
        self._move_ack_floor(p[0], seq)
        self.cstore.record(OP_ACK, seq, p[0])
        self._note_state_change()
        self._state_wake.unpark()
        self._wake.unpark()
        self.js.advisory(
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.%s.%s" % (self.stream.name, self.name),
            "io.nats.jetstream.advisory.v1.max_deliver",
            {"stream": self.stream.name, "consumer": self.name, "stream_seq": seq,
             "deliveries": deliveries}, self.stream.jsa.account)

    # ---- acknowledgements -----------------------------------------------------------------

    def _on_ack(self, sub, subject, reply, hdr, msg) -> None:
        body = msg[hdr:] if hdr and hdr > 0 else msg
        toks = subject.split(b".")
        if len(toks) != 9 and len(toks) < 11:
            return
        off = 2 if len(toks) == 9 else 4
        try:
            dc = int(toks[off + 2])
            sseq = int(toks[off + 3])
            dseq = int(toks[off + 4])
        except ValueError:
            return
        self._last_activity = trio.current_time()
        reply_ok = True
        if not body or body == ACK_ACK or body == ACK_OK:
            self._ack(sseq, dseq)
            reply_ok = self._ack_answered(sseq)
        elif body.startswith(ACK_NEXT):
            self._ack(sseq, dseq)
            if reply:
                self._on_next(sub, subject, reply, -1, body[len(ACK_NEXT):].strip())
            reply_ok = False
        elif body.startswith(ACK_NAK):
            self._nak(sseq, dseq, dc, body[len(ACK_NAK):].strip())
        elif body == ACK_PROGRESS:
            p = self.st.pending.get(sseq)
            if p is not None:
                p[1] = now_ns()
        elif body.startswith(ACK_TERM):
            reason = body[len(ACK_TERM):].strip().decode("utf-8", "replace")
            reply_ok = self._term(sseq, dseq, reason or None, dc)
        if reply and reply_ok:
            if self.cstore.durable and self.cstore.dirty():
                self._ack_waiters.append(reply)
                self._state_wake.unpark()
            else:
                self.server.deliver(self.stream.jsa.account, reply, None, b"")

    def _ack_answered(self, sseq: int) -> bool:
        """Whether an ack (or term) of ``sseq`` with a reply subject is answered:
        server/consumer.go processAckMsg answers every ack below the next sequence to
        deliver, changed anything or not, except on an ack-none consumer of a limits
        stream."""
        if sseq >= self.st.sseq:
            return False
        return not (self.ack_none and self.stream.cfg["retention"] == "limits")

    def _ack(self, sseq: int, dseq: int) -> bool:
        """server/consumer.go processAckMsg; False when the ack changed nothing."""
        st = self.st
        if sseq >= st.sseq:
            return False
        if self.ack_none:
            return False
        # server/consumer.go updateAcks stamps the ack floor's last_active.
        if self.ack_all:
            if dseq <= st.adflr or sseq <= st.asflr:
                return True
            self._lat = now_ns()
            st.adflr, st.asflr = dseq, sseq
            acked = [s for s in st.pending if s <= sseq]
            for s in acked:
                del st.pending[s]
                st.rdc.pop(s, None)
                self._rdq_set.discard(s)
            if acked:
                self.rdq = [s for s in self.rdq if s > sseq]
            self.cstore.record(OP_FLOOR, sseq, dseq)
            if self.stream.cfg["retention"] != "limits":
                for s in acked:
                    self.stream.check_interest_retention(s)
        else:
            self._lat = now_ns()
            p = st.pending.pop(sseq, None)
            st.rdc.pop(sseq, None)
            if sseq in self._rdq_set:
                self._rdq_set.discard(sseq)
                self.rdq.remove(sseq)
            if p is None:
                return False
            self._move_ack_floor(p[0], sseq)
            self.cstore.record(OP_ACK, sseq, p[0])
            if self.stream.cfg["retention"] != "limits":
                self.stream.check_interest_retention(sseq)
        self._note_state_change()
        self._state_wake.unpark()
        self._wake.unpark()
        return True

    def _move_ack_floor(self, dseq: int, sseq: int) -> None:
        st = self.st
        if not st.pending:
            st.adflr, st.asflr = st.dseq - 1, st.sseq - 1
        elif dseq == st.adflr + 1:
            st.adflr, st.asflr = dseq, sseq
            low = min(st.pending)
            st.asflr = low - 1
            st.adflr = st.pending[low][0] - 1

    def _nak(self, sseq: int, dseq: int, dc: int, arg: bytes) -> None:
        st = self.st
        if dseq <= st.adflr or dseq >= st.dseq:
            return
        p = st.pending.get(sseq)
        if p is None:
            return
        self.js.advisory(
            "$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.%s.%s" % (self.stream.name, self.name),
            "io.nats.jetstream.advisory.v1.nak",
            {"stream": self.stream.name, "consumer": self.name, "consumer_seq": dseq,
             "stream_seq": sseq, "deliveries": dc}, self.stream.jsa.account)
        if arg:
            delay = None
            try:
                if arg.startswith(b"{"):
                    delay = int(json.loads(arg).get("delay", 0))
                else:
                    delay = parse_go_duration(arg.decode())
            except (ValueError, TypeError, AttributeError):
                self.server.log.warn("JetStream consumer '%s > %s > %s' bad NAK delay value: %r",
                                     self.stream.jsa.name, self.stream.name, self.name, arg)
            if delay is not None:
                if sseq in self._rdq_set:
                    self._rdq_set.discard(sseq)
                    self.rdq.remove(sseq)
                p[1] = now_ns() - self.cfg["ack_wait"] + delay
                self._wake.unpark()
                return
        if sseq not in self._rdq_set:
            self.rdq.append(sseq)
            self._rdq_set.add(sseq)
        self._wake.unpark()

    def _term(self, sseq: int, dseq: int, reason: str | None, dc: int = 1) -> bool:
        """server/consumer.go processTerm: an ack that stops redelivery, and always an
        advisory; whether a +TERM with a reply subject is answered."""
        self._ack(sseq, dseq)
        body = {"stream": self.stream.name, "consumer": self.name, "consumer_seq": dseq,
                "stream_seq": sseq, "deliveries": dc}
        if reason:
            body["reason"] = reason
        self.js.advisory(
            "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.%s.%s" % (self.stream.name, self.name),
            "io.nats.jetstream.advisory.v1.terminated", body, self.stream.jsa.account)
        return self._ack_answered(sseq)

    # ---- flow control (push) --------------------------------------------------------------

    def _send_flow_control(self, pub) -> None:
        fcid = ("$JS.FC.%s.%s.%s" % (self.stream.name, self.name,
                                     "".join(random.choice(_NAME_CHARS) for _ in range(4))))
        self._fcid = fcid.encode()
        self._fcsz = self._pbytes
        h = H.make(100, "FlowControl Request")
        pub(self.cfg["deliver_subject"].encode(), self._fcid, h, len(h))

    def _publish_now(self, subject: bytes, reply: bytes | None, msg: bytes, hdr: int = -1,
                     shown: bytes | None = None) -> None:
        self.server.deliver(self.stream.jsa.account, subject, reply, msg, hdr)

    def _on_fc(self, sub, subject, reply, hdr, msg) -> None:
        if self._fcid is None or subject != self._fcid:
            return
        if self._maxpb < FC_MAX_BYTES:
            self._maxpb = min(self._maxpb * 2, FC_MAX_BYTES)
        self._pbytes = max(self._pbytes - self._fcsz, 0)
        self._fcid = None
        self._fcsz = 0
        self._wake.unpark()
        if self.ack_fc and hdr is not None and hdr > 0:
            # server/consumer.go processFlowControl: the reply says how far the other
            # side has stored, which acknowledges everything up to there.
            h = msg[:hdr]
            lsseq = H.get(h, H.LAST_STREAM)
            ldseq = H.get(h, H.LAST_CONSUMER)
            if lsseq and lsseq.isdigit() and int(lsseq) > 0:
                self._ack(int(lsseq), int(ldseq) if ldseq and ldseq.isdigit() else 0)

    # ---- durable state ---------------------------------------------------------------------

    @property
    def _state_wake(self):
        lot = getattr(self, "_state_lot", None)
        if lot is None:
            lot = self._state_lot = trio.lowlevel.ParkingLot()
        return lot

    def _note_state_change(self) -> None:
        """Something a snapshot keeps changed: written within SNAPSHOT_INTERVAL."""
        self._state_changed = True
        if self._state_idle:
            self._state_idle = False
            self._state_wake.unpark()

    async def _state_loop(self) -> None:
        """Group commit for acknowledgements, and periodic snapshots of the rest.  A
        consumer with nothing to write sleeps until something changes: thousands of
        idle consumers cost no timer each."""
        cstore = self.cstore
        while True:
            if not cstore.dirty() and not self._ack_waiters:
                if not self._state_changed:
                    self._state_idle = True
                    await self._state_wake.park()
                    self._state_idle = False
                    continue
                with trio.move_on_after(SNAPSHOT_INTERVAL):
                    await self._state_wake.park()
                if self._state_changed and not cstore.dirty():
                    self._state_changed = False
                    await self._snapshot()
                continue
            waiters = self._ack_waiters
            self._ack_waiters = []
            try:
                await cstore.sync()
            except OSError as exc:
                self.server.log.error("JetStream consumer '%s > %s > %s' state sync failed: %s",
                                      self.stream.jsa.name, self.stream.name, self.name, exc)
                # An acknowledgement that is not on disk is not confirmed: the client
                # hears 503 (its AckSync fails and it may ack again), never silence.
                for reply in waiters:
                    self._status(reply, 503, "Consumer State Not Stored")
                # The acks stay buffered; try again on the next one or a little later,
                # not in a tight loop against a full disk.
                with trio.move_on_after(STATE_RETRY):
                    await self._state_wake.park()
                continue
            acc = self.stream.jsa.account
            for reply in waiters:
                self.server.deliver(acc, reply, None, b"")
            if cstore.needs_snapshot():
                await self._snapshot()

    async def _snapshot(self) -> None:
        if not self.cstore.durable:
            return
        try:
            if getattr(self.cstore, "inline", False):
                self.cstore.snapshot(_copy_state(self.st))
            else:
                await trio.to_thread.run_sync(self.cstore.snapshot, _copy_state(self.st))
        except OSError as exc:
            self.server.log.error("JetStream consumer '%s > %s > %s' snapshot failed: %s",
                                  self.stream.jsa.name, self.stream.name, self.name, exc)

    # ---- info ---------------------------------------------------------------------------

    def info(self, dynamic: bool = True) -> dict:
        """ConsumerInfo; ``dynamic`` adds the server's version and API level to the
        metadata (every reply but CONSUMER.LIST's, server/jetstream_api.go)."""
        st = self.st
        cfg = with_dynamic_metadata(self.cfg, self.js.version) if dynamic else self.cfg
        delivered = {"consumer_seq": max(st.dseq - 1, 0), "stream_seq": max(st.sseq - 1, 0)}
        if self._ldt:
            delivered["last_active"] = rfc3339_nano(self._ldt)
        ack_floor = {"consumer_seq": st.adflr, "stream_seq": st.asflr}
        if self._lat:
            ack_floor["last_active"] = rfc3339_nano(self._lat)
        out = {
            "stream_name": self.stream.name,
            "name": self.name,
            "created": rfc3339_nano(self.created),
            "config": config_json(cfg),
            "delivered": delivered,
            "ack_floor": ack_floor,
            "num_ack_pending": len(st.pending),
            "num_redelivered": len(st.rdc) if self.cfg["max_deliver"] != 1 else 0,
            "num_waiting": len(self.waiting),
            "num_pending": self.num_pending(),
        }
        # server/consumer.go: only a consumer with a Raft group reports a cluster.
        if self.replica is not None:
            out["cluster"] = self.replica.cluster_info()
        elif self.stream.replica is not None:
            out["cluster"] = self.stream.replica.cluster_info()
        groups = self.cfg.get("priority_groups")
        if groups:
            # server/consumer.go PriorityGroupState of the first group only.
            out["priority_groups"] = [self.pin.state(groups[0])]
        if self.push and self.active:
            out["push_bound"] = True
        if self.paused_until and now_ns() < self.paused_until:
            out["paused"] = True
            out["pause_remaining"] = self.paused_until - now_ns()
        out["ts"] = rfc3339_nano(now_ns())
        return out

    def update_config(self, cfg: dict) -> None:
        old = self.cfg
        self.cfg = cfg
        self.filters = filters_of(cfg)
        self._bfilters = [f.encode() for f in self.filters]
        self.paused_until = _pause_ahead(cfg)
        self.policy = cfg["priority_policy"]
        if old.get("pause_until") != cfg.get("pause_until") and self._leading:
            # server/consumer.go updateConfig: the leader tells of a new pause (or its
            # end); the deadline parsed, not its text, tells whether it changed.
            if pause_ns(old) != pause_ns(cfg):
                P.pause_advisory(self, cfg, self.paused_until)
        if old["rate_limit_bps"] != cfg["rate_limit_bps"]:
            if self.pacer is None:
                self.pacer = Pacer.for_consumer(self)
            else:
                self.pacer.rate = cfg["rate_limit_bps"] / 8.0 if self.push else 0.0
        if old["deliver_subject"] != cfg["deliver_subject"]:
            self.active = False
            if self.watched is not None:
                self.js.watch_deliver(self, cfg["deliver_subject"])
            self.check_interest()
        self._pending_reset()
        self._wake.unpark()

    @property
    def durable(self) -> bool:
        return is_durable(self.cfg)


def _pause_ahead(cfg: dict) -> int:
    """When the pause of ``cfg`` ends, 0 when it has already ended (or there is none):
    the deliveries wait until then, and its end is announced then."""
    until = pause_ns(cfg)
    return until if until > now_ns() else 0


def _copy_state(st: ConsumerState) -> ConsumerState:
    c = ConsumerState(st.sseq, st.dseq)
    c.asflr, c.adflr = st.asflr, st.adflr
    c.pending = {s: list(p) for s, p in st.pending.items()}
    c.rdc = dict(st.rdc)
    c.acked_ahead = set(st.acked_ahead)
    return c


RESET_REQUEST = Struct("JSApiConsumerResetRequest", {"seq": "uint64"})
RESET_RESPONSE = "io.nats.jetstream.api.v1.consumer_reset_response"

# server/jetstream_api.go JSApiConsumerGetNextRequest with its embedded PriorityGroup,
# decoded through a pointer, so Go names the struct "" in its errors.
NEXT_REQUEST = Struct("", {
    "expires": "duration", "batch": "int", "max_bytes": "int", "no_wait": "bool",
    "idle_heartbeat": "duration", "group": "string", "min_pending": "int64",
    "min_ack_pending": "int64", "id": "string", "priority": "int"})


def _parse_next_request(body: bytes):
    """server/consumer.go nextReqFromMsg: (batch, expires ns, max_bytes, no_wait, hb ns,
    priority group or None); ValueError with Go's words for a body json.Unmarshal
    refuses."""
    req = body.strip()
    if not req:
        return 1, 0, 0, False, 0, None
    if req[:1] == b"{":
        try:
            d = unmarshal(req, NEXT_REQUEST)
        except DecodeError as exc:
            raise ValueError(str(exc)) from None
        batch = d.get("batch", 0)
        expires = d.get("expires", 0)
        max_bytes = d.get("max_bytes", 0)
        no_wait = d.get("no_wait", False)
        hb = d.get("idle_heartbeat", 0)
        if hb > 0 and hb * 2 > expires:
            raise ValueError("heartbeat value too large")
        # A JSON request always has a priority group in Go (its fields, maybe empty).
        return batch, expires, max_bytes, no_wait, hb, P.PriorityRequest(d)
    if _ATOI.match(req) and -(1 << 63) <= int(req) < (1 << 63):   # Go's strconv.Atoi
        return int(req), 0, 0, False, 0, None
    return 1, 0, 0, False, 0, None


_ATOI = re.compile(rb"^[+-]?[0-9]+$")


__all__ = ["Consumer", "ephemeral_name", "ApiError"]
