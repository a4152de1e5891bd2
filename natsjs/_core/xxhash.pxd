# XXH64, the algorithm as its author specifies it: the record checksum of the file log
# (seed 0 on disk) and the check of the Raft log's entries.  Only this .pxd: each module
# that cimports it gets its own inline copy, no runtime import.
from libc.stdint cimport uint8_t, uint64_t

from natsjs._core.byteorder cimport ld32, ld64

cdef extern from *:
    """
    #define NATSJS_XXH_P1 0x9E3779B185EBCA87ULL
    #define NATSJS_XXH_P2 0xC2B2AE3D27D4EB4FULL
    #define NATSJS_XXH_P3 0x165667B19E3779F9ULL
    #define NATSJS_XXH_P4 0x85EBCA77C2B2AE63ULL
    #define NATSJS_XXH_P5 0x27D4EB2F165667C5ULL
    """
    const uint64_t P1 "NATSJS_XXH_P1"
    const uint64_t P2 "NATSJS_XXH_P2"
    const uint64_t P3 "NATSJS_XXH_P3"
    const uint64_t P4 "NATSJS_XXH_P4"
    const uint64_t P5 "NATSJS_XXH_P5"


cdef inline uint64_t rotl(uint64_t x, int r) noexcept nogil:
    return (x << r) | (x >> (64 - r))


cdef inline uint64_t xround(uint64_t acc, uint64_t lane) noexcept nogil:
    acc = acc + lane * P2
    return rotl(acc, 31) * P1


cdef inline uint64_t xmerge(uint64_t acc, uint64_t v) noexcept nogil:
    acc = acc ^ xround(0, v)
    return acc * P1 + P4


cdef inline uint64_t xxh64_c(const uint8_t* p, size_t n, uint64_t seed) noexcept nogil:
    cdef const uint8_t* end = p + n
    cdef uint64_t v1, v2, v3, v4, h
    if n >= 32:
        v1 = seed + P1 + P2
        v2 = seed + P2
        v3 = seed
        v4 = seed - P1
        while p + 32 <= end:
            v1 = xround(v1, ld64(p))
            v2 = xround(v2, ld64(p + 8))
            v3 = xround(v3, ld64(p + 16))
            v4 = xround(v4, ld64(p + 24))
            p += 32
        h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18)
        h = xmerge(h, v1)
        h = xmerge(h, v2)
        h = xmerge(h, v3)
        h = xmerge(h, v4)
    else:
        h = seed + P5
    h += <uint64_t>n
    while p + 8 <= end:
        h ^= xround(0, ld64(p))
        h = rotl(h, 27) * P1 + P4
        p += 8
    if p + 4 <= end:
        h ^= <uint64_t>ld32(p) * P1
        h = rotl(h, 23) * P2 + P3
        p += 4
    while p < end:
        h ^= <uint64_t>p[0] * P5
        h = rotl(h, 11) * P1
        p += 1
    h ^= h >> 33
    h *= P2
    h ^= h >> 29
    h *= P3
    h ^= h >> 32
    return h
