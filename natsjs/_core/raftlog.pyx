# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Raft entries and messages as bytes, and the per-entry bookkeeping of a Raft group.

Where it sits on the JetStream write path::

    stream leader -> RaftNode.propose -> encode_entry -> log append (filelog) ->
    encode_append (batch) -> routes -> decode_message on the follower -> log append ->
    fsync -> append response -> MatchIndex.commit_index on the leader -> apply -> PubAck

natsjs's Raft is its own design (issue 10), so the formats below are ours, not
nats-server's ``server/raft.go`` ones; only the idea of carrying heartbeats inside the
replication stream is shared.  Everything is little-endian.

Entry (stored verbatim as the ``msg`` of a file-log record whose sequence is the Raft
index, and carried verbatim inside append-entries)::

    u8 type | u64 term | u64 index | u32 data_len | data | u32 check

Message (one per transport send)::

    u8 type | u8 flags | u64 term | u64 index | u64 log_term | u64 commit | u64 hint |
    u16 sender_len | sender | body | u32 check

    body of MSG_APPEND:   u32 count, then ``count`` entries back to back
    body of MSG_SNAPSHOT: u16 npeers, (u16 len, peer) * npeers, u32 len, chunk
    other messages:       empty

``check`` is the low 32 bits of XXH64 (seed 0) over every byte before it.  A corrupt or
truncated input raises ``RaftCodecError``; nothing here trusts a length it has not checked
against the buffer.  No I/O and no trio: bytes in, values out.
"""
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE

from natsjs._core.byteorder cimport ld16, ld32, ld64, st16, st32, st64
from natsjs._core.xxhash cimport xxh64_c

# Entry types.
ENTRY_NORMAL = 0   # application data
ENTRY_NOOP = 1     # a new leader's first entry: commits what earlier terms left behind
ENTRY_CONFIG = 2   # the full voter set from this index on (encode_peers)

# Message types (the meaning of index / log_term / commit / hint per type is in raft.py).
MSG_APPEND = 1
MSG_APPEND_RESP = 2
MSG_VOTE = 3
MSG_VOTE_RESP = 4
MSG_TIMEOUT_NOW = 5
MSG_SNAPSHOT = 6
MSG_SNAPSHOT_RESP = 7

# Message flags.
FLAG_SUCCESS = 1    # append/snapshot response accepted, vote granted
FLAG_PREVOTE = 2    # a pre-vote request or its response: no term change anywhere
FLAG_TRANSFER = 4   # a vote asked for on a leader's TimeoutNow: ignores the leader lease
FLAG_DONE = 8       # last chunk of a snapshot

ENTRY_OVERHEAD = 25
MESSAGE_OVERHEAD = 48

cdef enum:
    _ENTRY_HDR = 21
    _MSG_HDR = 44
    _MAX_TYPE = 7


class RaftCodecError(ValueError):
    """A Raft entry or message that is truncated, oversized or fails its checksum."""


# ---- the checksum (xxhash.pxd) ---------------------------------------------------------

def xxh64(data, uint64_t seed=0):
    """XXH64 of a bytes-like object (the checksum the entry and message formats use)."""
    cdef Py_buffer view
    cdef uint64_t h
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        h = xxh64_c(<const uint8_t*>view.buf, <size_t>view.len, seed)
    finally:
        PyBuffer_Release(&view)
    return h


cdef inline uint32_t _check(const uint8_t* p, size_t n) noexcept nogil:
    # the low half of the one XXH64 (xxhash.pxd) the file log uses too
    return <uint32_t>(xxh64_c(p, n, 0) & 0xFFFFFFFFULL)


# ---- entries --------------------------------------------------------------------------

cpdef bytes encode_entry(int etype, uint64_t term, uint64_t index, data):
    """One log entry: header, data and checksum (the layout in the module docstring)."""
    cdef Py_buffer view
    cdef bytes out
    cdef uint8_t* p
    cdef size_t n
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        n = <size_t>view.len
        if n > 0xFFFFFFFFULL:
            raise RaftCodecError("entry data too large")
        out = PyBytes_FromStringAndSize(NULL, _ENTRY_HDR + n + 4)
        p = <uint8_t*>PyBytes_AS_STRING(out)
        p[0] = <uint8_t>etype
        st64(p + 1, term)
        st64(p + 9, index)
        st32(p + 17, <uint32_t>n)
        if n:
            memcpy(p + _ENTRY_HDR, view.buf, n)
        st32(p + _ENTRY_HDR + n, _check(p, _ENTRY_HDR + n))
    finally:
        PyBuffer_Release(&view)
    return out


cdef size_t _entry_size(const uint8_t* p, size_t avail) except? 0:
    """Length of the well-formed entry at ``p``; raises if it is truncated or corrupt."""
    cdef size_t n
    if avail < _ENTRY_HDR + 4:
        raise RaftCodecError("truncated entry header")
    if p[0] > 2:
        raise RaftCodecError("unknown entry type %d" % p[0])
    n = ld32(p + 17)
    if n > avail - _ENTRY_HDR - 4:
        raise RaftCodecError("truncated entry data")
    if ld32(p + _ENTRY_HDR + n) != _check(p, _ENTRY_HDR + n):
        raise RaftCodecError("entry checksum mismatch")
    return _ENTRY_HDR + n + 4


cpdef tuple decode_entry(bytes entry):
    """``(type, term, index, data)`` of a stored entry, checksum verified."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(entry)
    cdef size_t n = _entry_size(p, len(entry))
    if n != <size_t>len(entry):
        raise RaftCodecError("trailing bytes after entry")
    return (p[0], ld64(p + 1), ld64(p + 9),
            PyBytes_FromStringAndSize(<char*>p + _ENTRY_HDR, n - _ENTRY_HDR - 4))


cpdef uint64_t entry_term(bytes entry) except? 0:
    """The term of an entry that was already checked (read from the header only)."""
    if len(entry) < _ENTRY_HDR:
        raise RaftCodecError("truncated entry header")
    return ld64(<const uint8_t*>PyBytes_AS_STRING(entry) + 1)


cpdef int entry_type(bytes entry) except -1:
    if len(entry) < _ENTRY_HDR:
        raise RaftCodecError("truncated entry header")
    return (<const uint8_t*>PyBytes_AS_STRING(entry))[0]


cpdef bytes encode_peers(peers):
    """A voter set: u16 count, then (u16 length, UTF-8 id) per peer, in the given order."""
    cdef list encoded = [(<str>peer).encode() for peer in peers]
    cdef bytes e
    cdef size_t total = 2
    for e in encoded:
        if len(e) > 0xFFFF:
            raise RaftCodecError("peer id too long")
        total += 2 + len(e)
    if len(encoded) > 0xFFFF:
        raise RaftCodecError("too many peers")
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t* p = <uint8_t*>PyBytes_AS_STRING(out)
    st16(p, <uint16_t>len(encoded))
    p += 2
    for e in encoded:
        st16(p, <uint16_t>len(e))
        memcpy(p + 2, PyBytes_AS_STRING(e), len(e))
        p += 2 + len(e)
    return out


cdef tuple _read_peers(const uint8_t* p, size_t avail, size_t* used):
    cdef size_t off = 2, i, n, count
    cdef list out = []
    if avail < 2:
        raise RaftCodecError("truncated peer list")
    count = ld16(p)
    for i in range(count):
        if off + 2 > avail:
            raise RaftCodecError("truncated peer list")
        n = ld16(p + off)
        if off + 2 + n > avail:
            raise RaftCodecError("truncated peer id")
        out.append((<bytes>PyBytes_FromStringAndSize(<char*>p + off + 2, n)).decode())
        off += 2 + n
    used[0] = off
    return tuple(out)


def decode_peers(data):
    """The tuple of peer ids that ``encode_peers`` wrote."""
    cdef bytes b = bytes(data)
    cdef size_t used = 0
    cdef tuple peers = _read_peers(<const uint8_t*>PyBytes_AS_STRING(b), len(b), &used)
    if used != <size_t>len(b):
        raise RaftCodecError("trailing bytes after peer list")
    return peers


# ---- messages -------------------------------------------------------------------------

cdef class Message:
    """One decoded Raft message; which fields mean what per type is documented in raft.py."""

    def __init__(self, int type, int flags, uint64_t term, str sender, uint64_t index=0,
                 uint64_t log_term=0, uint64_t commit=0, uint64_t hint=0,
                 list entries=None, bytes data=None, tuple peers=None):
        self.type = type
        self.flags = flags
        self.term = term
        self.sender = sender
        self.index = index
        self.log_term = log_term
        self.commit = commit
        self.hint = hint
        self.entries = entries
        self.data = data
        self.peers = peers

    def __repr__(self):
        return ("Message(type=%d flags=%d term=%d sender=%r index=%d log_term=%d commit=%d "
                "hint=%d entries=%d)" % (self.type, self.flags, self.term, self.sender,
                                         self.index, self.log_term, self.commit, self.hint,
                                         len(self.entries) if self.entries else 0))


cdef inline uint8_t* _put_header(uint8_t* p, int mtype, int flags, uint64_t term,
                                 bytes sender, uint64_t index, uint64_t log_term,
                                 uint64_t commit, uint64_t hint):
    p[0] = <uint8_t>mtype
    p[1] = <uint8_t>flags
    st64(p + 2, term)
    st64(p + 10, index)
    st64(p + 18, log_term)
    st64(p + 26, commit)
    st64(p + 34, hint)
    st16(p + 42, <uint16_t>len(sender))
    memcpy(p + _MSG_HDR, PyBytes_AS_STRING(sender), len(sender))
    return p + _MSG_HDR + len(sender)


cpdef bytes encode_message(int mtype, int flags, uint64_t term, bytes sender,
                           uint64_t index=0, uint64_t log_term=0, uint64_t commit=0,
                           uint64_t hint=0):
    """A message without a body (responses, votes, TimeoutNow)."""
    if len(sender) > 0xFFFF:
        raise RaftCodecError("sender id too long")
    cdef size_t n = _MSG_HDR + len(sender)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n + 4)
    cdef uint8_t* p = <uint8_t*>PyBytes_AS_STRING(out)
    _put_header(p, mtype, flags, term, sender, index, log_term, commit, hint)
    st32(p + n, _check(p, n))
    return out


cpdef bytes encode_append(uint64_t term, bytes sender, uint64_t prev_index,
                          uint64_t prev_term, uint64_t commit, list entries):
    """Append-entries carrying already encoded entries verbatim (no re-encoding)."""
    cdef size_t n = _MSG_HDR + len(sender) + 4
    cdef object e
    if len(sender) > 0xFFFF:
        raise RaftCodecError("sender id too long")
    for e in entries:
        n += len(<bytes>e)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n + 4)
    cdef uint8_t* base = <uint8_t*>PyBytes_AS_STRING(out)
    cdef uint8_t* p = _put_header(base, MSG_APPEND, 0, term, sender, prev_index, prev_term,
                                  commit, 0)
    st32(p, <uint32_t>len(entries))
    p += 4
    for e in entries:
        memcpy(p, PyBytes_AS_STRING(<bytes>e), len(<bytes>e))
        p += len(<bytes>e)
    st32(p, _check(base, n))
    return out


cpdef bytes encode_snapshot(uint64_t term, bytes sender, uint64_t snap_index,
                            uint64_t snap_term, uint64_t commit, uint64_t offset, bint done,
                            bytes peers, bytes chunk):
    """One chunk of a snapshot; ``peers`` is encode_peers() of the snapshot's voter set."""
    if len(sender) > 0xFFFF:
        raise RaftCodecError("sender id too long")
    cdef size_t n = _MSG_HDR + len(sender) + len(peers) + 4 + len(chunk)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n + 4)
    cdef uint8_t* base = <uint8_t*>PyBytes_AS_STRING(out)
    cdef uint8_t* p = _put_header(base, MSG_SNAPSHOT, FLAG_DONE if done else 0, term, sender,
                                  snap_index, snap_term, commit, offset)
    memcpy(p, PyBytes_AS_STRING(peers), len(peers))
    p += len(peers)
    st32(p, <uint32_t>len(chunk))
    memcpy(p + 4, PyBytes_AS_STRING(chunk), len(chunk))
    p += 4 + len(chunk)
    st32(p, _check(base, n))
    return out


cpdef Message decode_message(data):
    """Parse and verify one message; entries of an append are checked one by one too."""
    cdef Py_buffer view
    cdef const uint8_t* p
    cdef size_t n, slen, off, count, i, esz, used
    cdef uint64_t expect
    cdef Message m
    cdef list entries
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        p = <const uint8_t*>view.buf
        n = <size_t>view.len
        if n < _MSG_HDR + 4:
            raise RaftCodecError("truncated message header")
        if ld32(p + n - 4) != _check(p, n - 4):
            raise RaftCodecError("message checksum mismatch")
        n -= 4
        if p[0] < 1 or p[0] > _MAX_TYPE:
            raise RaftCodecError("unknown message type %d" % p[0])
        slen = ld16(p + 42)
        if _MSG_HDR + slen > n:
            raise RaftCodecError("truncated sender")
        m = Message.__new__(Message)
        m.type = p[0]
        m.flags = p[1]
        m.term = ld64(p + 2)
        m.index = ld64(p + 10)
        m.log_term = ld64(p + 18)
        m.commit = ld64(p + 26)
        m.hint = ld64(p + 34)
        m.sender = (<bytes>PyBytes_FromStringAndSize(<char*>p + _MSG_HDR, slen)).decode()
        off = _MSG_HDR + slen
        if m.type == MSG_APPEND:
            if off + 4 > n:
                raise RaftCodecError("truncated entry count")
            count = ld32(p + off)
            off += 4
            entries = []
            expect = m.index + 1
            for i in range(count):
                esz = _entry_size(p + off, n - off)
                if ld64(p + off + 9) != expect:
                    raise RaftCodecError("entry index out of sequence")
                entries.append(PyBytes_FromStringAndSize(<char*>p + off, esz))
                off += esz
                expect += 1
            m.entries = entries
        elif m.type == MSG_SNAPSHOT:
            m.peers = _read_peers(p + off, n - off, &used)
            off += used
            if off + 4 > n:
                raise RaftCodecError("truncated snapshot chunk")
            esz = ld32(p + off)
            if off + 4 + esz > n:
                raise RaftCodecError("truncated snapshot chunk")
            m.data = PyBytes_FromStringAndSize(<char*>p + off + 4, esz)
            off += 4 + esz
        if off != n:
            raise RaftCodecError("trailing bytes in message")
        return m
    finally:
        PyBuffer_Release(&view)


# ---- term runs ------------------------------------------------------------------------

cdef class TermRuns:
    """The term of every index in a log, kept as runs of equal terms.

    Terms only change when a new leader appends, so a whole log costs a handful of runs:
    the node answers "term at index i" (log matching, conflict hints) without reading the
    log back from disk.  Index ``base`` is the snapshot's last index, whose term is known
    even though the entry itself is gone.
    """

    def __init__(self, uint64_t base=0, uint64_t base_term=0):
        self.reset(base, base_term)

    cpdef void reset(self, uint64_t base, uint64_t base_term):
        self.base = base
        self.last = base
        self.last_term = base_term
        self._starts = [base]
        self._terms = [base_term]

    cpdef void append(self, uint64_t index, uint64_t term) except *:
        if index != self.last + 1:
            raise ValueError("append at %d after %d" % (index, self.last))
        if term != self.last_term:
            if term < self.last_term:
                raise ValueError("term %d at %d below %d" % (term, index, self.last_term))
            self._starts.append(index)
            self._terms.append(term)
            self.last_term = term
        self.last = index

    cpdef list append_entries(self, uint64_t first_index, list entries):
        """Record a batch of encoded entries that start at ``first_index``.

        Returns the positions in ``entries`` of configuration entries (usually none), so
        the caller decodes only those.
        """
        cdef object e
        cdef const uint8_t* p
        cdef uint64_t i = first_index
        cdef Py_ssize_t k = 0
        cdef list configs = []
        for e in entries:
            if len(<bytes>e) < _ENTRY_HDR:
                raise RaftCodecError("truncated entry header")
            p = <const uint8_t*>PyBytes_AS_STRING(<bytes>e)
            self.append(i, ld64(p + 1))
            if p[0] == 2:
                configs.append(k)
            i += 1
            k += 1
        return configs

    cdef Py_ssize_t _run(self, uint64_t index):
        # the last run whose start is <= index (runs are few: binary search anyway)
        cdef Py_ssize_t lo = 0, hi = len(self._starts) - 1, mid
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if <uint64_t>self._starts[mid] <= index:
                lo = mid
            else:
                hi = mid - 1
        return lo

    cpdef uint64_t term_at(self, uint64_t index):
        """The term at ``index`` in [base, last]; 0 outside it (unknown)."""
        if index < self.base or index > self.last:
            return 0
        if index >= <uint64_t>self._starts[len(self._starts) - 1]:
            return self.last_term
        return self._terms[self._run(index)]

    cpdef void truncate(self, uint64_t last) except *:
        """Forget every index above ``last`` (a follower dropping a conflicting suffix)."""
        cdef Py_ssize_t r
        if last >= self.last:
            return
        if last < self.base:
            raise ValueError("truncate to %d below base %d" % (last, self.base))
        r = self._run(last)
        del self._starts[r + 1:]
        del self._terms[r + 1:]
        self.last = last
        self.last_term = self._terms[r]

    cpdef void compact(self, uint64_t base, uint64_t base_term) except *:
        """Move the base up to a snapshot at ``base`` (entries at or below it are gone)."""
        cdef Py_ssize_t r
        if base <= self.base:
            return
        if base >= self.last:
            self.reset(base, base_term)
            return
        r = self._run(base)
        del self._starts[:r]
        del self._terms[:r]
        self._starts[0] = base
        self.base = base

    cpdef uint64_t last_at_most(self, uint64_t index, uint64_t term):
        """The largest j <= index (and >= base) whose term is <= ``term``; base if none.

        Used on both sides of a rejected append to skip a whole conflicting term at once.
        """
        cdef Py_ssize_t r
        if index > self.last:
            index = self.last
        if index <= self.base:
            return self.base
        r = self._run(index)
        while r > 0 and <uint64_t>self._terms[r] > term:
            index = <uint64_t>self._starts[r] - 1
            r -= 1
        if <uint64_t>self._terms[r] > term:
            return self.base
        return index

    def runs(self):
        """``[(first_index, term), ...]`` for tests and debugging."""
        return list(zip(self._starts, self._terms))


# ---- match indexes and the commit rule ------------------------------------------------

cdef class MatchIndex:
    """For each voter, the highest index known to be durable on it; gives the commit index.

    The leader enters its own persisted index like any other voter's, so it counts toward
    a quorum only for what it has fsynced.
    """

    def __init__(self, voters=()):
        self._slots = {}
        self.count = 0
        self.set_voters(voters)

    def set_voters(self, voters):
        """Replace the voter set; voters that stay keep what is known about them."""
        cdef dict old = self._slots
        cdef uint64_t saved[_MAX_VOTERS]
        cdef int i
        voters = list(dict.fromkeys(voters))
        if len(voters) > _MAX_VOTERS:
            raise ValueError("at most %d voters" % _MAX_VOTERS)
        for i in range(self.count):
            saved[i] = self._match[i]
        self._slots = {}
        for i, peer in enumerate(voters):
            self._slots[peer] = i
            slot = old.get(peer)
            self._match[i] = saved[<int>slot] if slot is not None else 0
        self.count = len(voters)

    @property
    def voters(self):
        return tuple(self._slots)

    cpdef bint update(self, peer, uint64_t index):
        """Raise ``peer``'s match to ``index``; True if it grew (non-voters are ignored)."""
        slot = self._slots.get(peer)
        if slot is None:
            return False
        if index <= self._match[<int>slot]:
            return False
        self._match[<int>slot] = index
        return True

    cpdef void forget(self, peer):
        """``peer`` no longer holds what it acknowledged (its storage was damaged): known
        durable on it is nothing, until it acknowledges again."""
        slot = self._slots.get(peer)
        if slot is not None:
            self._match[<int>slot] = 0

    cpdef uint64_t get(self, peer):
        slot = self._slots.get(peer)
        return 0 if slot is None else self._match[<int>slot]

    cpdef uint64_t quorum_index(self, int quorum=0):
        """The highest index durable on at least ``quorum`` voters (default a majority)."""
        cdef uint64_t v[_MAX_VOTERS]
        cdef uint64_t x
        cdef int i, j, n = self.count
        if n == 0:
            return 0
        if quorum <= 0:
            quorum = n // 2 + 1
        if quorum > n:
            return 0
        for i in range(n):
            x = self._match[i]
            j = i
            while j > 0 and v[j - 1] < x:   # insertion sort, descending; n is tiny
                v[j] = v[j - 1]
                j -= 1
            v[j] = x
        return v[quorum - 1]

    cpdef uint64_t commit_index(self, TermRuns runs, uint64_t term, uint64_t commit,
                                int quorum=0):
        """Raft's commit rule: the quorum index, if it is newer than ``commit`` and was
        written in the leader's current ``term`` (earlier terms commit only under it)."""
        cdef uint64_t q = self.quorum_index(quorum)
        if q > commit and runs.term_at(q) == term:
            return q
        return commit
