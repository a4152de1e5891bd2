"""Catching a stream replica up with messages its Raft log no longer has.

When a replica falls so far behind that its stream's leader has compacted the log past
what it misses (a server down for a long time, a new peer after a peer-remove), Raft
sends it a snapshot instead of the entries (natsjs/jetstream/replicated.py): the
snapshot says how far the stream goes, not what it holds.  The replica then fetches
the missing messages from the current leader, a chunk at a time (bounded memory on
both sides): request ``{"first", "last"}`` on ``$JSC.CU.<group>`` in the system
account; the leader's replica answers with up to ``CHUNK_MSGS`` messages (or
``CHUNK_BYTES``) from its store, deleted ones skipped.  Entries committed meanwhile
wait until the replica has caught up, then apply in order.  A replica resetting after
it failed to apply an entry first asks ``{"state": true}``: the leader's last sequence
and the last entry its store holds.
"""
from __future__ import annotations

import json
import struct

import trio

from natsjs.jetstream.entries import NO_HDR

CHUNK_MSGS = 2048
CHUNK_BYTES = 4 * 1024 * 1024
_REC = struct.Struct("<QqHI")        # seq, ts, subject length, header length (or NO_HDR)


def encode_chunk(store, first: int, last: int) -> tuple[bytes, int]:
    """Messages of ``store`` from ``first`` up to ``last``: the chunk and the next
    sequence to ask for."""
    out = []
    size = 0
    seq = first
    n = 0
    while seq <= last and n < CHUNK_MSGS and size < CHUNK_BYTES:
        rec = store.load_next(seq)
        if rec is None or rec[0] > last:
            seq = last + 1
            break
        s, subject, hdr, msg, ts = rec
        out.append(_REC.pack(s, ts, len(subject), NO_HDR if hdr is None else len(hdr)))
        out.append(subject)
        if hdr is not None:
            out.append(hdr)
        out.append(struct.pack("<I", len(msg)))
        out.append(msg)
        size += len(subject) + len(hdr or b"") + len(msg) + 24
        n += 1
        seq = s + 1
    return b"".join(out), seq


def decode_chunk(data: bytes):
    p = 0
    n = len(data)
    while p < n:
        seq, ts, slen, hlen = _REC.unpack_from(data, p)
        p += _REC.size
        subject = data[p:p + slen]
        p += slen
        hdr = None
        if hlen != NO_HDR:
            hdr = data[p:p + hlen]
            p += hlen
        (mlen,) = struct.unpack_from("<I", data, p)
        p += 4
        yield seq, subject, hdr, data[p:p + mlen], ts
        p += mlen


def serve(rep, sub, subject, reply, hdr, msg) -> None:
    """The leader's side: one chunk per request."""
    if not reply or not rep.is_leader() or rep.resetting is not None:
        return
    server = rep.server
    try:
        req = json.loads(msg)
        if req.get("state"):
            # A replica resetting (ReplicatedStream._reset): how far the store goes and
            # the last entry that went into it (applied in the same step: they agree).
            body = json.dumps({"applied": rep.raft.applied,
                               "last_seq": rep.stream.store.last_seq}).encode()
            server.deliver(server.system_account, reply, None, body)
            return
        first, last = int(req["first"]), int(req["last"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return
    data, nxt = encode_chunk(rep.stream.store, first, last)
    body = struct.pack("<Q", nxt) + data
    server.deliver(server.system_account, reply, None, body)


async def fetch(rep) -> None:
    """The lagging replica's side: ask the leader until the store reaches
    ``rep.catch_up_to`` (which a newer snapshot may raise meanwhile), make it durable,
    then ``rep.caught_up()``: only from then on does the group count this replica."""
    cluster = rep.cluster
    store = rep.stream.store
    seq = store.last_seq + 1
    while not rep.closed:
        last = rep.catch_up_to
        if last is None:
            return
        if store.last_seq >= last:
            break
        seq = max(seq, store.last_seq + 1)
        if rep.raft.node.voters == (cluster.me,):
            # No one else ever held it (a single replica whose store lost what its
            # snapshot counts): the sequence goes on without it.
            rep.server.log.error("JetStream cluster: stream '%s > %s' lost messages %d-%d "
                                 "and has no other replica to fetch them from",
                                 rep.acc_name, rep.name, store.last_seq + 1, last)
            store.skip(0, last - store.last_seq)
            break
        leader = rep.raft.leader
        if leader is None or leader == cluster.me:
            await trio.sleep(0.2)
            continue
        resp = await cluster.request_raw(b"$JSC.CU.%s" % rep.group.encode(),
                                         {"first": seq, "last": last}, 2.0)
        if rep.closed:
            return
        if resp is None or len(resp) < 8:
            await trio.sleep(0.2)
            continue
        (nxt,) = struct.unpack_from("<Q", resp, 0)
        for s, subject, hdr, msg, ts in decode_chunk(resp[8:]):
            if s > store.last_seq and s <= last:
                store.append(subject, hdr, msg, ts, s)
        if nxt <= seq or nxt > last:
            if store.last_seq < last:
                # What the leader no longer has was deleted meanwhile: the sequence
                # goes on.
                store.skip(0, last - store.last_seq)
        else:
            seq = nxt
    if rep.closed:
        return
    if rep.stream.is_file:
        s = store.begin_sync()
        await rep.js.fsync(s)
        store.mark_synced(s)
    if rep.closed:
        return
    rep.server.log.info("JetStream cluster: stream '%s > %s' caught up to %d",
                        rep.acc_name, rep.name, store.last_seq)
    rep.caught_up()
