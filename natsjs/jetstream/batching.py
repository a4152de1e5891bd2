"""Atomic batch publish: streams with ``allow_atomic`` (ADR-50), as nats-server has it.

A client publishes a batch as messages carrying ``Nats-Batch-Id: <id>`` (at most 64
bytes) and ``Nats-Batch-Sequence: 1, 2, ...``; the last one carries
``Nats-Batch-Commit: 1`` (it is stored too) or ``Nats-Batch-Commit: eob`` (an
end-of-batch marker, not stored; the last stored message gets ``Nats-Batch-Commit: 1``
instead).  Until the commit the messages are staged, each answered with an empty
message; at the commit every message is checked as nats-server checks a batch
(server/jetstream_batching.go checkMsgHeadersPreClusteredProposal: an expected last
sequence only on the first message, no expected check or rollup on a subject already
written in the batch, no message id twice, discard-new limits counted for the whole
batch, no ``Nats-Expected-Last-Msg-Id``) and then either all are stored or none is.  The
commit's PubAck is ``{"stream":..,"seq":<last>,"batch":"<id>","count":<n>}``.  A gap,
an unknown batch, a batch idle for longer than the timeout (10 s) or one over 1000
messages is abandoned; a stream holds at most 50 open batches, a server 1000
(``jetstream { limits { batch { max_inflight_per_stream, max_inflight_total, max_msgs,
timeout } } }``).  server/stream.go processJetStreamAtomicBatchMsg.

Where the batch is staged: in memory on the stream's leader (``Batches``, one per
stream).  On a single server the commit checks and stores the batch in one go, inside
one ingest batch, so one fsync covers all of it and the PubAck follows that fsync; a
restart finds either all of it or, if the process died while the batch was being
written, drops the batch's messages from the end of the store (``drop_partial_tail``).
On a replicated stream the leader proposes the committed batch as one Raft entry
(``E_ATOMIC``); every replica applies it with the same checks (``commit``), so each
stores all of it or none, and the leader answers once a quorum has the entry fsynced.
"""
from __future__ import annotations

import json
import re
import weakref

import trio

from natsjs.jetstream import counters
from natsjs.jetstream import headers as H
from natsjs.jetstream.entries import decode_atomic, encode_atomic
from natsjs.jetstream.errors import ApiError

BATCH_ID = b"Nats-Batch-Id"
BATCH_SEQ = b"Nats-Batch-Sequence"
BATCH_COMMIT = b"Nats-Batch-Commit"
BATCH_KEYS = b"Nats-Batch-"      # the family of the three
REQUIRED_API_LEVEL = b"Nats-Required-Api-Level"

# server/stream.go streamDefaultMaxBatchTimeout and the atomic batch limits.
DEFAULT_TIMEOUT = 10.0
DEFAULT_INFLIGHT_PER_STREAM = 50
DEFAULT_INFLIGHT_TOTAL = 1000
DEFAULT_MAX_MSGS = 1000
MAX_ID_LEN = 64
ABANDONED = "$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED."
ABANDONED_TYPE = "io.nats.jetstream.advisory.v1.stream_batch_abandoned"

# The headers a batch's checks read (any of them makes a message worth checking).
_CHECKED = re.compile(rb"\r\nNats-(?:Expected-|Incr|TTL|Msg-Id|Stream-Source|Rollup)")

# Open batches per server (nats-server's globalInflightAtomicBatches), by JetStream.
_inflight: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def batch_id(hdr: bytes | None) -> bytes | None:
    """The message's batch id (None: not part of a batch; an empty value is none)."""
    if not hdr or BATCH_ID not in hdr:
        return None
    return H.get(hdr, BATCH_ID) or None


def _limits(js):
    lim = js.opts.limits
    return (lim.max_batch_inflight_per_stream or DEFAULT_INFLIGHT_PER_STREAM,
            lim.max_batch_inflight_total or DEFAULT_INFLIGHT_TOTAL,
            lim.max_batch_size or DEFAULT_MAX_MSGS,
            lim.max_batch_timeout or DEFAULT_TIMEOUT)


class _Batch:
    __slots__ = ("msgs", "deadline")

    def __init__(self, deadline: float):
        self.msgs: list = []
        self.deadline = deadline


class Batches:
    """The open atomic batches of one stream (on its leader)."""

    def __init__(self, stream):
        self.stream = stream
        self.open: dict[bytes, _Batch] = {}
        self._reaping = False

    def _drop(self, bid: bytes, reason: str = "") -> None:
        """Forget a batch; with a ``reason`` it was abandoned, which nats-server announces
        (stream.go sendStreamBatchAbandonedAdvisory)."""
        if self.open.pop(bid, None) is None:
            return
        js = self.stream.js
        _inflight[js] = _inflight.get(js, 1) - 1
        if reason:
            stream = self.stream
            js.advisory(ABANDONED + stream.name, ABANDONED_TYPE,
                        {"stream": stream.name, "batch": bid.decode("utf-8", "replace"),
                         "reason": reason}, stream.jsa.account)

    def clear(self) -> None:
        """Forget every open batch (the stream stopped, lost its leadership or no longer
        allows atomic publish)."""
        for bid in list(self.open):
            self._drop(bid)

    def _expire(self, now: float) -> None:
        for bid, b in list(self.open.items()):
            if b.deadline <= now:
                self._drop(bid, "timeout")

    async def _reap(self) -> None:
        """Abandon each batch when its timeout runs out (while there are open ones)."""
        try:
            while self.open:
                await trio.sleep_until(min(b.deadline for b in self.open.values()))
                self._expire(trio.current_time())
        finally:
            self._reaping = False

    def add(self, subject: bytes, hdr: bytes, msg: bytes):
        """One message of a batch, on arrival.  Returns an ApiError (the batch, if any, is
        abandoned), None (staged: answer with an empty message), or, at the commit, the
        batch's messages ``[(subject, hdr, msg), ...]`` (the commit's headers as they
        will be stored)."""
        stream = self.stream
        cfg = stream.cfg
        if cfg["sealed"]:
            return ApiError.of("JSStreamSealedErr")
        max_size = cfg["max_msg_size"]
        if max_size >= 0 and (len(hdr) > max_size or len(msg) > max_size - len(hdr)):
            return ApiError.of("JSStreamMessageExceedsMaximumErr")
        if not cfg["allow_atomic"]:
            return ApiError.of("JSAtomicPublishDisabledErr")
        bid = H.get(hdr, BATCH_ID)
        if len(bid) > MAX_ID_LEN:
            return ApiError.of("JSAtomicPublishInvalidBatchIDErr")
        raw = H.get(hdr, BATCH_SEQ)
        if raw is None or not raw.isdigit():
            return ApiError.of("JSAtomicPublishMissingSeqErr")
        seq = int(raw)
        commit = H.get(hdr, BATCH_COMMIT)
        eob = commit == b"eob"
        per_stream, total, max_msgs, timeout = _limits(stream.js)
        now = trio.current_time()
        b = self.open.get(bid)
        if b is not None and b.deadline <= now:
            self._drop(bid, "timeout")
            b = None
        if b is None:
            self._expire(now)
            if seq != 1:
                if seq - (1 if eob else 0) > max_msgs:
                    return ApiError.of("JSAtomicPublishTooLargeBatchErrF", size=max_msgs)
                return ApiError.of("JSAtomicPublishIncompleteBatchErr")
            if len(self.open) + 1 > per_stream:
                return ApiError.of("JSAtomicPublishTooManyInflight")
            js = stream.js
            if _inflight.get(js, 0) + 1 > total:
                return ApiError.of("JSAtomicPublishTooManyInflight")
            _inflight[js] = _inflight.get(js, 0) + 1
            b = self.open[bid] = _Batch(now + timeout)
            if not self._reaping:
                self._reaping = True
                js.spawn(self._reap)
        if commit is not None and not eob and commit != b"1":
            self._drop(bid)
            return ApiError.of("JSAtomicPublishInvalidBatchCommitErr")
        if REQUIRED_API_LEVEL in hdr and H.get(hdr, REQUIRED_API_LEVEL):
            from natsjs.jetstream import apicore, streamcfg
            if apicore.required_level(hdr) > streamcfg.API_LEVEL:
                self._drop(bid, "unsupported")
                return ApiError.of("JSRequiredApiLevelErr")
            hdr = H.remove(hdr, REQUIRED_API_LEVEL)
        b.deadline = now + timeout
        if len(b.msgs) + 1 != seq or (seq == 1 and eob):
            self._drop(bid, "incomplete")
            return ApiError.of("JSAtomicPublishIncompleteBatchErr")
        if seq - (1 if eob else 0) > max_msgs:
            self._drop(bid, "large")
            return ApiError.of("JSAtomicPublishTooLargeBatchErrF", size=max_msgs)
        if commit is None:
            b.msgs.append((subject, hdr, msg))
            return None
        self._drop(bid)
        msgs = b.msgs
        if eob:
            s, h, m = msgs[-1]
            msgs[-1] = (s, H.add(h, BATCH_COMMIT, b"1"), m)
        else:
            msgs.append((subject, hdr, msg))
        return msgs


# ---- the commit: check everything, then store everything --------------------------------

def _uint(raw: bytes | None):
    return int(raw) if raw is not None and raw.isdigit() else None


def _check(stream, msgs: list, ts: int):
    """server/jetstream_batching.go checkMsgHeadersPreClusteredProposal over the whole
    batch, before anything is stored: None, or the ApiError refusing the batch."""
    cfg = stream.cfg
    store = stream.store
    # Messages the C capture stored since the stream last looked are the last ones.
    lseq = store.last_seq if stream._sink.captured else stream.lseq
    msg_ids: set = set()
    inflight: dict = {}            # subject -> (messages, bytes) in this batch
    expected: dict = {}            # subject -> the sequence an expected check saw
    counted: set = set()
    itr = stream._itr
    for k, (subject, hdr, msg) in enumerate(msgs):
        if itr is not None:
            subject = itr.apply(subject.decode()).encode()
        # Only the batch's own headers (the common case): none of the checks applies.
        checked = hdr is not None and _CHECKED.search(hdr) is not None
        if checked and H.get(hdr, H.EXPECTED_LAST_MSG_ID):
            return ApiError.of("JSAtomicPublishUnsupportedHeaderBatchErr",
                               header=H.EXPECTED_LAST_MSG_ID.decode())
        incr = None
        if hdr and len(hdr) > 65535:
            return ApiError.of("JSStreamHeaderExceedsMaximumErr")
        if checked:
            if counters.INCR in hdr:
                incr = counters.check_incr(cfg, hdr, msg, False)
                if incr.__class__ is ApiError:
                    return incr
            name = H.get(hdr, H.EXPECTED_STREAM)
            if name and name.decode("utf-8", "replace") != stream.name:
                return ApiError.of("JSStreamNotMatchErr")
            raw_ttl = H.get(hdr, H.MSG_TTL)
            if raw_ttl:
                ttl = H.parse_ttl(raw_ttl)
                if ttl is None or ttl != 0:
                    if not cfg["allow_msg_ttl"]:
                        return ApiError.of("JSMessageTTLDisabledErr")
                    if ttl is None:
                        return ApiError.of("JSMessageTTLInvalidErr")
            mid = H.get(hdr, H.MSG_ID)
            if mid:
                if mid in msg_ids:
                    return ApiError.of("JSAtomicPublishContainsDuplicateMessageErr")
                if stream._check_msg_id(mid.decode("utf-8", "replace"), ts) is not None:
                    return ApiError.of("JSAtomicPublishContainsDuplicateMessageErr")
                msg_ids.add(mid)
            if H.get(hdr, H.STREAM_SOURCE):
                return ApiError.of("JSMessageSourceHdrNotAllowedErr")
        if cfg["allow_msg_counter"]:
            if incr is None:
                return ApiError.of("JSMessageIncrMissingErr")
            if subject not in counted:
                counted.add(subject)
                out = counters.apply(store, subject, hdr, msg, incr,
                                     stream.server.opts.max_payload)
                if out.__class__ is ApiError:
                    return out
        if checked:
            raw = H.get(hdr, H.EXPECTED_LAST_SEQ)
            if raw is not None:
                want = _uint(raw)
                if want is None or want != lseq + k:
                    return ApiError.of("JSStreamWrongLastSequenceErrF", seq=lseq + k)
                if inflight:
                    return ApiError.of("JSStreamWrongLastSequenceConstantErr")
            raw = H.get(hdr, H.EXPECTED_LAST_SUBJ_SEQ)
            if raw is not None:
                want = _uint(raw)
                seq_subj = H.get(hdr, H.EXPECTED_LAST_SUBJ_SEQ_SUBJ) or subject
                if seq_subj in inflight:
                    return ApiError.of("JSStreamWrongLastSequenceConstantErr")
                have = expected.get(seq_subj)
                if have is None:
                    last = store.load_last(seq_subj)
                    have = last[0] if last is not None else 0
                    if want != have:
                        return ApiError.of("JSStreamWrongLastSequenceErrF", seq=have)
                    expected[seq_subj] = have
                elif want != have:
                    return ApiError.of("JSStreamWrongLastSequenceErrF", seq=have)
            elif H.get(hdr, H.EXPECTED_LAST_SUBJ_SEQ_SUBJ):
                return ApiError.of("JSStreamExpectedLastSeqPerSubjectInvalid")
            r = H.get(hdr, H.ROLLUP)
            if r:
                if not (cfg["allow_rollup_hdrs"] and not cfg["deny_purge"]):
                    return ApiError.of("JSStreamRollupFailedF", err="rollup not permitted")
                r = r.decode("utf-8", "replace").lower()
                if r == "sub":
                    if subject in inflight:
                        return ApiError.of("JSStreamRollupFailedF",
                                           err="batch rollup sub invalid")
                elif r == "all":
                    if inflight:
                        return ApiError.of("JSStreamRollupFailedF",
                                           err="batch rollup all invalid")
                else:
                    return ApiError.of("JSStreamRollupFailedF", err="rollup value invalid: %s"
                                       % json.dumps(r, ensure_ascii=False))
        n, size = inflight.get(subject, (0, 0))
        n += 1
        inflight[subject] = (n, size + stream.msg_size(subject, hdr, msg))
        if cfg["discard"] == "new":
            if cfg["max_msgs"] > 0 or cfg["max_bytes"] > 0:
                msgs_total = store.msgs + sum(v[0] for v in inflight.values())
                bytes_total = store.bytes + sum(v[1] for v in inflight.values())
                if cfg["max_msgs"] > 0 and msgs_total > cfg["max_msgs"]:
                    return ApiError.of("JSStreamStoreFailedF", err="maximum messages exceeded")
                if cfg["max_bytes"] > 0 and bytes_total > cfg["max_bytes"]:
                    return ApiError.of("JSStreamStoreFailedF", err="maximum bytes exceeded")
            mmp = cfg["max_msgs_per_subject"]
            if cfg["discard_new_per_subject"] and mmp > 0 and not (hdr and H.get(hdr, H.ROLLUP)):
                if store.subject_state(subject)[0] + n > mmp:
                    return ApiError.of("JSStreamStoreFailedF",
                                       err="maximum messages per subject exceeded")
    return None


def commit(stream, bid: bytes, msgs: list, ts: int = 0):
    """Store a committed batch, all of it or none: the commit's PubAck (bytes) or the
    ApiError.  Runs on a single server at ingest and on every replica at apply."""
    err = _check(stream, msgs, ts)
    if err is not None:
        return err
    store = stream.store
    before = store.last_seq
    out = None
    for subject, hdr, msg in msgs:
        out = stream._process(subject, hdr, msg, ts)
        if out.__class__ is ApiError:
            # The checks above let through what the store then refused (a limit they
            # do not model): take back what this batch stored.
            stream.server.log.warn("JetStream stream '%s > %s': atomic batch refused "
                                   "while stored (%s); rolled back", stream.jsa.name,
                                   stream.name, out.description)
            if store.last_seq > before:
                store.truncate(before)
            stream.lseq = store.last_seq
            return out
    return b"%s%d,\"batch\":%s,\"count\":%d}" % (
        stream._pub_ack_prefix, stream.lseq,
        json.dumps(bid.decode("utf-8", "replace"), ensure_ascii=False).encode(), len(msgs))


def publish(stream, subject: bytes, hdr: bytes, msg: bytes):
    """A batch message on a single server (Stream.process): the reply body (b"" while
    staged), or an ApiError."""
    b = stream.batches
    if b is None:
        b = stream.batches = Batches(stream)
    out = b.add(subject, hdr, msg)
    if out is None:
        return b""
    if out.__class__ is ApiError:
        return out
    return commit(stream, H.get(hdr, BATCH_ID), out)


# ---- a replicated stream's entry ------------------------------------------------------------

def stage_on_leader(stream, subject: bytes, reply, hdr: bytes, msg: bytes, ts: int):
    """A batch message captured by a replicated stream's leader: ``(entry, None)`` to
    propose at the commit, or ``(None, answer)`` (b"" while staged, or an error body)."""
    b = stream.batches
    if b is None:
        b = stream.batches = Batches(stream)
    out = b.add(subject, hdr, msg)
    if out is None:
        return None, b""
    if out.__class__ is ApiError:
        return None, stream._error_reply(out)
    return encode_atomic(H.get(hdr, BATCH_ID), out, ts), None


def apply_entry(stream, data: bytes):
    """A committed E_ATOMIC entry on a replica: the PubAck or error body."""
    bid, msgs, ts = decode_atomic(data)
    stream.set_batch_time(ts)
    out = commit(stream, bid, msgs, ts)
    if out.__class__ is ApiError:
        return stream._error_reply(out)
    return out


# ---- restart ---------------------------------------------------------------------------------

def drop_partial_tail(store) -> int:
    """A single server's store after a restart: the messages at its end that belong to a
    batch whose commit was never written (the process died while writing it) are
    removed.  Returns how many."""
    last = store.last_seq
    if not last:
        return 0
    rec = store.load(last)
    if rec is None:
        return 0
    hdr = rec[1]
    bid = batch_id(hdr)
    if bid is None or H.get(hdr, BATCH_COMMIT):
        return 0
    first = last
    while first > 1:
        prev = store.load(first - 1)
        if prev is None or batch_id(prev[1]) != bid or H.get(prev[1], BATCH_COMMIT):
            break
        first -= 1
    store.truncate(first - 1)
    return last - first + 1
