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

No trio and no I/O beyond the log's buffered append (STYLE.md habit 1).
"""
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint64_t

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

    cdef int absorb(self, Conn producer, const unsigned char* subj, Py_ssize_t slen,
                    const unsigned char* reply, Py_ssize_t rlen, const unsigned char* msg,
                    Py_ssize_t hdr, Py_ssize_t size) except -1:
        cdef long long msize
        cdef uint64_t seq
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
