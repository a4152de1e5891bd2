# Declarations for natsjs/_core/filelog.pyx, so other Cython modules (the Raft log) can
# cimport the log classes and call their C-level methods directly.
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t


# One entry per sequence between the slot base and last_seq: where the record lives and
# what the index needs without reading it.  32 bytes, so a 1 GB log of small messages
# costs a few hundred MB of index at most and no Python object per message.
ctypedef struct Slot:
    int64_t ts
    uint32_t blk          # block file index, NOBLK once no block holds the record
    uint32_t off          # offset of the record in the block's uncompressed content
    uint32_t rlen         # record length; 0 when no record is physically stored
    uint32_t subj         # subject id (index into the subject table)
    uint32_t size         # nats-server's accounting size of the message
    uint32_t flags        # SLOT_LIVE, SLOT_TOMB (recovery only)

# Per-subject totals, kept like nats-server's psim: first/last are fixed lazily.
ctypedef struct Subj:
    uint64_t hash
    uint64_t count
    uint64_t first
    uint64_t last
    uint32_t off          # subject bytes in the arena
    uint32_t len
    uint32_t stale        # STALE_FIRST | STALE_LAST

# Open-addressing set of subject ids (which subjects a block has ever held).
ctypedef struct IdSet:
    uint32_t* tab
    uint32_t cap
    uint32_t n

# How a scan decides whether a subject id matches the caller's filter.
ctypedef struct FilterC:
    int mode              # FILTER_ALL, FILTER_NONE, FILTER_LITERAL, FILTER_WILD
    uint32_t sid
    const uint8_t* bits   # FILTER_WILD: one byte per subject id
    uint32_t nbits


cdef class Block:
    cdef readonly uint32_t index
    cdef object path
    cdef int fd
    cdef bint compressed      # the file holds the content S2-compressed (sealed only)
    cdef bint removed         # no longer part of the log (file may await unlinking)
    cdef bint has_ext         # holds tombstones for older blocks or a truncation marker
    cdef bint needs_sync      # written (or erased in place) since the last Sync took it
    cdef bint dirty_listed
    cdef uint64_t size        # logical (uncompressed) length
    cdef uint64_t flushed     # bytes handed to the OS
    cdef uint64_t synced      # bytes known durable
    cdef uint8_t* buf         # logical bytes [size - blen, size) at buf + bstart
    cdef size_t bstart
    cdef size_t blen
    cdef size_t bcap
    cdef uint64_t first       # lowest / highest message sequence whose record is here
    cdef uint64_t last
    cdef uint64_t live        # live messages
    cdef uint64_t live_bytes  # record bytes of live messages
    cdef IdSet subjects
    cdef object cache         # decompressed content of a compressed block (bytes)

    cdef int reserve(self, size_t n) except -1
    cdef void release_to(self, uint64_t off) noexcept


cdef class Sync:
    cdef int* fds
    cdef int nfds
    cdef int dir_slot         # index in fds of the directory fd (fsync), or -1
    cdef readonly uint64_t seq
    cdef uint64_t gen
    cdef uint64_t epoch
    cdef list ends            # [(Block, end offset)]
    cdef int state            # SYNC_READY, SYNC_OK, SYNC_FAILED
    cdef int err
    cdef bint applied         # counted by the log (mark_synced or the next begin_sync)
    cdef object __weakref__


cdef class _Filter:
    cdef FilterC c
    cdef bytes pattern
    cdef uint8_t* bits
    cdef uint32_t cap
    cdef uint64_t table_epoch


cdef class _Log:
    cdef bint durable          # FileLog: files, checksums, tombstones and markers
    cdef bint checksums
    cdef uint64_t block_size
    # sequence index
    cdef Slot* slots
    cdef size_t shead
    cdef size_t nslots
    cdef size_t scap
    cdef uint64_t sbase
    cdef uint64_t first
    cdef uint64_t last
    cdef uint64_t msgs
    cdef uint64_t nbytes
    cdef int64_t last_ts
    cdef uint64_t synced
    # subject table
    cdef Subj* subj
    cdef uint32_t nsubj
    cdef uint32_t subjcap
    cdef uint32_t* htab
    cdef uint32_t hcap
    cdef uint8_t* arena
    cdef size_t alen
    cdef size_t acap
    cdef uint64_t nsubj_live
    cdef uint64_t table_epoch
    cdef dict filters
    # blocks
    cdef list blocks           # live blocks in index order
    cdef list blkv             # index - blk_base -> Block or None
    cdef uint32_t blk_base
    cdef Block active
    cdef Block put_block       # block that took the last record written
    cdef uint32_t next_index
    # write-out and durability
    cdef uint64_t gen
    cdef uint64_t epoch
    cdef list dirty
    cdef list outstanding
    cdef list pending_removals
    cdef list erasures
    cdef bint dir_dirty
    cdef uint8_t* scratch
    cdef size_t scratch_cap
    # Read-ahead: scratch holds [win_off, win_off + win_len) of win_block's file, so a
    # consumer reading forward does one pread per window, not one per message.
    cdef object win_block
    cdef uint64_t win_off
    cdef size_t win_len
    cdef bint closed
    cdef readonly dict recovery

    cdef _setup(self, bint durable, uint64_t block_size, uint64_t first_seq)
    cdef int ensure_seq(self, uint64_t seq) except -1
    cdef void drop_slots_below(self, uint64_t seq) noexcept
    cdef long find_subject(self, const uint8_t* s, size_t n) noexcept
    cdef uint32_t subject_id(self, const uint8_t* s, size_t n) except 0xFFFFFFFF
    cdef int reset_subjects(self) except -1
    cdef void subj_add(self, uint32_t sid, uint64_t seq) noexcept
    cdef void subj_del(self, uint32_t sid, uint64_t seq) noexcept
    cdef int subj_fix(self, uint32_t sid) except -1
    cdef bytes subject_bytes(self, uint32_t sid)
    cdef _Filter get_filter(self, object pattern)
    cdef bint block_may(self, Block b, FilterC* f) noexcept
    cdef uint64_t scan_fwd(self, uint64_t seq, uint64_t end, FilterC* f) except? 0
    cdef uint64_t scan_bwd(self, uint64_t seq, uint64_t low, FilterC* f) except? 0
    cdef uint64_t next_match(self, uint64_t start, FilterC* f) except? 0
    cdef uint64_t prev_match(self, uint64_t start, FilterC* f) except? 0
    cdef Block block_at(self, uint32_t index)
    cdef Block new_block(self)
    cdef block_opened(self, Block b)
    cdef uint64_t put_floor(self, uint64_t floor) except? 0
    cdef uint64_t put(self, int kind, uint64_t seq, int64_t ts, const uint8_t* subj,
                      size_t slen, const uint8_t* hdr, size_t hlen, const uint8_t* msg,
                      size_t mlen) except? 0
    cdef int drop_block(self, Block b) except -1
    cdef int release_block(self, Block b) except -1
    cdef int block_released(self, Block b) except -1
    cdef int maybe_drop(self, Block b) except -1
    cdef uint32_t msg_size(self, size_t slen, size_t hlen, size_t mlen) noexcept
    cdef uint64_t append_c(self, const uint8_t* subj, size_t slen, const uint8_t* hdr,
                           size_t hlen, const uint8_t* msg, size_t mlen, int64_t ts,
                           uint64_t seq) except 0
    cdef int skip_to(self, uint64_t upto) except -1
    cdef int advance_first(self) except -1
    cdef bint remove_c(self, uint64_t seq, bint secure, bint marker) except -1
    cdef int erase(self, Block b, uint64_t off, uint32_t rlen, uint64_t seq) except -1
    cdef int write_at(self, Block b, bytes data, uint64_t off) except -1
    cdef check_open(self)
    cdef const uint8_t* read(self, Block b, uint64_t off, uint32_t rlen) except NULL
    cdef const uint8_t* read_file(self, Block b, uint64_t off, uint32_t rlen) except NULL
    cdef object record_tuple(self, uint64_t seq, bint with_seq)
    cdef const uint8_t* record_ptr(self, uint64_t seq, uint32_t* rlen) except *
    cdef lose(self, uint64_t seq, Block b, uint64_t off, str reason)
    cdef uint64_t count_range(self, uint64_t seq, uint64_t end, FilterC* f) except? 0
    cdef uint64_t remove_below(self, uint64_t seq) except? 0
    cdef uint64_t drop_above(self, uint64_t seq) except? 0
    cdef int after_emptied(self) except -1
    cdef object block_content(self, Block b)
    cdef int store_block(self, Block b, bytes content) except -1
    cdef int rewrite_block(self, Block b) except -1
    cdef int before_compaction(self) except -1
    cdef bint wants_compression(self, Block b) noexcept
    cdef int reap(self) except -1

cdef class FileLog(_Log):
    cdef object dirpath
    cdef object blkdir
    cdef int dirfd
    cdef bint s2
    cdef Block cached          # the one compressed block whose content is decoded
    cdef list fd_blocks        # blocks holding an open descriptor, oldest first
    # recovery scan state
    cdef uint64_t rc_floor
    cdef uint64_t rc_max
    cdef uint64_t rc_lost_lo
    cdef uint64_t rc_records
    cdef uint64_t rc_tombs

    cdef recover(self, uint64_t first_seq)
    cdef damaged_from(self, uint64_t seq)
    cdef size_t scan_file(self, Block b, bint last_block) except? 0
    cdef object decode_compressed(self, Block b, bytes data)
    cdef size_t scan(self, Block b, const uint8_t* d, size_t n, bint last_block) except? 0
    cdef int recover_record(self, Block b, const uint8_t* r, uint32_t off) except -1
    cdef int ensure_fd(self, Block b) except -1
    cdef int flush_block(self, Block b) except -1
    cdef int apply_sync(self, Sync s) except -1


cdef class MemLog(_Log):
    pass
