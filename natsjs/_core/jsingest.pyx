# cython: language_level=3
"""A stream's capture in C: plain messages go from the publisher's read buffer straight
into the stream's log.

Where it sits: step 4 of a message's path for a stream.  The fan-out
(natsjs/_core/fanout.pyx) finds the stream's subscription and, because its callback is
a ``Sink``, calls ``absorb`` with pointers into the read buffer.  For the common stream
(no limits to enforce, no seal, no republish, limits retention: ``plain``) and a message
without headers, nothing else needs deciding: it is appended to the log's write buffer
here (natsjs/_core/filelog.pyx ``append_c``), and its reply subject is queued with the
assigned sequence for the stream's commit task, which sends the PubAck after the fsync
that covers it.  Everything else (headers, non-plain streams, or while the Python path
still has messages queued, so order is kept) goes to the Python capture
(natsjs/jetstream/stream.py ``Stream._capture``).

A replicated stream's leader (natsjs/jetstream/replicated.py) takes messages the same
way but decides nothing at capture: every message, headers or not, is encoded into one
batch (``batching``), which its ingest task proposes to the stream's Raft group as a single
entry.  When the entry is committed, every replica appends its plain records to the log
with ``apply_plain`` and runs only the others through the stream's checks in Python
(``decode_record``).

No trio and no I/O beyond the log's buffered append (STYLE.md habit 1).
"""
from cpython.bytes cimport (PyBytes_AS_STRING, PyBytes_FromStringAndSize,
                            PyBytes_GET_SIZE)
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy

from natsjs._core.byteorder cimport ld32, ld64, st16, st32, st64
from natsjs._core.fanout cimport Conn, Sink
from natsjs._core.filelog cimport _Log


cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec* ts)
    enum:
        CLOCK_REALTIME


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_REALTIME, &t)
    return <int64_t>t.tv_sec * 1000000000 + t.tv_nsec


# A batch record: <q ts><H subject length><I header length or NO_HDR><I payload length>,
# then the subject, the headers and the payload.  Little endian, as the Raft log.
DEF REC = 18
DEF NO_HDR = 0xFFFFFFFF


cdef class StreamSink(Sink):
    """The capture of one stream.  The stream sets the public fields as its
    configuration and state change (natsjs/jetstream/stream.py)."""

    cdef _Log log
    cdef public bint plain        # the stream takes plain messages without checks
    cdef public bint no_ack       # no PubAcks at all
    cdef public bint file         # nats-server's file-store size accounting, else memory
    cdef public long long budget  # bytes the stream may still add before limits matter
    cdef public list replies      # the commit task's list: (reply, seq) are appended
    cdef public list inbox        # the Python path's queue: while not empty, go there too
    cdef public object fallback   # Python capture(sub, subject, reply, hdr, msg)
    cdef public object wake       # called when the log got data and none was pending
    cdef public bint dirty        # appended since the commit task last looked
    cdef public long long captured  # appended here since the stream last synced its state
    cdef public bint batching     # a replicated stream's leader: encode into the batch
    cdef public Py_ssize_t max_batch  # batching: bytes held before the Python path decides
    cdef public list breplies     # batching: the reply subject (or None) of each record
    cdef uint8_t* bbuf            # batching: the records, REC header each
    cdef Py_ssize_t blen
    cdef Py_ssize_t bcap

    def __init__(self, _Log log, fallback, wake, bint file):
        self.log = log
        self.fallback = fallback
        self.wake = wake
        self.file = file
        self.plain = False
        self.no_ack = False
        self.budget = 0
        self.replies = []
        self.inbox = []
        self.dirty = False
        self.captured = 0
        self.batching = False
        self.max_batch = 0
        self.breplies = []
        self.bbuf = NULL
        self.blen = self.bcap = 0

    def __dealloc__(self):
        free(self.bbuf)

    @property
    def batch_bytes(self) -> int:
        return self.blen

    def take(self, Py_ssize_t max_bytes):
        """The batch's first records up to ``max_bytes`` (at least one) as entry data
        (after ``prefix``), with their replies; the rest stays for the next take."""
        cdef Py_ssize_t off = 0, n = 0, rlen
        if self.blen == 0:
            return None, []
        while off < self.blen:
            rlen = REC + (<Py_ssize_t>self.bbuf[off + 8] | (<Py_ssize_t>self.bbuf[off + 9] << 8))
            if ld32(self.bbuf + off + 10) != NO_HDR:
                rlen += ld32(self.bbuf + off + 10)
            rlen += ld32(self.bbuf + off + 14)
            if n and off + rlen > max_bytes:
                break
            off += rlen
            n += 1
        data = PyBytes_FromStringAndSize(<const char*>self.bbuf, off)
        replies = self.breplies[:n]
        del self.breplies[:n]
        if off < self.blen:
            memcpy(self.bbuf, self.bbuf + off, self.blen - off)
        self.blen -= off
        return data, replies

    def clear_batch(self) -> None:
        self.blen = 0
        self.breplies = []

    cdef int _batch(self, const unsigned char* subj, Py_ssize_t slen,
                    const unsigned char* reply, Py_ssize_t rlen, const unsigned char* msg,
                    Py_ssize_t hdr, Py_ssize_t size) except -1:
        cdef Py_ssize_t need = REC + slen + size
        cdef uint8_t* p
        if self.blen + need > self.bcap:
            self.bcap = max(self.bcap * 2, self.blen + need, 65536)
            p = <uint8_t*>realloc(self.bbuf, self.bcap)
            if p == NULL:
                raise MemoryError()
            self.bbuf = p
        p = self.bbuf + self.blen
        st64(p, <uint64_t>_now_ns())
        st16(p + 8, <uint16_t>slen)
        st32(p + 10, <uint32_t>hdr if hdr >= 0 else NO_HDR)
        st32(p + 14, <uint32_t>(size - hdr if hdr >= 0 else size))
        memcpy(p + REC, subj, slen)
        memcpy(p + REC + slen, msg, size)
        self.blen += need
        self.breplies.append(PyBytes_FromStringAndSize(<const char*>reply, rlen)
                             if rlen > 0 and not self.no_ack else None)
        if not self.dirty:
            self.dirty = True
            self.wake()
        return 0

    cdef int absorb(self, Conn producer, const unsigned char* subj, Py_ssize_t slen,
                    const unsigned char* reply, Py_ssize_t rlen, const unsigned char* msg,
                    Py_ssize_t hdr, Py_ssize_t size) except -1:
        cdef long long msize
        cdef uint64_t seq
        if self.batching and not self.inbox and self.blen < self.max_batch and slen <= 0xFFFF:
            return self._batch(subj, slen, reply, rlen, msg, hdr, size)
        if not self.plain or hdr >= 0 or self.inbox:
            self.fallback(None, PyBytes_FromStringAndSize(<const char*>subj, slen),
                          PyBytes_FromStringAndSize(<const char*>reply, rlen)
                          if rlen >= 0 else None,
                          hdr, PyBytes_FromStringAndSize(<const char*>msg, size))
            return 0
        # server/filestore.go fileStoreMsgSize, server/memstore.go memStoreMsgSize.
        msize = 22 + slen + size + 8 if self.file else slen + size + 16
        if msize > self.budget:
            self.fallback(None, PyBytes_FromStringAndSize(<const char*>subj, slen),
                          PyBytes_FromStringAndSize(<const char*>reply, rlen)
                          if rlen >= 0 else None,
                          hdr, PyBytes_FromStringAndSize(<const char*>msg, size))
            return 0
        seq = self.log.append_c(<const unsigned char*>subj, slen, NULL, 0,
                                <const unsigned char*>msg, size, _now_ns(), 0)
        self.budget -= msize
        self.captured += 1
        if rlen > 0 and not self.no_ack:
            self.replies.append((PyBytes_FromStringAndSize(<const char*>reply, rlen), seq))
        if not self.dirty:
            self.dirty = True
            self.wake()
        return 0


def apply_plain(_Log log, bytes data, Py_ssize_t off):
    """Append the batch entry's records from ``off`` to the log while they are plain (no
    headers), each with its own time.  Returns (offset of the first record not taken,
    sequence of the first appended, how many were)."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t slen, mlen
    cdef uint64_t seq, first = 0
    cdef Py_ssize_t n = 0
    while off + REC <= end:
        if ld32(p + off + 10) != NO_HDR:
            break
        slen = <Py_ssize_t>p[off + 8] | (<Py_ssize_t>p[off + 9] << 8)
        mlen = ld32(p + off + 14)
        if off + REC + slen + mlen > end:
            raise ValueError("truncated batch record at %d" % off)
        seq = log.append_c(p + off + REC, slen, NULL, 0, p + off + REC + slen, mlen,
                           <int64_t>ld64(p + off), 0)
        if n == 0:
            first = seq
        n += 1
        off += REC + slen + mlen
    return off, first, n


def decode_record(bytes data, Py_ssize_t off):
    """One batch record: (next offset, ts, subject, headers or None, payload)."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t slen, hlen, mlen
    if off + REC > end:
        raise ValueError("truncated batch record at %d" % off)
    slen = <Py_ssize_t>p[off + 8] | (<Py_ssize_t>p[off + 9] << 8)
    hlen = ld32(p + off + 10)
    mlen = ld32(p + off + 14)
    if hlen == NO_HDR:
        hlen = -1
    if off + REC + slen + max(hlen, 0) + mlen > end:
        raise ValueError("truncated batch record at %d" % off)
    cdef Py_ssize_t q = off + REC
    subject = PyBytes_FromStringAndSize(<const char*>p + q, slen)
    q += slen
    hdr = None
    if hlen >= 0:
        hdr = PyBytes_FromStringAndSize(<const char*>p + q, hlen)
        q += hlen
    msg = PyBytes_FromStringAndSize(<const char*>p + q, mlen)
    return q + mlen, <int64_t>ld64(p + off), subject, hdr, msg


def count_records(bytes data, Py_ssize_t off):
    """How many records the batch entry holds from ``off``."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t n = 0, hlen
    while off + REC <= end:
        hlen = ld32(p + off + 10)
        off += REC + (<Py_ssize_t>p[off + 8] | (<Py_ssize_t>p[off + 9] << 8)) + \
            ld32(p + off + 14) + (0 if hlen == NO_HDR else hlen)
        n += 1
    return n
