# Declarations for natsjs/_core/raftlog.pyx (Raft entry/message codec and bookkeeping),
# so other Cython modules can cimport the checksum and the bookkeeping classes.
from libc.stdint cimport uint8_t, uint64_t

cdef enum:
    _MAX_VOTERS = 64


cdef class Message:
    cdef public int type          # MSG_*
    cdef public int flags         # FLAG_* bits
    cdef public uint64_t term
    cdef public str sender        # peer id of the node that sent it
    cdef public uint64_t index
    cdef public uint64_t log_term
    cdef public uint64_t commit
    cdef public uint64_t hint
    cdef public list entries      # MSG_APPEND: encoded entries (bytes), checksums verified
    cdef public bytes data        # MSG_SNAPSHOT: the chunk
    cdef public tuple peers       # MSG_SNAPSHOT: the snapshot's voter set


cdef class TermRuns:
    cdef readonly uint64_t base       # snapshot index: its term is known, the entry gone
    cdef readonly uint64_t last       # last index in the log
    cdef readonly uint64_t last_term
    cdef list _starts                 # first index of each run, ascending
    cdef list _terms                  # term of each run, non-decreasing

    cpdef void reset(self, uint64_t base, uint64_t base_term)
    cpdef void append(self, uint64_t index, uint64_t term) except *
    cpdef list append_entries(self, uint64_t first_index, list entries)
    cdef Py_ssize_t _run(self, uint64_t index)
    cpdef uint64_t term_at(self, uint64_t index)
    cpdef void truncate(self, uint64_t last) except *
    cpdef void compact(self, uint64_t base, uint64_t base_term) except *
    cpdef uint64_t last_at_most(self, uint64_t index, uint64_t term)


cdef class MatchIndex:
    cdef dict _slots                  # voter id -> slot in _match
    cdef uint64_t _match[_MAX_VOTERS]
    cdef readonly int count

    cpdef bint update(self, peer, uint64_t index)
    cpdef void forget(self, peer)
    cpdef uint64_t get(self, peer)
    cpdef uint64_t quorum_index(self, int quorum=*)
    cpdef uint64_t commit_index(self, TermRuns runs, uint64_t term, uint64_t commit,
                                int quorum=*)
