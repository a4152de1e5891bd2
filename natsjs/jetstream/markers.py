"""Subject delete markers: what a stream with ``subject_delete_marker_ttl`` leaves behind
when age or a per-message TTL takes the last message of a subject.

Where it sits: the stream's expiry task (``Stream._expire_now``) finds messages whose
``max_age`` or ``Nats-TTL`` ran out and asks ``expire`` here instead of removing them.
A message that is the last one of its subject (and not a marker itself) is not
removed: a marker message goes through the stream's inbox and normal processing, with

    Nats-Marker-Reason: MaxAge
    Nats-TTL: <subject_delete_marker_ttl>
    Nats-Rollup: sub

so the rollup removes the expired message and watchers (KV, ``last_per_subject``
consumers) see that the subject was emptied; the marker expires in its turn and then
simply goes.  This is server/filestore.go and memstore.go expireMsgs /
handleRemovalOrSdm (the reason is ``MaxAge`` for TTLs too, as there), with their
2 second guard against proposing the same marker twice.
"""
from __future__ import annotations

import trio

from natsjs.jetstream import headers as H
from natsjs.jetstream.streamcfg import NS, go_duration

KV_OPERATION = b"KV-Operation"
PENDING_GUARD = 2.0       # a marker proposed for a message is not proposed again sooner


def is_marker(hdr: bytes | None) -> bool:
    """server/sdm.go isSubjectDeleteMarker: a marker, or a KV purge."""
    if not hdr:
        return False
    return bool(H.get(hdr, H.MARKER_REASON)) or H.get(hdr, KV_OPERATION) == b"PURGE"


def marker_header(ttl_ns: int) -> bytes:
    return H.make(0, "", [(H.MARKER_REASON, b"MaxAge"),
                          (H.MSG_TTL, go_duration(ttl_ns // NS * NS).encode()),
                          (H.ROLLUP, b"sub")])


class SubjectDeleteMarkers:
    def __init__(self, stream):
        self.stream = stream
        self.pending: dict[int, float] = {}     # seq -> when its marker was proposed

    def _header(self) -> bytes:
        return marker_header(self.stream.cfg["subject_delete_marker_ttl"])

    def expire_by_age(self, cutoff: int) -> bool:
        """Everything stored before ``cutoff`` (ns) goes, a marker standing in for the
        last of each subject; messages with ``Nats-TTL: never`` stay."""
        store = self.stream.store
        removed = False
        seq = store.first_seq
        while True:
            rec = store.load_next(seq)
            if rec is None or rec[4] > cutoff:
                break
            seq = rec[0] + 1
            hdr = rec[2]
            if hdr:
                ttl = H.get(hdr, H.MSG_TTL)
                if ttl is not None and ttl.strip().lower() == b"never":
                    continue
            removed = self.expire(rec[0], rec[1], hdr) or removed
        return removed

    def expire(self, seq: int, subject: bytes | None = None, hdr: bytes | None = None) -> bool:
        """Remove ``seq``, or propose a marker if it is the last of its subject.  True
        if something was removed now."""
        stream = self.stream
        store = stream.store
        if subject is None:
            rec = store.load(seq)
            if rec is None:
                self.pending.pop(seq, None)
                return False
            subject, hdr = rec[0], rec[1]
        now = trio.current_time()
        when = self.pending.get(seq)
        if when is not None and now - when < PENDING_GUARD:
            return False
        count = store.subject_state(subject)[0]
        if count == 1 and not is_marker(hdr):
            self.pending[seq] = now
            stream.enqueue(subject, self._store_marker, self._header(), b"")
            return False
        self.pending.pop(seq, None)
        if store.remove(seq):
            stream.message_gone(seq)
            return True
        return False

    def _store_marker(self, subject: bytes, hdr: bytes | None, msg: bytes) -> None:
        """Called by the stream's ingest task, in order with everything else."""
        self.stream.write_sourced(subject, hdr, msg)
        self.forget_gone()

    def forget_gone(self) -> None:
        """Drop the guard of markers whose expired message is gone."""
        store = self.stream.store
        for seq in [s for s in self.pending if store.load(s) is None]:
            del self.pending[seq]

    def waiting(self) -> bool:
        return bool(self.pending)


def min_ttl(cfg: dict, ttl: int, hdr: bytes | None):
    """server/stream.go: with markers on, a message TTL is at least the marker TTL (unless
    a subject keeps one message only), or a marker could outlive it; (ttl, header)."""
    sdm = cfg["subject_delete_marker_ttl"] // NS
    if ttl > 0 and sdm > 0 and cfg["max_msgs_per_subject"] != 1 and ttl < sdm:
        return sdm, H.set(hdr, H.MSG_TTL, b"%d" % sdm)
    return ttl, hdr


__all__ = ["SubjectDeleteMarkers", "is_marker", "marker_header", "min_ttl"]
