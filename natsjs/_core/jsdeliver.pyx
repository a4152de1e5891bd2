# cython: language_level=3
"""JetStream deliveries in C: stored records straight into subscribers' buffers.

Where it sits: a consumer (natsjs/jetstream/consumer.py) has a pull request waiting, or
an active push subscriber, and new messages in its stream.  Instead of loading each
message as Python objects and publishing them one by one, ``deliver_run`` walks the
log's index (natsjs/_core/filelog.pyx) from a sequence, reads each matching record in
place, writes its ack reply subject into a small buffer, and runs the fan-out
(natsjs/_core/fanout.pyx ClientCore.process_msg) with the record's headers and payload
as they lie in the log: routed on the deliver (or inbox) subject, shown with the
stored subject.  The consumer's Python code handles everything that is not this plain
case (redeliveries, last-per-subject, headers-only, pacing) and the bookkeeping of what
was delivered, from the (seq, ts) pairs this returns.

No trio, no I/O of its own beyond the log's reads (STYLE.md habit 1).
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

from natsjs._core.byteorder cimport ld16, ld32, ld64
from natsjs._core.fanout cimport ClientCore
from natsjs._core.filelog cimport FilterC, _Filter, _Log

DEF REC_HDR = 32          # filelog record header (see _Log.record_ptr)
DEF REC_SUM = 8
DEF ACK_MAX = 512


cdef inline char* _put_u64(char* p, uint64_t v) noexcept nogil:
    cdef char tmp[24]
    cdef int n = 0, i
    if v == 0:
        p[0] = c'0'
        return p + 1
    while v:
        tmp[n] = <char>(48 + v % 10)
        v //= 10
        n += 1
    for i in range(n):
        p[i] = tmp[n - 1 - i]
    return p + n


def deliver_run(_Log log, ClientCore pub, bytes route_subject, bytes ack_prefix,
                uint64_t start, uint64_t limit, filter, uint64_t dseq, int64_t pending,
                long max_msgs, int64_t max_bytes, list out):
    """Deliver up to ``max_msgs`` stored messages with sequences in [start, limit] that
    match ``filter`` (None: all), first delivery each (delivery count 1).

    Each goes out on ``route_subject`` with the reply
    ``<ack_prefix>1.<seq>.<dseq>.<ts>.<pending>`` (ack_prefix = "$JS.ACK.<stream>.
    <consumer>."), dseq counting up from ``dseq`` and pending down from ``pending``.
    ``max_bytes`` > 0 stops before a message that would pass it (counted as
    subject + reply + headers + payload, as nats-server counts a pull's max_bytes).
    ``(seq, ts, size)`` of every delivery is appended to ``out``.

    Returns (next sequence to look at, delivered, bytes counted, stopped_on_bytes).
    """
    cdef _Filter f = log.get_filter(filter)
    cdef uint64_t seq = start, nseq
    cdef uint32_t rlen, slen, hlen
    cdef const uint8_t* rec
    cdef char ack[ACK_MAX]
    cdef char* p
    cdef Py_ssize_t plen = PyBytes_GET_SIZE(ack_prefix)
    cdef long n = 0
    cdef int64_t sent = 0, size, ts
    cdef bint stopped = False
    if plen > ACK_MAX - 100:
        raise ValueError("ack prefix too long")
    memcpy(ack, PyBytes_AS_STRING(ack_prefix), plen)
    while n < max_msgs and seq <= limit:
        nseq = log.next_match(seq, &f.c)
        if nseq == 0 or nseq > limit:
            # Nothing more that matches up to the limit: look after it next time.
            seq = limit + 1
            break
        rec = log.record_ptr(nseq, &rlen)
        if rec == NULL:              # a corrupt record: reported by the log, skipped
            seq = nseq + 1
            continue
        slen = ld16(rec + 2)
        ts = <int64_t>ld64(rec + 16)
        hlen = ld32(rec + 24)
        p = ack + plen
        p[0] = c'1'
        p[1] = c'.'
        p = _put_u64(p + 2, nseq)
        p[0] = c'.'
        p = _put_u64(p + 1, dseq)
        p[0] = c'.'
        p = _put_u64(p + 1, <uint64_t>ts)
        p[0] = c'.'
        pending -= 1
        p = _put_u64(p + 1, <uint64_t>(pending if pending > 0 else 0))
        size = slen + (p - ack) + (rlen - REC_HDR - REC_SUM - slen)
        if max_bytes > 0 and sent + size > max_bytes:
            pending += 1
            stopped = True
            seq = nseq
            break
        pub.pa.subject = <const unsigned char*>PyBytes_AS_STRING(route_subject)
        pub.pa.subject_len = PyBytes_GET_SIZE(route_subject)
        pub.pa.reply = <const unsigned char*>ack
        pub.pa.reply_len = p - ack
        pub.pa.account = NULL
        pub.pa.queues = NULL
        pub.pa.hdr = hlen if hlen else -1
        pub.pa.size = rlen - REC_HDR - REC_SUM - slen
        pub.dsubj = rec + REC_HDR
        pub.dsubj_len = slen
        try:
            pub.process_msg(rec + REC_HDR + slen)
        finally:
            pub.dsubj = NULL
            pub.route_reply = None
        out.append((nseq, ts, size))
        sent += size
        dseq += 1
        n += 1
        seq = nseq + 1
    return seq, n, sent, stopped
