# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The JetStream message store: a file log and a memory log behind one interface.

Where it sits on a published message's path::

    stream leader -> raft propose -> quorum -> FileLog.append (buffered)
        -> FileLog.begin_sync (write to the OS) -> Sync.run (fdatasync, worker thread)
        -> FileLog.mark_synced -> PubAck

and on the way out a consumer reads with ``load_next(seq, filter)``.  The stream layer
(natsjs/jetstream/) owns timers, threads and limits; this module only turns calls into
bytes and files, never imports trio and starts no thread of its own.

On disk (``FileLog``) a log is ``<dir>/blk/<index:08d>.blk`` block files, append-only
while active, each a run of records::

    0  u8  magic 0xD5             16 i64 timestamp (ns since the epoch)
    1  u8  kind                   24 u32 header length
    2  u16 subject length         28 u32 low half of XXH64(bytes 0..27): header check
    4  u32 record length          32 subject, headers, payload
    8  u64 sequence               -8 u64 XXH64 (seed 0) of everything before it

Kinds: MSG; TOMB (a deletion, naming the sequence); SKIP (sequences a Raft follower
skipped, the last one in the body); FLOOR (every sequence below ``seq`` is gone, and
last_seq/last_ts are at least those in the body; each new block opens with one, so the
sequence range survives any removal of older blocks); TRUNC (every sequence above
``seq`` written before it is gone: Raft truncation; last_ts in the body); ERASED (a
secure-deleted message rewritten in place with zeroes).  A record is trusted only when its header check and
checksum both hold; the header check lets recovery resynchronise after a corrupt length
by looking for the next magic byte whose header checks out.

Sealed blocks may be rewritten by ``compact_blocks`` (dropping dead records, S2-
compressing when ``compression="s2"``) via tmp + fsync + rename + directory fsync.  A
compressed block file starts with ``ZMAGIC``, the decoded length and an XXH64 of the
compressed bytes.  A tombstone is dropped by such a rewrite only when the record it
names is no longer in any other block file whose removal is durable.

Byte accounting follows nats-server so stream info matches the reference:
``server/filestore.go`` fileStoreMsgSize (22 + subject + [4 + headers] + payload + 8)
for the file log, ``server/memstore.go`` memStoreMsgSize (subject + headers + payload +
16) for the memory log.  Purge, compact and truncate follow PurgeEx / Compact /
Truncate in those files (a full purge leaves first_seq = last_seq + 1).
"""

import mmap
import os
import time
import weakref

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from libc.errno cimport errno, EINTR, EIO
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int64_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memset, memcmp, memchr, memmove
from posix.unistd cimport pread, pwrite, fdatasync, fsync, close, dup

from natsjs._core.byteorder cimport ld16, ld32, ld64, st16, st32, st64
from natsjs._core.xxhash cimport xxh64_c

from natsjs._core.s2 import encode_block, decode_block, S2Error

cdef enum:
    READ_AHEAD = 262144      # bytes one pread brings in for records read from a file
    MAGIC = 0xD5
    HDR = 32
    SUM = 8
    MIN_REC = 40
    FLOOR_LEN = 56
    MAX_REC = 0x7FFFFFFF
    K_MSG = 1
    K_TOMB = 2
    K_SKIP = 3
    K_FLOOR = 4
    K_TRUNC = 5
    K_ERASED = 6
    SLOT_LIVE = 1
    SLOT_TOMB = 2
    STALE_FIRST = 1
    STALE_LAST = 2
    FILTER_ALL = 0
    FILTER_NONE = 1
    FILTER_LITERAL = 2
    FILTER_WILD = 3
    SYNC_READY = 0
    SYNC_OK = 1
    SYNC_FAILED = 2

cdef uint32_t NOBLK = 0xFFFFFFFF
cdef uint32_t NOID = 0xFFFFFFFF
cdef bytes ZMAGIC = b"\xa9NJS2BLK"
cdef Py_ssize_t MAX_OPEN_BLOCKS = 64
cdef size_t ZHDR = 24
DEFAULT_BLOCK_SIZE = 8 * 1024 * 1024
MEM_BLOCK_SIZE = 1024 * 1024


def replace_file(path, data):
    """Make ``path`` hold ``data`` so that a crash leaves the old content or the new:
    a temporary file beside it, fsync, rename over.  When that fails (a full disk) no
    temporary file is left.  The caller fsyncs the directory."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def xxh64(data, uint64_t seed=0):
    """XXH64 of a bytes-like object (the record checksum; seed 0 on disk)."""
    cdef const uint8_t[::1] mv = data
    cdef size_t n = mv.shape[0]
    if n == 0:
        return xxh64_c(<const uint8_t*>b"", 0, seed)
    return xxh64_c(&mv[0], n, seed)


# ---- NATS subject filters ----------------------------------------------------------

cdef bint subject_match(const uint8_t* f, size_t fl, const uint8_t* s, size_t sl) noexcept nogil:
    """Tokens split on '.', '*' matches one token, a final '>' one or more."""
    cdef size_t fi = 0, si = 0, fe, se
    while True:
        if fi > fl:                       # filter exhausted
            return si > sl
        fe = fi
        while fe < fl and f[fe] != 46:
            fe += 1
        if fe - fi == 1 and f[fi] == 62 and fe == fl:
            return si <= sl              # '>' needs at least one more subject token
        if si > sl:
            return False
        se = si
        while se < sl and s[se] != 46:
            se += 1
        if not (fe - fi == 1 and f[fi] == 42):
            if fe - fi != se - si or memcmp(f + fi, s + si, fe - fi) != 0:
                return False
        fi = fe + 1
        si = se + 1

cdef bint has_wildcard(const uint8_t* f, size_t fl) noexcept nogil:
    cdef size_t i = 0, start = 0
    while i <= fl:
        if i == fl or f[i] == 46:
            if i - start == 1 and (f[start] == 42 or f[start] == 62):
                return True
            start = i + 1
        i += 1
    return False


def subject_matches(filter, subject):
    """True when the NATS subject matches the filter (``*`` / ``>`` wildcards)."""
    cdef const uint8_t[::1] f = filter
    cdef const uint8_t[::1] s = subject
    if f.shape[0] == 0 or s.shape[0] == 0:
        return False
    return subject_match(&f[0], f.shape[0], &s[0], s.shape[0])


# ---- small open-addressing set of subject ids --------------------------------------

cdef inline uint32_t id_hash(uint32_t v, uint32_t mask) noexcept nogil:
    return <uint32_t>((<uint64_t>v * 0x9E3779B97F4A7C15ULL) >> 32) & mask

cdef int idset_add(IdSet* s, uint32_t v) except -1:
    cdef uint32_t i, j, ncap, w
    cdef uint32_t* nt
    if s.cap == 0 or (s.n + 1) * 4 > s.cap * 3:
        ncap = s.cap * 2 if s.cap else 16
        nt = <uint32_t*>malloc(ncap * sizeof(uint32_t))
        if nt == NULL:
            raise MemoryError()
        memset(nt, 0xFF, ncap * sizeof(uint32_t))
        for j in range(s.cap):
            w = s.tab[j]
            if w != NOID:
                i = id_hash(w, ncap - 1)
                while nt[i] != NOID:
                    i = (i + 1) & (ncap - 1)
                nt[i] = w
        free(s.tab)
        s.tab = nt
        s.cap = ncap
    i = id_hash(v, s.cap - 1)
    while True:
        w = s.tab[i]
        if w == v:
            return 0
        if w == NOID:
            s.tab[i] = v
            s.n += 1
            return 0
        i = (i + 1) & (s.cap - 1)

cdef inline bint idset_has(IdSet* s, uint32_t v) noexcept nogil:
    cdef uint32_t i, w
    if s.cap == 0:
        return False
    i = id_hash(v, s.cap - 1)
    while True:
        w = s.tab[i]
        if w == v:
            return True
        if w == NOID:
            return False
        i = (i + 1) & (s.cap - 1)

cdef void idset_clear(IdSet* s) noexcept:
    free(s.tab)
    s.tab = NULL
    s.cap = 0
    s.n = 0


# ---- records -----------------------------------------------------------------------

cdef inline void put_header(uint8_t* p, int kind, size_t slen, size_t rlen, uint64_t seq,
                            int64_t ts, size_t hlen) noexcept nogil:
    p[0] = MAGIC
    p[1] = <uint8_t>kind
    st16(p + 2, <uint16_t>slen)
    st32(p + 4, <uint32_t>rlen)
    st64(p + 8, seq)
    st64(p + 16, <uint64_t>ts)
    st32(p + 24, <uint32_t>hlen)
    st32(p + 28, <uint32_t>xxh64_c(p, 28, 0))

cdef inline bint header_ok(const uint8_t* p, size_t avail) noexcept nogil:
    """Magic, header check and self-consistent lengths (the record may not fit)."""
    cdef uint32_t rlen
    if avail < HDR or p[0] != MAGIC:
        return False
    if ld32(p + 28) != <uint32_t>xxh64_c(p, 28, 0):
        return False
    if p[1] < K_MSG or p[1] > K_ERASED:
        return False
    rlen = ld32(p + 4)
    if rlen < MIN_REC or rlen > MAX_REC:
        return False
    return <uint64_t>HDR + ld16(p + 2) + ld32(p + 24) + SUM <= rlen

cdef inline bint sum_ok(const uint8_t* p, uint32_t rlen) noexcept nogil:
    return ld64(p + rlen - SUM) == xxh64_c(p, rlen - SUM, 0)

cdef inline int check_record(const uint8_t* p, size_t avail) noexcept nogil:
    """1 valid; 0 header bad; -1 header good but record runs past the end; -2 bad sum."""
    cdef uint32_t rlen
    if not header_ok(p, avail):
        return 0
    rlen = ld32(p + 4)
    if rlen > avail:
        return -1
    if not sum_ok(p, rlen):
        return -2
    return 1

cdef size_t resync(const uint8_t* d, size_t p, size_t n) noexcept nogil:
    """Offset of the next valid record at or after p, or n."""
    cdef const uint8_t* q
    while p < n:
        q = <const uint8_t*>memchr(d + p, MAGIC, n - p)
        if q == NULL:
            return n
        p = q - d
        if check_record(d + p, n - p) == 1:
            return p
        p += 1
    return n


cdef int get_buffer(object obj, Py_buffer* view) except -1:
    PyObject_GetBuffer(obj, view, PyBUF_SIMPLE)
    return 0


cdef class Block:
    """One block file (or, in a MemLog, one memory segment) of records."""

    def __cinit__(self):
        self.fd = -1
        self.buf = NULL
        self.subjects.tab = NULL
        self.subjects.cap = 0
        self.subjects.n = 0

    def __dealloc__(self):
        free(self.buf)
        idset_clear(&self.subjects)
        if self.fd >= 0:
            close(self.fd)

    cdef int reserve(self, size_t n) except -1:
        cdef size_t ncap
        cdef uint8_t* nb
        if self.bcap - self.bstart - self.blen >= n:
            return 0
        if self.bstart:
            # Bytes below bstart were synced and released: reuse their room first.
            memmove(self.buf, self.buf + self.bstart, self.blen)
            self.bstart = 0
            if self.bcap - self.blen >= n:
                return 0
        ncap = self.bcap * 2 if self.bcap else 64 * 1024
        while ncap < self.blen + n:
            ncap *= 2
        nb = <uint8_t*>realloc(self.buf, ncap)
        if nb == NULL:
            raise MemoryError()
        self.buf = nb
        self.bcap = ncap
        return 0

    cdef void release_to(self, uint64_t off) noexcept:
        """Drop buffered bytes below off (they are durable in the file)."""
        cdef uint64_t base = self.size - self.blen
        cdef uint64_t drop
        if off <= base:
            return
        drop = off - base
        if drop > self.blen:
            drop = self.blen
        self.bstart += drop
        self.blen -= drop
        if self.blen == 0:
            self.bstart = 0
            if self.bcap > 4 * 1024 * 1024:
                free(self.buf)
                self.buf = NULL
                self.bcap = 0

    @property
    def live(self):
        return self.live


cdef class Sync:
    """fdatasync's the files one begin_sync() dirtied; run() may go to a worker thread.

    It holds dup()ed descriptors, so nothing the log does meanwhile (appends, rolling,
    compaction renames, removals) can close or reuse them under it.
    """

    def __cinit__(self):
        self.fds = NULL
        self.nfds = 0
        self.dir_slot = -1
        self.state = SYNC_READY
        self.ends = []

    def __dealloc__(self):
        cdef int i
        if self.fds != NULL:
            if self.state == SYNC_READY:
                for i in range(self.nfds):
                    close(self.fds[i])
            free(self.fds)

    def run(self):
        """fdatasync every descriptor (fsync the directory) with the GIL released."""
        cdef int i, rc, err = 0
        if self.state != SYNC_READY:
            return
        with nogil:
            for i in range(self.nfds):
                if i == self.dir_slot:
                    rc = fsync(self.fds[i])
                else:
                    rc = fdatasync(self.fds[i])
                if rc != 0 and err == 0:
                    err = errno
                close(self.fds[i])
        self.err = err
        self.state = SYNC_FAILED if err else SYNC_OK
        if err:
            raise OSError(err, os.strerror(err))

    def _simulate_failure(self, int err=EIO):
        """Tests only: end this Sync as if fdatasync had failed with err."""
        cdef int i
        if self.state != SYNC_READY:
            return
        for i in range(self.nfds):
            close(self.fds[i])
        self.err = err
        self.state = SYNC_FAILED

    @property
    def done(self):
        return self.state != SYNC_READY

    @property
    def ok(self):
        return self.state == SYNC_OK

    @property
    def files(self):
        return self.nfds


cdef class _Filter:
    def __dealloc__(self):
        free(self.bits)


cdef inline Slot* SL(_Log g, uint64_t seq) noexcept:
    return &g.slots[g.shead + (seq - g.sbase)]

cdef inline bint HAS(_Log g, uint64_t seq) noexcept:
    return seq >= g.sbase and seq - g.sbase < g.nslots

cdef inline bint fmatch(FilterC* f, uint32_t sid) noexcept:
    if f.mode == FILTER_ALL:
        return True
    if f.mode == FILTER_LITERAL:
        return sid == f.sid
    if f.mode == FILTER_WILD:
        return sid < f.nbits and f.bits[sid] != 0
    return False


cdef class _Log:
    """The index and the logic the file and memory logs share (not used directly)."""

    def __cinit__(self):
        self.slots = NULL
        self.subj = NULL
        self.htab = NULL
        self.arena = NULL
        self.scratch = NULL
        self.win_block = None
        self.win_off = 0
        self.win_len = 0
        self.blocks = []
        self.blkv = []
        self.dirty = []
        self.outstanding = []
        self.pending_removals = []
        self.erasures = []
        self.filters = {}
        self.recovery = {}

    def __dealloc__(self):
        free(self.slots)
        free(self.subj)
        free(self.htab)
        free(self.arena)
        free(self.scratch)

    cdef _setup(self, bint durable, uint64_t block_size, uint64_t first_seq):
        if block_size < 4096 or block_size > (1 << 30):
            raise ValueError("block_size must be between 4 KiB and 1 GiB")
        self.durable = durable
        self.checksums = durable
        self.block_size = block_size
        self.first = first_seq
        self.last = first_seq - 1 if first_seq else 0
        self.sbase = first_seq if first_seq else 1
        self.next_index = 1
        self.blk_base = 1

    # ---- sequence slots ----------------------------------------------------------

    cdef int ensure_seq(self, uint64_t seq) except -1:
        """Make the slot array cover [sbase, seq]; new slots hold nothing."""
        cdef size_t need, k, i, ncap
        cdef Slot* ns
        if seq < self.sbase:
            k = self.sbase - seq
            ncap = self.nslots + k + 1024
            ns = <Slot*>malloc(ncap * sizeof(Slot))
            if ns == NULL:
                raise MemoryError()
            for i in range(k):
                memset(&ns[i], 0, sizeof(Slot))
                ns[i].blk = NOBLK
            if self.nslots:
                memcpy(ns + k, self.slots + self.shead, self.nslots * sizeof(Slot))
            free(self.slots)
            self.slots = ns
            self.shead = 0
            self.scap = ncap
            self.nslots += k
            self.sbase = seq
            return 0
        if seq - self.sbase < self.nslots:
            return 0
        need = seq - self.sbase + 1
        if need > (<size_t>1 << 40):
            raise MemoryError("sequence gap too large for the index")
        if self.shead + need > self.scap:
            if self.shead:
                memmove(self.slots, self.slots + self.shead, self.nslots * sizeof(Slot))
                self.shead = 0
            if need > self.scap:
                ncap = self.scap * 2 if self.scap else 4096
                while ncap < need:
                    ncap *= 2
                ns = <Slot*>realloc(self.slots, ncap * sizeof(Slot))
                if ns == NULL:
                    raise MemoryError()
                self.slots = ns
                self.scap = ncap
        for i in range(self.shead + self.nslots, self.shead + need):
            memset(&self.slots[i], 0, sizeof(Slot))
            self.slots[i].blk = NOBLK
        self.nslots = need
        return 0

    cdef void drop_slots_below(self, uint64_t seq) noexcept:
        cdef uint64_t k
        if seq <= self.sbase:
            return
        k = seq - self.sbase
        if k >= self.nslots:
            self.shead = 0
            self.nslots = 0
        else:
            self.shead += k
            self.nslots -= k
        self.sbase = seq

    # ---- subjects ----------------------------------------------------------------

    cdef long find_subject(self, const uint8_t* s, size_t n) noexcept:
        cdef uint64_t h
        cdef uint32_t i, v
        cdef Subj* e
        if self.hcap == 0:
            return -1
        h = xxh64_c(s, n, 0)
        i = <uint32_t>h & (self.hcap - 1)
        while True:
            v = self.htab[i]
            if v == 0:
                return -1
            e = &self.subj[v - 1]
            if e.hash == h and e.len == n and memcmp(self.arena + e.off, s, n) == 0:
                return v - 1
            i = (i + 1) & (self.hcap - 1)

    cdef uint32_t subject_id(self, const uint8_t* s, size_t n) except 0xFFFFFFFF:
        cdef uint64_t h = xxh64_c(s, n, 0)
        cdef uint32_t i, v, ncap, j
        cdef uint32_t* nt
        cdef Subj* e
        cdef void* np
        cdef size_t acap
        if self.hcap:
            i = <uint32_t>h & (self.hcap - 1)
            while True:
                v = self.htab[i]
                if v == 0:
                    break
                e = &self.subj[v - 1]
                if e.hash == h and e.len == n and memcmp(self.arena + e.off, s, n) == 0:
                    return v - 1
                i = (i + 1) & (self.hcap - 1)
        if self.nsubj + 1 >= NOID:
            raise MemoryError("too many subjects")
        if (self.nsubj + 1) * 2 > self.hcap:
            ncap = self.hcap * 2 if self.hcap else 1024
            nt = <uint32_t*>malloc(ncap * sizeof(uint32_t))
            if nt == NULL:
                raise MemoryError()
            memset(nt, 0, ncap * sizeof(uint32_t))
            for j in range(self.nsubj):
                i = <uint32_t>self.subj[j].hash & (ncap - 1)
                while nt[i]:
                    i = (i + 1) & (ncap - 1)
                nt[i] = j + 1
            free(self.htab)
            self.htab = nt
            self.hcap = ncap
        if self.nsubj >= self.subjcap:
            ncap = self.subjcap * 2 if self.subjcap else 256
            np = realloc(self.subj, ncap * sizeof(Subj))
            if np == NULL:
                raise MemoryError()
            self.subj = <Subj*>np
            self.subjcap = ncap
        if self.alen + n > self.acap:
            acap = self.acap * 2 if self.acap else 16384
            while acap < self.alen + n:
                acap *= 2
            if acap > 0xFFFFFFFF:
                raise MemoryError("subject arena full")
            np = realloc(self.arena, acap)
            if np == NULL:
                raise MemoryError()
            self.arena = <uint8_t*>np
            self.acap = acap
        memcpy(self.arena + self.alen, s, n)
        e = &self.subj[self.nsubj]
        memset(e, 0, sizeof(Subj))
        e.hash = h
        e.off = <uint32_t>self.alen
        e.len = <uint32_t>n
        self.alen += n
        i = <uint32_t>h & (self.hcap - 1)
        while self.htab[i]:
            i = (i + 1) & (self.hcap - 1)
        self.nsubj += 1
        self.htab[i] = self.nsubj
        return self.nsubj - 1

    cdef int reset_subjects(self) except -1:
        """Forget every subject (only when no message is live)."""
        self.nsubj = 0
        self.alen = 0
        self.nsubj_live = 0
        if self.htab != NULL:
            memset(self.htab, 0, self.hcap * sizeof(uint32_t))
        self.table_epoch += 1
        self.filters.clear()
        return 0

    cdef void subj_add(self, uint32_t sid, uint64_t seq) noexcept:
        cdef Subj* e = &self.subj[sid]
        if e.count == 0:
            e.first = seq
            e.stale = 0
            self.nsubj_live += 1
        elif seq < e.first and not (e.stale & STALE_FIRST):
            e.first = seq
        e.last = seq
        e.stale &= ~STALE_LAST
        e.count += 1

    cdef void subj_del(self, uint32_t sid, uint64_t seq) noexcept:
        cdef Subj* e = &self.subj[sid]
        e.count -= 1
        if e.count == 0:
            e.stale = 0
            self.nsubj_live -= 1
            return
        if seq == e.first:
            e.stale |= STALE_FIRST
        if seq == e.last:
            e.stale |= STALE_LAST

    cdef int subj_fix(self, uint32_t sid) except -1:
        cdef Subj* e = &self.subj[sid]
        cdef FilterC f
        cdef uint64_t s
        if not e.stale or e.count == 0:
            return 0
        f.mode = FILTER_LITERAL
        f.sid = sid
        if e.stale & STALE_FIRST:
            s = self.scan_fwd(e.first + 1 if e.first >= self.first else self.first,
                              self.last, &f)
            e = &self.subj[sid]
            e.first = s
            e.stale &= ~STALE_FIRST
        if e.stale & STALE_LAST:
            s = self.scan_bwd(e.last - 1 if e.last <= self.last else self.last, e.first, &f)
            e = &self.subj[sid]
            e.last = s
            e.stale &= ~STALE_LAST
        return 0

    cdef bytes subject_bytes(self, uint32_t sid):
        return PyBytes_FromStringAndSize(<char*>self.arena + self.subj[sid].off,
                                         self.subj[sid].len)

    # ---- filters -----------------------------------------------------------------

    cdef _Filter get_filter(self, object pattern):
        cdef _Filter f = _Filter.__new__(_Filter)
        cdef const uint8_t* p
        cdef Py_ssize_t n
        cdef long sid
        cdef uint32_t i, ncap
        cdef Subj* e
        f.c.mode = FILTER_ALL
        if pattern is None:
            return f
        if not isinstance(pattern, bytes):
            pattern = bytes(pattern)
        p = <const uint8_t*>PyBytes_AS_STRING(pattern)
        n = PyBytes_GET_SIZE(pattern)
        if n == 0 or (n == 1 and p[0] == 62):
            return f
        if not has_wildcard(p, n):
            sid = self.find_subject(p, n)
            if sid < 0:
                f.c.mode = FILTER_NONE
            else:
                f.c.mode = FILTER_LITERAL
                f.c.sid = <uint32_t>sid
            return f
        cached = self.filters.get(pattern)
        if cached is not None and (<_Filter>cached).table_epoch == self.table_epoch:
            f = <_Filter>cached
        else:
            if len(self.filters) > 64:
                self.filters.clear()
            f.pattern = pattern
            f.table_epoch = self.table_epoch
            f.c.mode = FILTER_WILD
            self.filters[pattern] = f
        if f.c.nbits < self.nsubj:
            # New subjects since this filter was last used: match just those.
            if f.cap < self.nsubj:
                ncap = f.cap * 2 if f.cap else 1024
                while ncap < self.nsubj:
                    ncap *= 2
                np = realloc(f.bits, ncap)
                if np == NULL:
                    raise MemoryError()
                f.bits = <uint8_t*>np
                f.cap = ncap
            for i in range(f.c.nbits, self.nsubj):
                e = &self.subj[i]
                f.bits[i] = subject_match(p, n, self.arena + e.off, e.len)
            f.c.nbits = self.nsubj
        f.c.bits = f.bits
        return f

    cdef bint block_may(self, Block b, FilterC* f) noexcept:
        cdef uint32_t i, v
        if f.mode == FILTER_ALL:
            return True
        if f.mode == FILTER_LITERAL:
            return idset_has(&b.subjects, f.sid)
        if f.mode == FILTER_WILD:
            for i in range(b.subjects.cap):
                v = b.subjects.tab[i]
                if v != NOID and v < f.nbits and f.bits[v]:
                    return True
        return False

    cdef uint64_t scan_fwd(self, uint64_t seq, uint64_t end, FilterC* f) except? 0:
        """First live sequence in [seq, end] matching f, skipping blocks that hold no
        matching subject; 0 if none."""
        cdef Slot* s
        cdef uint32_t cur = NOBLK
        cdef bint ok = True
        cdef Block b
        if seq < self.sbase:
            seq = self.sbase
        if end >= self.sbase + self.nslots:
            end = self.sbase + self.nslots - 1
        while seq <= end:
            s = SL(self, seq)
            if s.flags & SLOT_LIVE:
                if f.mode == FILTER_ALL:
                    return seq
                if s.blk != cur:
                    cur = s.blk
                    b = self.block_at(cur)
                    ok = self.block_may(b, f)
                    if not ok and b.last > seq:
                        seq = b.last + 1
                        continue
                if ok and fmatch(f, s.subj):
                    return seq
            seq += 1
        return 0

    cdef uint64_t scan_bwd(self, uint64_t seq, uint64_t low, FilterC* f) except? 0:
        cdef Slot* s
        cdef uint32_t cur = NOBLK
        cdef bint ok = True
        cdef Block b
        if self.nslots == 0:
            return 0
        if low < self.sbase:
            low = self.sbase
        if seq >= self.sbase + self.nslots:
            seq = self.sbase + self.nslots - 1
        while seq >= low and seq > 0:
            s = SL(self, seq)
            if s.flags & SLOT_LIVE:
                if f.mode == FILTER_ALL:
                    return seq
                if s.blk != cur:
                    cur = s.blk
                    b = self.block_at(cur)
                    ok = self.block_may(b, f)
                    if not ok and b.first < seq and b.first > 0:
                        seq = b.first - 1
                        continue
                if ok and fmatch(f, s.subj):
                    return seq
            seq -= 1
        return 0

    cdef uint64_t next_match(self, uint64_t start, FilterC* f) except? 0:
        cdef uint64_t end = self.last
        cdef Subj* e
        if f.mode == FILTER_NONE or self.msgs == 0:
            return 0
        if start < self.first:
            start = self.first
        if f.mode == FILTER_LITERAL:
            e = &self.subj[f.sid]
            if e.count == 0:
                return 0
            self.subj_fix(f.sid)
            e = &self.subj[f.sid]
            if start < e.first:
                start = e.first
            end = e.last
        return self.scan_fwd(start, end, f)

    cdef uint64_t prev_match(self, uint64_t start, FilterC* f) except? 0:
        cdef uint64_t low = self.first
        cdef Subj* e
        if f.mode == FILTER_NONE or self.msgs == 0:
            return 0
        if start > self.last:
            start = self.last
        if f.mode == FILTER_LITERAL:
            e = &self.subj[f.sid]
            if e.count == 0:
                return 0
            self.subj_fix(f.sid)
            e = &self.subj[f.sid]
            if start > e.last:
                start = e.last
            low = e.first
        if start < low:
            return 0
        return self.scan_bwd(start, low, f)

    # ---- blocks ------------------------------------------------------------------

    cdef Block block_at(self, uint32_t index):
        return <Block>PyList_GET_ITEM(self.blkv, index - self.blk_base)

    cdef Block new_block(self):
        cdef Block b = Block.__new__(Block)
        b.index = self.next_index
        self.next_index += 1
        if not self.blkv:
            self.blk_base = b.index
        while self.blk_base + len(self.blkv) < b.index:
            self.blkv.append(None)
        self.blkv.append(b)
        self.blocks.append(b)
        self.active = b
        self.block_opened(b)
        if self.durable:
            # Every block opens with the sequence range as it stands, so removing any
            # number of older blocks can never make recovery forget last_seq.
            self.put_floor(self.first if self.msgs else self.last + 1)
            self.drop_slots_below(self.first if self.msgs else self.last + 1)
        return b

    cdef block_opened(self, Block b):
        pass

    cdef uint64_t put_floor(self, uint64_t floor) except? 0:
        """FLOOR record: nothing below floor is live; last_seq/last_ts as they are."""
        cdef uint8_t body[16]
        st64(body, self.last)
        st64(body + 8, <uint64_t>self.last_ts)
        return self.put(K_FLOOR, floor, 0, NULL, 0, NULL, 0, body, 16)

    cdef uint64_t put(self, int kind, uint64_t seq, int64_t ts, const uint8_t* subj,
                      size_t slen, const uint8_t* hdr, size_t hlen, const uint8_t* msg,
                      size_t mlen) except? 0:
        """Append one record to the active block's buffer; returns its offset."""
        cdef size_t rlen = HDR + slen + hlen + mlen + SUM
        cdef Block b = self.active
        cdef uint8_t* p
        cdef uint64_t off
        if rlen > MAX_REC:
            raise ValueError("record too large")
        if b is None or (b.size + rlen > self.block_size and b.size > (FLOOR_LEN if self.durable else 0)):
            b = self.new_block()
        b.reserve(rlen)
        p = b.buf + b.bstart + b.blen
        put_header(p, kind, slen, rlen, seq, ts, hlen)
        if slen:
            memcpy(p + HDR, subj, slen)
        if hlen:
            memcpy(p + HDR + slen, hdr, hlen)
        if mlen:
            memcpy(p + HDR + slen + hlen, msg, mlen)
        if self.checksums:
            st64(p + rlen - SUM, xxh64_c(p, rlen - SUM, 0))
        else:
            st64(p + rlen - SUM, 0)
        off = b.size
        b.size += rlen
        b.blen += rlen
        if not self.durable:
            b.flushed = b.synced = b.size
        self.gen += 1
        self.put_block = b
        if not b.dirty_listed and self.durable:
            b.dirty_listed = True
            self.dirty.append(b)
        return off

    cdef int drop_block(self, Block b) except -1:
        self.blocks.remove(b)
        b.removed = True
        if self.durable:
            self.pending_removals.append((self.gen, b))
        else:
            self.release_block(b)
        return 0

    cdef int release_block(self, Block b) except -1:
        """The block's records are gone for good: clear slots that still point at it."""
        if self.win_block is b:
            self.win_block = None
        cdef uint64_t seq, lo, hi
        cdef Slot* s
        if b.first and self.nslots:
            lo = b.first if b.first > self.sbase else self.sbase
            hi = b.last if b.last < self.sbase + self.nslots - 1 else self.sbase + self.nslots - 1
            seq = lo
            while seq <= hi:
                s = SL(self, seq)
                if s.blk == b.index:
                    s.blk = NOBLK
                    s.rlen = 0
                seq += 1
        self.blkv[b.index - self.blk_base] = None
        while self.blkv and self.blkv[0] is None:
            del self.blkv[0]
            self.blk_base += 1
        if b.fd >= 0:
            close(b.fd)
            b.fd = -1
        free(b.buf)
        b.buf = NULL
        b.bcap = b.blen = b.bstart = 0
        b.cache = None
        self.block_released(b)
        return 0

    cdef int block_released(self, Block b) except -1:
        return 0

    cdef int maybe_drop(self, Block b) except -1:
        """Drop a sealed block without live messages, when no older block needs its
        tombstones or truncation markers; then any dead blocks at the front."""
        if (b is not None and b is not self.active and not b.removed and not b.live
                and (b is self.blocks[0] or not b.has_ext)):
            self.drop_block(b)
        while self.blocks:
            b = <Block>self.blocks[0]
            if b is self.active or b.live:
                break
            self.drop_block(b)
        return 0

    # ---- appending and removing --------------------------------------------------

    cdef uint32_t msg_size(self, size_t slen, size_t hlen, size_t mlen) noexcept:
        if self.durable:
            # server/filestore.go fileStoreMsgSize
            if hlen:
                return <uint32_t>(22 + slen + 4 + hlen + mlen + 8)
            return <uint32_t>(22 + slen + mlen + 8)
        # server/memstore.go memStoreMsgSize
        return <uint32_t>(slen + hlen + mlen + 16)

    cdef uint64_t append_c(self, const uint8_t* subj, size_t slen, const uint8_t* hdr,
                           size_t hlen, const uint8_t* msg, size_t mlen, int64_t ts,
                           uint64_t seq) except 0:
        cdef uint32_t sid
        cdef uint64_t off
        cdef Slot* s
        cdef Block b
        if self.closed:
            raise ValueError("log is closed")
        if slen == 0 or slen > 0xFFFF:
            raise ValueError("subject must be 1..65535 bytes")
        if seq == 0:
            seq = self.last + 1
        elif seq <= self.last:
            raise ValueError(f"sequence {seq} is not above last_seq {self.last}")
        if seq > self.last + 1:
            self.skip_to(seq - 1)
        sid = self.subject_id(subj, slen)
        off = self.put(K_MSG, seq, ts, subj, slen, hdr, hlen, msg, mlen)
        b = self.put_block
        self.ensure_seq(seq)
        s = SL(self, seq)
        s.ts = ts
        s.blk = b.index
        s.off = <uint32_t>off
        s.rlen = <uint32_t>(HDR + slen + hlen + mlen + SUM)
        s.subj = sid
        s.size = self.msg_size(slen, hlen, mlen)
        s.flags = SLOT_LIVE
        self.msgs += 1
        self.nbytes += s.size
        if self.msgs == 1:
            self.first = seq
        self.last = seq
        self.last_ts = ts
        self.subj_add(sid, seq)
        b.live += 1
        b.live_bytes += s.rlen
        if b.first == 0:
            b.first = seq
        b.last = seq
        idset_add(&b.subjects, sid)
        return seq

    cdef int skip_to(self, uint64_t upto) except -1:
        """Sequences last_seq+1 .. upto are used without a message (deleted)."""
        cdef uint8_t body[8]
        if self.msgs == 0:
            # Nothing live: the gap simply moves the start of the log.
            self.last = upto
            self.first = upto + 1
            if self.durable:
                self.put_floor(upto + 1)
            self.drop_slots_below(upto + 1)
        else:
            if self.durable:
                st64(body, upto)
                self.put(K_SKIP, self.last + 1, 0, NULL, 0, NULL, 0, body, 8)
            self.ensure_seq(upto)
            self.last = upto
        return 0

    def skip(self, uint64_t seq=0, uint64_t num=1):
        """Use sequences without storing messages (nats-server SkipMsg / SkipMsgs):
        seq..seq+num-1 (seq=0: last_seq + 1) become deleted; returns the last one."""
        self.check_open()
        if seq == 0:
            seq = self.last + 1
        elif seq <= self.last:
            raise ValueError(f"sequence {seq} is not above last_seq {self.last}")
        if num == 0:
            raise ValueError("num must be at least 1")
        self.skip_to(seq + num - 1)
        return seq + num - 1

    def append(self, subject, hdr, msg, int64_t ts, uint64_t seq=0):
        """Buffer one message; returns its sequence (seq=0: last_seq + 1).  hdr may be
        None; an empty header is stored (and loaded) as None."""
        cdef Py_buffer sv, hv, mv
        cdef uint64_t r
        if type(subject) is bytes and type(msg) is bytes and (hdr is None or type(hdr) is bytes):
            return self.append_c(<const uint8_t*>PyBytes_AS_STRING(subject),
                                 PyBytes_GET_SIZE(subject),
                                 <const uint8_t*>PyBytes_AS_STRING(hdr) if hdr is not None else NULL,
                                 PyBytes_GET_SIZE(hdr) if hdr is not None else 0,
                                 <const uint8_t*>PyBytes_AS_STRING(msg), PyBytes_GET_SIZE(msg),
                                 ts, seq)
        if hdr is None:
            hdr = b""
        get_buffer(subject, &sv)
        try:
            get_buffer(hdr, &hv)
            try:
                get_buffer(msg, &mv)
                try:
                    r = self.append_c(<const uint8_t*>sv.buf, sv.len,
                                      <const uint8_t*>hv.buf, hv.len,
                                      <const uint8_t*>mv.buf, mv.len, ts, seq)
                finally:
                    PyBuffer_Release(&mv)
            finally:
                PyBuffer_Release(&hv)
        finally:
            PyBuffer_Release(&sv)
        return r

    cdef int advance_first(self) except -1:
        cdef uint64_t seq = self.first
        if seq < self.sbase:
            seq = self.sbase
        while seq <= self.last:
            if seq - self.sbase < self.nslots and SL(self, seq).flags & SLOT_LIVE:
                break
            seq += 1
        self.first = seq
        return 0

    cdef bint remove_c(self, uint64_t seq, bint secure, bint marker) except -1:
        cdef Slot* s
        cdef Block b, tb
        cdef uint32_t blk, rlen, off
        if not HAS(self, seq):
            return False
        s = SL(self, seq)
        if not (s.flags & SLOT_LIVE):
            return False
        s.flags &= ~SLOT_LIVE
        self.msgs -= 1
        self.nbytes -= s.size
        self.subj_del(s.subj, seq)
        blk, off, rlen = s.blk, s.off, s.rlen
        b = self.block_at(blk)
        b.live -= 1
        b.live_bytes -= rlen
        if marker and self.durable:
            self.put(K_TOMB, seq, 0, NULL, 0, NULL, 0, NULL, 0)
            tb = self.put_block
            if tb is not b:
                tb.has_ext = True
        if secure:
            self.erase(b, off, rlen, seq)
        if seq == self.first:
            self.advance_first()
        if self.msgs == 0:
            self.first = self.last + 1
        self.maybe_drop(b)
        if (not self.durable and not b.removed and b is not self.active and b.live
                and b.live_bytes * 2 < b.size):
            # Memory is what a memory log holds: give half a segment back at once
            # (each rewrite halves the segment, so the cost per removal stays constant).
            self.rewrite_block(b)
        return True

    cdef int erase(self, Block b, uint64_t off, uint32_t rlen, uint64_t seq) except -1:
        """Overwrite a removed message's record so its bytes are gone."""
        cdef uint64_t base = b.size - b.blen
        cdef bytes rec = PyBytes_FromStringAndSize(NULL, rlen)
        cdef uint8_t* p = <uint8_t*>PyBytes_AS_STRING(rec)
        memset(p, 0, rlen)
        # The timestamp stays: it is metadata (last_ts survives the erase, as in nats-server).
        put_header(p, K_ERASED, 0, rlen, seq, SL(self, seq).ts, 0)
        if self.checksums:
            st64(p + rlen - SUM, xxh64_c(p, rlen - SUM, 0))
        if off + rlen > base:
            memcpy(b.buf + b.bstart + (off - base), p, rlen)
        if b.compressed:
            self.before_compaction()
            self.rewrite_block(b)
        elif off < b.flushed:
            self.write_at(b, rec, off)
            self.erasures.append((self.gen, b, off, rec))
        return 0

    cdef int write_at(self, Block b, bytes data, uint64_t off) except -1:
        raise NotImplementedError

    def remove(self, uint64_t seq, bint secure=False):
        """Delete one message (a tombstone on disk); secure=True also overwrites it."""
        self.check_open()
        return self.remove_c(seq, secure, True)

    cdef check_open(self):
        if self.closed:
            raise ValueError("log is closed")

    # ---- reading -----------------------------------------------------------------

    cdef const uint8_t* read(self, Block b, uint64_t off, uint32_t rlen) except NULL:
        cdef uint64_t base = b.size - b.blen
        if off >= base:
            return b.buf + b.bstart + (off - base)
        return self.read_file(b, off, rlen)

    cdef const uint8_t* read_file(self, Block b, uint64_t off, uint32_t rlen) except NULL:
        raise OSError(EIO, "record not in memory")

    cdef object record_tuple(self, uint64_t seq, bint with_seq):
        """The stored message as a tuple, or None if its record fails its checksum
        (then it is reported in recovery['corrupt'] and removed)."""
        cdef Slot* s = SL(self, seq)
        cdef Block b = self.block_at(s.blk)
        cdef uint32_t rlen = s.rlen
        cdef const uint8_t* p = self.read(b, s.off, rlen)
        cdef size_t slen, hlen
        if (p[0] != MAGIC or p[1] != K_MSG or ld64(p + 8) != seq or ld32(p + 4) != rlen
                or (self.checksums and not sum_ok(p, rlen))):
            self.lose(seq, b, s.off, "checksum mismatch on read")
            return None
        slen = ld16(p + 2)
        hlen = ld32(p + 24)
        subject = PyBytes_FromStringAndSize(<const char*>p + HDR, slen)
        hdr = PyBytes_FromStringAndSize(<const char*>p + HDR + slen, hlen) if hlen else None
        msg = PyBytes_FromStringAndSize(<const char*>p + HDR + slen + hlen,
                                        rlen - HDR - SUM - slen - hlen)
        if with_seq:
            return (seq, subject, hdr, msg, <int64_t>ld64(p + 16))
        return (subject, hdr, msg, <int64_t>ld64(p + 16))

    cdef const uint8_t* record_ptr(self, uint64_t seq, uint32_t* rlen) except *:
        """A live message's record as stored (valid until the next read), checked
        like record_tuple; NULL when it failed its checksum (and is now lost).
        Layout: HDR bytes of header (subject length at 2, timestamp at 16, header
        length at 24), then subject, headers and payload, then SUM bytes of checksum."""
        cdef Slot* s = SL(self, seq)
        cdef Block b = self.block_at(s.blk)
        cdef const uint8_t* p = self.read(b, s.off, s.rlen)
        if (p[0] != MAGIC or p[1] != K_MSG or ld64(p + 8) != seq or ld32(p + 4) != s.rlen
                or (self.checksums and not sum_ok(p, s.rlen))):
            self.lose(seq, b, s.off, "checksum mismatch on read")
            return NULL
        rlen[0] = s.rlen
        return p

    cdef lose(self, uint64_t seq, Block b, uint64_t off, str reason):
        self.recovery.setdefault("corrupt", []).append(
            {"block": b.index, "offset": off, "seq": seq, "reason": reason})
        self.recovery.setdefault("lost", []).append(seq)
        self.remove_c(seq, False, True)

    def load(self, uint64_t seq):
        """(subject, hdr, msg, ts) of a live message, else None."""
        self.check_open()
        if not HAS(self, seq) or not (SL(self, seq).flags & SLOT_LIVE):
            return None
        return self.record_tuple(seq, False)

    def load_next(self, uint64_t start_seq, filter=None):
        """(seq, subject, hdr, msg, ts) of the first live message >= start_seq whose
        subject matches filter, else None."""
        cdef _Filter f
        cdef uint64_t seq
        self.check_open()
        f = self.get_filter(filter)
        while True:
            seq = self.next_match(start_seq, &f.c)
            if seq == 0:
                return None
            r = self.record_tuple(seq, True)
            if r is not None:
                return r
            start_seq = seq + 1

    def load_prev(self, uint64_t start_seq, filter=None):
        """Last live message with seq <= start_seq matching filter, else None."""
        cdef _Filter f
        cdef uint64_t seq
        self.check_open()
        f = self.get_filter(filter)
        while start_seq:
            seq = self.prev_match(start_seq, &f.c)
            if seq == 0:
                return None
            r = self.record_tuple(seq, True)
            if r is not None:
                return r
            start_seq = seq - 1
        return None

    def load_last(self, filter=None):
        """Last live message matching filter (a literal subject is O(1))."""
        return self.load_prev(self.last, filter)

    # ---- state -------------------------------------------------------------------

    @property
    def first_seq(self):
        return self.first

    @property
    def last_seq(self):
        return self.last

    @property
    def msgs(self):
        return self.msgs

    @property
    def bytes(self):
        return self.nbytes

    @property
    def synced_seq(self):
        return self.synced

    @property
    def pending_bytes(self):
        """Bytes appended but not yet handed to the OS by begin_sync."""
        cdef uint64_t n = 0
        for b in self.dirty:
            n += (<Block>b).size - (<Block>b).flushed
        return n

    @property
    def num_blocks(self):
        return len(self.blocks)

    @property
    def store_bytes(self):
        """Bytes of records the blocks hold (live, dead and markers; uncompressed)."""
        cdef uint64_t n = 0
        for b in self.blocks:
            n += (<Block>b).size
        return n

    def state(self):
        """nats-server StreamState fields (timestamps as int ns, 0 when unset)."""
        cdef uint64_t ndel = 0
        cdef int64_t first_ts = 0
        if self.msgs:
            ndel = self.last - self.first + 1 - self.msgs
            first_ts = SL(self, self.first).ts
        return {
            "messages": self.msgs,
            "bytes": self.nbytes,
            "first_seq": self.first,
            "first_ts": first_ts,
            "last_seq": self.last,
            "last_ts": self.last_ts,
            "num_deleted": ndel,
            "num_subjects": self.nsubj_live,
        }

    def deleted(self, Py_ssize_t limit=0):
        """Interior deleted sequences (between first_seq and last_seq)."""
        cdef list out = []
        cdef uint64_t seq
        if self.msgs == 0:
            return out
        seq = self.first
        while seq <= self.last:
            if not HAS(self, seq) or not (SL(self, seq).flags & SLOT_LIVE):
                out.append(seq)
                if limit and len(out) >= limit:
                    break
            seq += 1
        return out

    def subject_state(self, subject):
        """(count, first_seq, last_seq) of a literal subject; zeros if none."""
        cdef bytes s = bytes(subject)
        cdef long sid
        if not s:
            return (0, 0, 0)
        sid = self.find_subject(<const uint8_t*>PyBytes_AS_STRING(s), len(s))
        if sid < 0 or self.subj[sid].count == 0:
            return (0, 0, 0)
        self.subj_fix(<uint32_t>sid)
        return (self.subj[sid].count, self.subj[sid].first, self.subj[sid].last)

    def subjects(self, filter=None):
        """{subject: live message count} for subjects matching filter."""
        cdef dict out = {}
        cdef _Filter f = self.get_filter(filter)
        cdef uint32_t i
        if f.c.mode == FILTER_LITERAL:
            if self.subj[f.c.sid].count:
                out[self.subject_bytes(f.c.sid)] = self.subj[f.c.sid].count
            return out
        if f.c.mode == FILTER_NONE:
            return out
        for i in range(self.nsubj):
            if self.subj[i].count and fmatch(&f.c, i):
                out[self.subject_bytes(i)] = self.subj[i].count
        return out

    cdef uint64_t count_range(self, uint64_t seq, uint64_t end, FilterC* f) except? 0:
        cdef uint64_t n = 0
        while True:
            seq = self.scan_fwd(seq, end, f)
            if seq == 0:
                return n
            n += 1
            seq += 1

    def num_pending(self, uint64_t start_seq, filter=None, bint last_per_subject=False):
        """Live messages >= start_seq matching filter; with last_per_subject, the
        number of matching subjects whose last message is >= start_seq."""
        cdef _Filter f = self.get_filter(filter)
        cdef uint64_t n = 0, below
        cdef uint32_t i
        cdef Subj* e
        cdef Block b
        if self.msgs == 0 or f.c.mode == FILTER_NONE:
            return 0
        if start_seq < self.first:
            start_seq = self.first
        if start_seq > self.last:
            return 0
        if last_per_subject:
            if f.c.mode == FILTER_LITERAL:
                self.subj_fix(f.c.sid)
                return 1 if self.subj[f.c.sid].count and self.subj[f.c.sid].last >= start_seq else 0
            for i in range(self.nsubj):
                e = &self.subj[i]
                if e.count and fmatch(&f.c, i):
                    self.subj_fix(i)
                    if self.subj[i].last >= start_seq:
                        n += 1
            return n
        if f.c.mode == FILTER_ALL:
            if start_seq <= self.first:
                return self.msgs
            # Whole blocks from the back by their live counts, then part of one.
            for bi in range(len(self.blocks) - 1, -1, -1):
                b = <Block>self.blocks[bi]
                if not b.live:
                    continue
                if b.first >= start_seq:
                    n += b.live
                else:
                    if b.last >= start_seq:
                        n += self.count_range(start_seq, b.last, &f.c)
                    break
            return n
        if f.c.mode == FILTER_LITERAL:
            self.subj_fix(f.c.sid)
            e = &self.subj[f.c.sid]
            if start_seq <= e.first:
                return e.count
            if start_seq > e.last:
                return 0
            if start_seq - e.first < e.last - start_seq:
                below = self.count_range(e.first, start_seq - 1, &f.c)
                return self.subj[f.c.sid].count - below
            return self.count_range(start_seq, e.last, &f.c)
        if start_seq <= self.first:
            for i in range(self.nsubj):
                if self.subj[i].count and fmatch(&f.c, i):
                    n += self.subj[i].count
            return n
        return self.count_range(start_seq, self.last, &f.c)

    # ---- bulk removal ------------------------------------------------------------

    cdef uint64_t remove_below(self, uint64_t seq) except? 0:
        cdef uint64_t n = 0, s = self.first
        if s < self.sbase:
            s = self.sbase
        while s < seq and s <= self.last:
            if self.remove_c(s, False, False):
                n += 1
            s += 1
        return n

    def compact(self, uint64_t seq):
        """Remove every message below seq (server/filestore.go Compact); returns the
        number removed.  seq past last_seq empties the log and makes seq the next."""
        cdef uint64_t n
        self.check_open()
        if seq == 0:
            return self.purge()
        if seq <= self.first and seq <= self.last:
            return 0
        if seq > self.last:
            n = self.msgs
            self.remove_below(self.last + 1)
            self.last = seq - 1
            self.first = seq
            self.drop_slots_below(seq)
            self.after_emptied()
            return n
        if self.durable:
            self.put_floor(seq)
        n = self.remove_below(seq)
        self.advance_first()
        self.drop_slots_below(seq)
        if self.msgs == 0:
            self.after_emptied()
        return n

    cdef int after_emptied(self) except -1:
        """Nothing is live: start a fresh block (its opening FLOOR keeps the sequence
        range) so every older block can go, and forget the subjects."""
        cdef Block old = self.active
        self.first = self.last + 1
        self.reset_subjects()
        if old is not None and old.size > (FLOOR_LEN if self.durable else 0):
            self.new_block()
            self.maybe_drop(old)
        elif self.durable:
            self.put_floor(self.first)
        return 0

    def purge(self, subject=None, uint64_t seq=0, uint64_t keep=0):
        """server/filestore.go PurgeEx: everything, or one subject filter, below seq
        (exclusive), keeping the newest `keep` of the filter; returns the count."""
        cdef _Filter f
        cdef uint64_t total, maxp = 0, upto, n = 0, s
        self.check_open()
        if seq == 1:
            return 0
        if subject is None or subject == b">" or subject == b"":
            if keep == 0 and seq == 0:
                return self.compact(self.last + 1)
            if seq > 1:
                return self.compact(seq)
            subject = None
        f = self.get_filter(subject)
        total = self.num_pending(self.first, subject)
        if total == 0:
            return 0
        if keep:
            if keep >= total:
                return 0
            maxp = total - keep
        upto = seq - 1 if seq else self.last
        s = self.first
        while True:
            s = self.next_match(s, &f.c)
            if s == 0 or s > upto:
                break
            self.remove_c(s, False, True)
            n += 1
            if maxp and n >= maxp:
                break
            s += 1
        if self.msgs == 0:
            self.after_emptied()
        return n

    def expire(self, int64_t before_ts):
        """Remove messages from the front whose timestamp is < before_ts (max_age)."""
        cdef uint64_t cut, n
        cdef Slot* s
        self.check_open()
        cut = self.first if self.first > self.sbase else self.sbase
        while cut <= self.last:
            if HAS(self, cut):
                s = SL(self, cut)
                if s.flags & SLOT_LIVE and s.ts >= before_ts:
                    break
            cut += 1
        if cut <= self.first:
            return 0
        if self.durable:
            self.put_floor(cut)
        n = self.remove_below(cut)
        self.drop_slots_below(cut)
        if self.msgs == 0:
            self.after_emptied()
        return n

    def truncate(self, uint64_t seq):
        """Remove every message above seq (Raft log truncation); last_seq becomes seq."""
        cdef uint8_t body[8]
        self.check_open()
        self.win_block = None
        if seq >= self.last:
            return 0
        # server/memstore.go Truncate: last_ts becomes the kept last message's, if live.
        if HAS(self, seq) and SL(self, seq).flags & SLOT_LIVE:
            self.last_ts = SL(self, seq).ts
        if self.durable:
            st64(body, <uint64_t>self.last_ts)
            self.put(K_TRUNC, seq, 0, NULL, 0, NULL, 0, body, 8)
            self.put_block.has_ext = True
        return self.drop_above(seq)

    cdef uint64_t drop_above(self, uint64_t seq) except? 0:
        """The index forgets every message above seq (nothing is written)."""
        cdef uint64_t s, n = 0
        cdef Block b
        s = self.last
        while s > seq and s >= self.sbase:
            if HAS(self, s) and self.remove_c(s, False, False):
                n += 1
            s -= 1
        if seq + 1 > self.sbase:
            if seq + 1 - self.sbase < self.nslots:
                self.nslots = seq + 1 - self.sbase
        else:
            self.nslots = 0
            self.sbase = seq + 1
        self.last = seq
        if self.synced > seq:
            self.synced = seq
        for b in self.blocks:
            if b.last > seq:
                if b.first > seq:
                    b.first = b.last = 0
                else:
                    b.last = seq
        if self.msgs == 0:
            # Below the first sequence too (a Raft log reset): the next one is seq + 1.
            self.first = seq + 1
        for b in list(self.blocks):
            if not b.removed:
                self.maybe_drop(b)
        return n

    # ---- block compaction --------------------------------------------------------

    cdef object block_content(self, Block b):
        """Everything in a sealed block, uncompressed, as bytes."""
        return PyBytes_FromStringAndSize(<char*>b.buf + b.bstart, b.blen)

    cdef int store_block(self, Block b, bytes content) except -1:
        """Replace a sealed block's content (atomically for files)."""
        cdef size_t n = len(content)
        free(b.buf)
        b.buf = <uint8_t*>malloc(n or 1)
        if b.buf == NULL:
            b.bcap = b.blen = b.bstart = 0
            raise MemoryError()
        b.bcap = n
        b.bstart = 0
        memcpy(b.buf, PyBytes_AS_STRING(content), n)
        b.blen = n
        b.size = b.flushed = b.synced = n
        return 0

    cdef int rewrite_block(self, Block b) except -1:
        """Rewrite a sealed block without its dead records."""
        self.win_block = None
        cdef bytes content = self.block_content(b)
        cdef const uint8_t* d = <const uint8_t*>PyBytes_AS_STRING(content)
        cdef size_t n = len(content), p = 0, rlen
        cdef int kind, rc
        cdef uint64_t seq
        cdef Slot* s
        cdef bint keep, has_ext = False
        cdef list parts = [], moves = [], dropped = []
        cdef size_t out = 0
        while p < n:
            rc = check_record(d + p, n - p) if self.checksums else 1
            if rc != 1:
                q = resync(d, p + 1, n) if self.checksums else n
                self.recovery.setdefault("corrupt", []).append(
                    {"block": b.index, "offset": p, "length": q - p, "seq": None,
                     "reason": "bad record found while compacting"})
                p = q
                continue
            rlen = ld32(d + p + 4)
            if rlen < MIN_REC or rlen > n - p:
                break
            kind = d[p + 1]
            seq = ld64(d + p + 8)
            keep = False
            if kind == K_MSG or kind == K_ERASED:
                if HAS(self, seq):
                    s = SL(self, seq)
                    if s.blk == b.index and s.off == p and s.rlen:
                        if kind == K_MSG and s.flags & SLOT_LIVE:
                            keep = True
                            moves.append((seq, out))
                        else:
                            dropped.append(seq)
            elif kind == K_TOMB:
                # Still needed while the named record sits in another block's file.
                if HAS(self, seq):
                    s = SL(self, seq)
                    keep = (not (s.flags & SLOT_LIVE)) and s.rlen != 0 and s.blk != b.index
            elif kind == K_TRUNC:
                keep = True
            if keep:
                parts.append(content[p:p + rlen])
                out += rlen
                if kind != K_MSG:
                    has_ext = True
            p += rlen
        if not moves and b.live == 0 and not has_ext:
            for seq in dropped:
                s = SL(self, seq)
                s.blk = NOBLK
                s.rlen = 0
            if b.compressed or not self.durable:
                # Nothing may linger in the file until its removal: empty it first.
                self.store_block(b, b"")
            self.maybe_drop(b)
            return 1
        self.store_block(b, b"".join(parts))
        for seq, off in moves:
            SL(self, seq).off = off
        for seq in dropped:
            s = SL(self, seq)
            s.blk = NOBLK
            s.rlen = 0
        idset_clear(&b.subjects)
        b.first = b.last = 0
        for seq, off in moves:
            s = SL(self, seq)
            idset_add(&b.subjects, s.subj)
            if b.first == 0:
                b.first = seq
            b.last = seq
        b.has_ext = has_ext
        return 1

    def compact_blocks(self, double threshold=0.5):
        """Rewrite sealed blocks whose dead share is above threshold (and, with
        compression="s2", compress sealed blocks); returns blocks rewritten."""
        cdef Block b
        cdef int n = 0
        self.check_open()
        self.reap()
        self.before_compaction()
        for b in list(self.blocks):
            if b is self.active or b.removed or b.synced < b.size or b.size == 0:
                continue
            if b.live == 0:
                self.maybe_drop(b)
                if b.removed:
                    n += 1
                continue
            if (1.0 - <double>b.live_bytes / <double>b.size > threshold
                    or self.wants_compression(b)):
                n += self.rewrite_block(b)
        return n

    cdef int before_compaction(self) except -1:
        return 0

    cdef bint wants_compression(self, Block b) noexcept:
        return False

    # ---- durability --------------------------------------------------------------

    cdef int reap(self) except -1:
        return 0

    def begin_sync(self):
        cdef Sync s = Sync.__new__(Sync)
        self.check_open()
        s.seq = self.last
        s.gen = self.gen
        s.state = SYNC_READY
        return s

    def mark_synced(self, Sync sync):
        """Record that sync.run() succeeded: synced_seq advances to sync.seq."""
        if sync.state == SYNC_READY:
            raise ValueError("Sync.run() has not completed")
        if sync.state != SYNC_OK:
            return False
        if sync.seq > self.synced:
            self.synced = sync.seq
        sync.applied = True
        return True

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


cdef class MemLog(_Log):
    """The memory log: the same index over records kept in memory segments (no
    tombstones or markers, no checksums: nothing is ever read back from a disk)."""

    def __init__(self, uint64_t first_seq=1, *, uint64_t block_size=MEM_BLOCK_SIZE):
        self._setup(False, block_size, first_seq)
        self.recovery = {"blocks": 0, "records": 0, "tombstones": 0, "truncated_bytes": 0,
                         "corrupt": [], "lost": [], "damaged_from": 0, "seconds": 0.0}

    cdef int erase(self, Block b, uint64_t off, uint32_t rlen, uint64_t seq) except -1:
        cdef uint8_t* p = b.buf + b.bstart + (off - (b.size - b.blen))
        memset(p + HDR, 0, rlen - HDR)
        put_header(p, K_ERASED, 0, rlen, seq, SL(self, seq).ts, 0)
        return 0

    def __repr__(self):
        return f"<MemLog first={self.first} last={self.last} msgs={self.msgs}>"


cdef class FileLog(_Log):
    """The file log: block files under <dir>/blk, recovered and verified on open."""

    def __init__(self, dir, uint64_t block_size=DEFAULT_BLOCK_SIZE, compression="none",
                 uint64_t first_seq=1):
        if compression not in ("none", "s2"):
            raise ValueError('compression must be "none" or "s2"')
        self._setup(True, block_size, first_seq)
        self.s2 = compression == "s2"
        self.dirfd = -1
        self.fd_blocks = []
        self.dirpath = os.fspath(dir)
        self.blkdir = os.path.join(self.dirpath, "blk")
        os.makedirs(self.blkdir, exist_ok=True)
        self.dirfd = os.open(self.blkdir, os.O_RDONLY | os.O_DIRECTORY)
        self.recover(first_seq)

    def __dealloc__(self):
        if self.dirfd >= 0:
            close(self.dirfd)

    def __repr__(self):
        return f"<FileLog {self.dirpath!r} first={self.first} last={self.last} msgs={self.msgs}>"

    cdef block_opened(self, Block b):
        b.path = os.path.join(self.blkdir, "%08d.blk" % b.index)

    # ---- recovery ----------------------------------------------------------------

    cdef recover(self, uint64_t first_seq):
        cdef double t0 = time.perf_counter()
        cdef Block b
        cdef size_t end, n
        cdef bytes data
        cdef uint64_t seq, raw
        cdef Slot* s
        cdef bint any_records
        self.recovery = {"blocks": 0, "records": 0, "tombstones": 0, "truncated_bytes": 0,
                         "corrupt": [], "lost": [], "damaged_from": 0, "seconds": 0.0}
        indices = []
        for name in os.listdir(self.blkdir):
            if name.endswith(".tmp"):
                # A compaction that never reached its rename: the original is intact.
                os.unlink(os.path.join(self.blkdir, name))
            elif name.endswith(".blk") and name[:len(name) - 4].isdigit():
                indices.append(int(name[:len(name) - 4]))
        indices.sort()
        self.sbase = 1
        self.rc_floor = 0
        self.rc_max = 0
        for i, index in enumerate(indices):
            b = Block.__new__(Block)
            b.index = index
            b.path = os.path.join(self.blkdir, "%08d.blk" % index)
            if not self.blkv:
                self.blk_base = index
            while self.blk_base + len(self.blkv) < index:
                self.blkv.append(None)
            self.blkv.append(b)
            self.blocks.append(b)
            self.next_index = index + 1
            end = self.scan_file(b, i == len(indices) - 1)
            if end < b.size and not b.compressed:
                os.truncate(b.path, end)
                b.size = b.flushed = b.synced = end
        self.recovery["blocks"] = len(indices)
        self.recovery["records"] = self.rc_records
        self.recovery["tombstones"] = self.rc_tombs
        any_records = self.rc_max > 0 or self.rc_floor > 0
        if not any_records:
            self.first = first_seq
            self.last = first_seq - 1 if first_seq else 0
            self.sbase = first_seq if first_seq else 1
            self.nslots = 0
        else:
            if self.rc_floor > self.rc_max + 1:
                self.rc_max = self.rc_floor - 1
            self.last = self.rc_max
            if self.last >= self.sbase:
                self.ensure_seq(self.last)
            # One pass over the index rebuilds every count from what is live.
            seq = self.sbase
            while seq < self.sbase + self.nslots:
                s = SL(self, seq)
                if s.flags == SLOT_LIVE and s.rlen:
                    b = self.block_at(s.blk)
                    b.live += 1
                    b.live_bytes += s.rlen
                    self.msgs += 1
                    self.nbytes += s.size
                    self.subj_add(s.subj, seq)
                    if self.msgs == 1:
                        self.first = seq
                else:
                    s.flags = 0
                seq += 1
            if self.msgs == 0:
                self.first = self.last + 1
        if self.rc_lost_lo and self.rc_lost_lo <= self.last:
            self.recovery["lost"].append((self.rc_lost_lo, self.last))
        if self.blocks:
            b = <Block>self.blocks[len(self.blocks) - 1]
            if not b.compressed and b.size < self.block_size:
                self.active = b
        self.synced = self.last
        # Blocks with nothing live go, once whatever explains that is durable
        # (it already is: it was read from disk).
        for b in list(self.blocks):
            if not b.removed:
                self.maybe_drop(b)
        self.recovery["seconds"] = time.perf_counter() - t0

    cdef size_t scan_file(self, Block b, bint last_block) except? 0:
        """Scan one block file in place (mmap: no copy of the log into memory)."""
        cdef const uint8_t[::1] view
        cdef size_t n
        with open(b.path, "rb") as fh:
            n = os.fstat(fh.fileno()).st_size
            if n == 0:
                return 0
            if fh.read(8) == ZMAGIC:
                fh.seek(0)
                content = self.decode_compressed(b, fh.read())
                b.compressed = True
                if content is None:
                    return 0
                view = content
                b.size = b.flushed = b.synced = len(content)
                return self.scan(b, &view[0], len(content), False)
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            mm.madvise(mmap.MADV_SEQUENTIAL)
            view = mm
            b.size = b.flushed = b.synced = n
            return self.scan(b, &view[0], n, last_block)
        finally:
            view = None
            mm.close()

    cdef object decode_compressed(self, Block b, bytes data):
        cdef const uint8_t* d = <const uint8_t*>PyBytes_AS_STRING(data)
        cdef size_t n = len(data)
        reason = None
        if n < ZHDR:
            reason = "compressed block header cut short"
        elif ld64(d + 16) != xxh64_c(d + ZHDR, n - ZHDR, 0):
            reason = "compressed block checksum mismatch"
        else:
            try:
                content = decode_block(data[ZHDR:], max_size=<Py_ssize_t>ld64(d + 8))
            except S2Error as exc:
                reason = f"compressed block does not decode: {exc}"
            else:
                if len(content) == ld64(d + 8):
                    return content
                reason = "compressed block has the wrong length"
        self.recovery["corrupt"].append({"block": b.index, "offset": 0, "length": n,
                                         "seq": None, "reason": reason})
        self.damaged_from(1)
        if not self.rc_lost_lo:
            self.rc_lost_lo = self.rc_max + 1
        return None

    cdef size_t scan(self, Block b, const uint8_t* d, size_t n, bint last_block) except? 0:
        """Validate and index every record of one block; returns where the valid
        content ends (a torn or corrupt tail after it is cut off by the caller)."""
        cdef size_t p = 0, q
        cdef int rc
        cdef uint32_t rlen
        cdef uint64_t seq
        while p < n:
            rc = check_record(d + p, n - p)
            if rc == 1:
                rlen = ld32(d + p + 4)
                self.recover_record(b, d + p, <uint32_t>p)
                p += rlen
                continue
            q = resync(d, p + 1, n)
            if q == n and last_block:
                # A write that never completed: nothing valid follows, so cut it off.
                self.recovery["truncated_bytes"] += n - p
                return p
            entry = {"block": b.index, "offset": p, "length": q - p, "seq": None,
                     "reason": "bad header" if rc == 0 else
                               ("record runs past the end of the block" if rc == -1
                                else "checksum mismatch")}
            if rc != 0 and d[p + 1] == K_MSG:
                seq = ld64(d + p + 8)
                entry["seq"] = seq
            self.recovery["corrupt"].append(entry)
            # Which sequences the lost bytes can have been about.  One record whose header
            # holds (a valid record follows it): a message its own sequence, a tombstone
            # the one it names, an erased record none, a marker any.  Anything else (a bad
            # header, a block cut short) may have held tombstones for any sequence.
            if rc == 0 or q != p + ld32(d + p + 4) or d[p + 1] in (K_SKIP, K_FLOOR, K_TRUNC):
                self.damaged_from(1)
            elif d[p + 1] != K_ERASED or ld64(d + p + 8):
                self.damaged_from(ld64(d + p + 8) or 1)
            if entry["seq"] is not None and q == p + ld32(d + p + 4):
                self.recovery["lost"].append(entry["seq"])
            elif not self.rc_lost_lo:
                self.rc_lost_lo = self.rc_max + 1
            if q == n:
                return p
            p = q
        return n

    cdef damaged_from(self, uint64_t seq):
        cdef uint64_t cur = self.recovery["damaged_from"]
        if cur == 0 or seq < cur:
            self.recovery["damaged_from"] = seq

    def scrub(self):
        """Overwrite, in place and durably, each corrupt region the recovery found
        inside a block (``recovery['corrupt']``) with a record that means nothing (an
        erased record of sequence 0), so the next open finds no damage there.  Call it
        right after opening, once what the damage decided is durable (a truncation, a
        repair flag): until then the damage must stay visible to the next recovery.
        Returns how many regions it overwrote; regions shorter than a record, and
        compressed blocks, stay as they are (and are found again)."""
        cdef Block b
        cdef bytes rec
        cdef uint8_t* p
        cdef uint64_t off, n, base
        cdef int done = 0
        self.check_open()
        for entry in self.recovery.get("corrupt") or ():
            n = entry.get("length") or 0
            off = entry.get("offset") or 0
            index = entry.get("block")
            if n < MIN_REC or n > MAX_REC or index is None or index < self.blk_base \
                    or index - self.blk_base >= len(self.blkv):
                continue
            b = self.block_at(index)
            if b is None or b.removed or b.compressed or off + n > b.size:
                continue
            rec = PyBytes_FromStringAndSize(NULL, n)
            p = <uint8_t*>PyBytes_AS_STRING(rec)
            memset(p, 0, n)
            put_header(p, K_ERASED, 0, n, 0, 0, 0)
            st64(p + n - SUM, xxh64_c(p, n - SUM, 0))
            base = b.size - b.blen
            if off + n > base:
                memcpy(b.buf + b.bstart + (off - base), p, n)
            fd = os.open(b.path, os.O_WRONLY)
            try:
                os.pwrite(fd, rec, off)
                os.fsync(fd)
            finally:
                os.close(fd)
            done += 1
        return done

    cdef int recover_record(self, Block b, const uint8_t* r, uint32_t off) except -1:
        cdef int kind = r[1]
        cdef uint64_t seq = ld64(r + 8), x, z, e
        cdef uint32_t slen, sid
        cdef Slot* s
        cdef Block o
        self.rc_records += 1
        if kind == K_MSG:
            if self.rc_lost_lo:
                if seq > self.rc_lost_lo:
                    self.recovery["lost"].append((self.rc_lost_lo, seq - 1))
                self.rc_lost_lo = 0
            if seq < self.rc_floor or seq == 0:
                return 0
            if self.nslots == 0 and self.rc_max == 0:
                self.sbase = seq
            self.ensure_seq(seq)
            slen = ld16(r + 2)
            sid = self.subject_id(r + HDR, slen)
            s = SL(self, seq)
            s.ts = <int64_t>ld64(r + 16)
            s.blk = b.index
            s.off = off
            s.rlen = ld32(r + 4)
            s.subj = sid
            s.size = self.msg_size(slen, ld32(r + 24), s.rlen - HDR - SUM - slen - ld32(r + 24))
            s.flags = SLOT_LIVE
            idset_add(&b.subjects, sid)
            if b.first == 0:
                b.first = seq
            b.last = seq
            if seq >= self.rc_max:
                self.rc_max = seq
                self.last_ts = s.ts
        elif kind == K_TOMB or kind == K_ERASED:
            if kind == K_TOMB:
                self.rc_tombs += 1
            if seq >= self.rc_floor and seq:
                if self.nslots == 0 and self.rc_max == 0:
                    self.sbase = seq
                self.ensure_seq(seq)
                s = SL(self, seq)
                s.flags = (s.flags & ~SLOT_LIVE) | SLOT_TOMB
                if kind == K_TOMB and s.blk != b.index:
                    b.has_ext = True
            if kind == K_ERASED and seq >= self.rc_max:
                self.last_ts = <int64_t>ld64(r + 16)
            if seq > self.rc_max:
                self.rc_max = seq
        elif kind == K_SKIP:
            z = ld64(r + HDR)
            if z > self.rc_max:
                self.rc_max = z
        elif kind == K_FLOOR:
            z = ld64(r + HDR)
            if seq > self.rc_floor:
                self.rc_floor = seq
                self.drop_slots_below(seq)
            if z >= self.rc_max:
                self.rc_max = z
                self.last_ts = <int64_t>ld64(r + HDR + 8)
            if seq and seq - 1 > self.rc_max:
                self.rc_max = seq - 1
        elif kind == K_TRUNC:
            b.has_ext = True
            if seq + 1 < self.rc_floor:
                self.rc_floor = seq + 1
            if seq < self.sbase:
                self.nslots = 0
                self.sbase = seq + 1
            elif HAS(self, seq):
                self.nslots = seq + 1 - self.sbase
            self.rc_max = seq
            self.last_ts = <int64_t>ld64(r + HDR)
            for o in self.blocks:
                if o.last > seq:
                    if o.first > seq:
                        o.first = o.last = 0
                    else:
                        o.last = seq
        return 0

    # ---- files -------------------------------------------------------------------

    cdef int ensure_fd(self, Block b) except -1:
        cdef Block o
        if b.fd >= 0:
            return 0
        b.fd = os.open(b.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.fd_blocks.append(b)
        if len(self.fd_blocks) > MAX_OPEN_BLOCKS:
            # A long log must not run out of descriptors: close the oldest-opened ones
            # that nothing is writing (a sealed block reopens on its next read).
            excess = -(MAX_OPEN_BLOCKS // 2)
            for o in self.fd_blocks:
                if o.fd >= 0:
                    excess += 1
            keep = []
            for o in self.fd_blocks:
                if o.fd < 0:
                    continue
                if (excess > 0 and o is not b and o is not self.active
                        and not o.dirty_listed):
                    close(o.fd)
                    o.fd = -1
                    excess -= 1
                else:
                    keep.append(o)
            self.fd_blocks = keep
        return 0

    cdef const uint8_t* read_file(self, Block b, uint64_t off, uint32_t rlen) except NULL:
        cdef ssize_t r
        cdef size_t got = 0, want
        cdef void* np
        if b.compressed:
            if self.cached is not b or b.cache is None:
                if self.cached is not None:
                    self.cached.cache = None
                with open(b.path, "rb") as fh:
                    data = fh.read()
                content = self.decode_compressed(b, data)
                if content is None:
                    raise OSError(EIO, f"compressed block {b.index} is corrupt")
                b.cache = content
                self.cached = b
            return <const uint8_t*>PyBytes_AS_STRING(b.cache) + off
        if self.win_block is b and off >= self.win_off and \
                off + rlen <= self.win_off + self.win_len:
            return self.scratch + (off - self.win_off)
        # Read ahead up to READ_AHEAD (what the OS has of the file: b.flushed bytes).
        want = rlen
        if b.flushed > off + rlen:
            want = min(max(<uint64_t>rlen, <uint64_t>READ_AHEAD), b.flushed - off)
        if self.scratch_cap < want:
            np = realloc(self.scratch, want)
            if np == NULL:
                raise MemoryError()
            self.scratch = <uint8_t*>np
            self.scratch_cap = want
        self.win_block = None
        self.ensure_fd(b)
        while got < rlen:
            r = pread(b.fd, self.scratch + got, want - got, off + got)
            if r < 0:
                if errno == EINTR:
                    continue
                raise OSError(errno, os.strerror(errno))
            if r == 0:
                raise OSError(EIO, f"short read in block {b.index}")
            got += r
        self.win_block = b
        self.win_off = off
        self.win_len = got
        return self.scratch

    cdef int write_at(self, Block b, bytes data, uint64_t off) except -1:
        cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
        self.win_block = None
        cdef size_t n = len(data), done = 0
        cdef ssize_t r
        self.ensure_fd(b)
        while done < n:
            r = pwrite(b.fd, p + done, n - done, off + done)
            if r < 0:
                if errno == EINTR:
                    continue
                raise OSError(errno, os.strerror(errno))
            done += r
        self.gen += 1
        b.needs_sync = True
        if not b.dirty_listed:
            b.dirty_listed = True
            self.dirty.append(b)
        return 0

    cdef int flush_block(self, Block b) except -1:
        """Hand a block's buffered bytes to the OS; on a short write or an error the
        rest stays buffered and the next begin_sync continues from there."""
        cdef ssize_t r
        cdef uint64_t base
        if b.fd < 0:
            self.ensure_fd(b)
            self.dir_dirty = True
        base = b.size - b.blen
        while b.flushed < b.size:
            r = pwrite(b.fd, b.buf + b.bstart + (b.flushed - base), b.size - b.flushed,
                       b.flushed)
            if r < 0:
                if errno == EINTR:
                    continue
                raise OSError(errno, os.strerror(errno))
            if r == 0:
                raise OSError(EIO, "write returned 0")
            b.flushed += r
            b.needs_sync = True
        return 0

    cdef int reap(self) except -1:
        """Account for Syncs that finished: a failed one means the kernel may have
        dropped dirty pages, so every unsynced byte is written again and no older
        Sync's success is trusted; successful ones release their buffered bytes."""
        cdef Sync s
        cdef Block b
        failed = False
        live = []
        for ref in self.outstanding:
            obj = ref()
            if obj is None:
                continue
            s = <Sync>obj
            if s.state == SYNC_FAILED and s.epoch == self.epoch:
                failed = True
            elif s.state == SYNC_READY:
                live.append(ref)
        if failed:
            self.epoch += 1
            for b in self.blocks:
                if b.fd >= 0 or b.flushed:
                    b.flushed = b.size - b.blen
                    b.needs_sync = True
                    if not b.dirty_listed:
                        b.dirty_listed = True
                        self.dirty.append(b)
            self.dir_dirty = True
            for gen, b, off, rec in self.erasures:
                if not b.removed:
                    self.write_at(b, rec, off)
        for ref in self.outstanding:
            obj = ref()
            if obj is not None and (<Sync>obj).state == SYNC_OK:
                self.apply_sync(<Sync>obj)
        self.outstanding = live
        return 0

    cdef int apply_sync(self, Sync s) except -1:
        cdef Block b
        cdef uint64_t end
        if s.applied or s.epoch != self.epoch:
            return 0
        s.applied = True
        for b, end in s.ends:
            if end > b.synced:
                b.synced = end
                b.release_to(end)
            if b is not self.active and b.blen == 0 and b.buf != NULL:
                free(b.buf)
                b.buf = NULL
                b.bcap = 0
        if s.seq > self.synced:
            self.synced = s.seq
        if self.erasures:
            self.erasures = [e for e in self.erasures if e[0] > s.gen]
        if self.pending_removals:
            keep = []
            for gen, b in self.pending_removals:
                if gen <= s.gen:
                    try:
                        os.unlink(b.path)
                    except FileNotFoundError:
                        pass
                    self.dir_dirty = True
                    self.release_block(b)
                else:
                    keep.append((gen, b))
            self.pending_removals = keep
        return 0

    def begin_sync(self):
        """Write everything buffered to the OS and return a Sync holding dup()ed fds of
        every file dirtied since the last begin_sync (plus the directory when block
        files were created or removed).  OSError (ENOSPC, ...) leaves what could not be
        written buffered, to be retried by the next begin_sync."""
        cdef Sync s
        cdef Block b
        cdef list fds = []
        cdef int fd, i
        self.check_open()
        self.reap()
        for b in self.dirty:
            if not b.removed:
                self.flush_block(b)
        s = Sync.__new__(Sync)
        try:
            for b in self.dirty:
                if b.removed or not b.needs_sync:
                    continue
                fd = dup(b.fd)
                if fd < 0:
                    raise OSError(errno, os.strerror(errno))
                fds.append(fd)
                s.ends.append((b, b.size))
            if self.dir_dirty:
                fd = dup(self.dirfd)
                if fd < 0:
                    raise OSError(errno, os.strerror(errno))
                s.dir_slot = len(fds)
                fds.append(fd)
        except BaseException:
            for fd in fds:
                close(fd)
            raise
        s.fds = <int*>malloc((len(fds) or 1) * sizeof(int))
        if s.fds == NULL:
            for fd in fds:
                close(fd)
            raise MemoryError()
        for i in range(len(fds)):
            s.fds[i] = fds[i]
        s.nfds = len(fds)
        for b in self.dirty:
            b.needs_sync = False
            b.dirty_listed = False
        self.dirty = []
        self.dir_dirty = False
        s.seq = self.last
        s.gen = self.gen
        s.epoch = self.epoch
        self.outstanding.append(weakref.ref(s))
        return s

    def discard_unsynced(self):
        """Forget everything no successful Sync has covered, on disk and in the index,
        after a write or an fsync failed (ENOSPC, EIO): the caller answers those
        messages with an error, so none of them may be found after a restart either.
        Each block file is cut back to the bytes known durable (ftruncate needs no free
        space) and the cut is fsynced; messages above ``synced_seq`` leave the index,
        and ``last_seq`` goes back to ``synced_seq``.  Removals made since the last Sync
        stay removed in memory (their tombstones are cut with the rest: as after a
        crash, a restart may show such a message again).  Returns how many messages
        were forgotten."""
        cdef Block b
        cdef uint64_t keep = self.synced
        cdef uint64_t n = 0
        self.check_open()
        self.win_block = None
        # No Sync begun before this proves anything any more (and a failed one must
        # not make reap() write the cut bytes again).
        self.epoch += 1
        self.outstanding = []
        for b in list(self.blocks) + [e[1] for e in self.pending_removals]:
            b.dirty_listed = False
            b.needs_sync = False
            if b.compressed or b.size <= b.synced:
                continue
            if b.fd >= 0 or os.path.exists(b.path):
                self.ensure_fd(b)
                os.ftruncate(b.fd, b.synced)
                os.fsync(b.fd)
            b.size = b.flushed = b.synced
            b.blen = 0
            b.bstart = 0
        self.dirty = []
        # Erasures rewrite bytes that were already durable: they are written again.
        for gen, b, off, rec in self.erasures:
            if not b.removed and off + len(rec) <= b.size:
                self.write_at(b, rec, off)
        if keep < self.last:
            if HAS(self, keep) and SL(self, keep).flags & SLOT_LIVE:
                self.last_ts = SL(self, keep).ts
            n = self.drop_above(keep)
        b = self.active
        if b is not None and b.size == 0 and not b.removed:
            # A block opened since the last Sync lost its opening FLOOR record.
            self.put_floor(self.first if self.msgs else self.last + 1)
        return n

    def mark_synced(self, Sync sync):
        """Record that sync.run() succeeded: synced_seq advances to sync.seq and the
        bytes it covered leave memory.  False if it failed, or if an earlier Sync
        failed since it began (its success then proves nothing)."""
        if sync.state == SYNC_READY:
            raise ValueError("Sync.run() has not completed")
        self.reap()
        if sync.state == SYNC_OK and not sync.applied:
            self.apply_sync(sync)
        return sync.applied

    cdef int before_compaction(self) except -1:
        # Blocks already unlinked must be gone for good before a rewrite drops the
        # tombstones that named their records.
        if self.dirfd >= 0:
            os.fsync(self.dirfd)
        return 0

    cdef bint wants_compression(self, Block b) noexcept:
        return self.s2 and not b.compressed

    cdef object block_content(self, Block b):
        if b.compressed:
            self.read_file(b, 0, 0)
            content = b.cache
            return content
        with open(b.path, "rb") as fh:
            return fh.read(b.size)

    cdef int store_block(self, Block b, bytes content) except -1:
        cdef bytes data = content
        cdef uint8_t head[24]
        cdef bint z = self.s2 and len(content) > 0
        if z:
            payload = encode_block(content, "fast")
            memcpy(head, <const char*>ZMAGIC, 8)
            st64(head + 8, len(content))
            st64(head + 16, xxh64_c(<const uint8_t*>PyBytes_AS_STRING(payload),
                                    len(payload), 0))
            data = PyBytes_FromStringAndSize(<char*>head, 24) + payload
        replace_file(b.path, data)
        os.fsync(self.dirfd)
        if b.fd >= 0:
            close(b.fd)
            b.fd = -1
        if self.cached is b:
            self.cached = None
        b.cache = None
        b.compressed = z
        b.size = b.flushed = b.synced = len(content)
        return 0

    cdef int block_released(self, Block b) except -1:
        if self.cached is b:
            self.cached = None
        return 0

    def close(self):
        """Write and fsync everything, then close every file."""
        cdef Sync s
        cdef Block b
        if self.closed:
            return
        try:
            s = self.begin_sync()
            s.run()
            self.mark_synced(s)
        finally:
            self.closed = True
            for b in self.blocks:
                if b.fd >= 0:
                    close(b.fd)
                    b.fd = -1
            for gen, b in self.pending_removals:
                if b.fd >= 0:
                    close(b.fd)
                    b.fd = -1
            if self.dirfd >= 0:
                close(self.dirfd)
                self.dirfd = -1
