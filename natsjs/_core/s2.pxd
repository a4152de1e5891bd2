# Declarations for natsjs/_core/s2.pyx so other Cython modules (the route read/write
# loops) can cimport the codec classes and call their C-level methods directly.
from libc.stdint cimport uint8_t, uint32_t


cdef class S2Writer:
    cdef int _level              # one of the LEVEL_* constants in s2.pyx
    cdef bint _snappy            # emit pure Snappy (no S2 extensions, sNaPpY id, 64 KiB blocks)
    cdef bint _busy              # compress() releases the GIL; refuse re-entry on the scratch
    cdef bint _started           # the stream identifier is out: later flushes are chunks only
    cdef Py_ssize_t _block_size  # uncompressed bytes per chunk
    cdef uint32_t* _work         # hash tables / chains, reused across flushes
    cdef size_t _work_cap        # in uint32 entries
    cdef uint8_t* _obuf          # output of one flush, reused across flushes
    cdef size_t _obuf_cap

    cdef int _ensure(self, size_t work_entries, size_t obuf_bytes) except -1
    cpdef bytes compress(self, data)


cdef class S2Reader:
    cdef Py_ssize_t _max_block   # largest uncompressed chunk accepted
    cdef size_t _max_chunk       # largest compressed chunk body accepted
    cdef bint _seen_ident        # a stream must open with a stream identifier
    cdef bint _snappy_frame      # sNaPpY streams keep Snappy's 64 KiB block limit
    cdef bint _failed            # after an error the stream position is unknown
    cdef size_t _skip            # bytes of a skippable/padding chunk still to drop
    cdef uint8_t* _pend          # partial chunk carried between feed() calls
    cdef size_t _pend_len
    cdef size_t _pend_cap
    cdef uint8_t* _out           # output being assembled by the current feed()
    cdef size_t _out_len
    cdef size_t _out_cap

    cdef int _grow_out(self, size_t extra) except -1
    cdef int _grow_pend(self, size_t need) except -1
    cdef int _chunk_header(self, const uint8_t* hdr, size_t* body_len) except -1
    cdef int _chunk_body(self, uint8_t ctype, const uint8_t* body, size_t blen) except -1
    cpdef bytes feed(self, data)
