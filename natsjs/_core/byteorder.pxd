# Little-endian loads and stores for the on-disk and wire formats (file log records,
# Raft log entries, S2 frames).  Written as byte assembly so the code is endian-neutral;
# compilers fold the pattern into one unaligned load or store on little-endian targets.
# Only this .pxd: every module that cimports it gets its own inline copy, no runtime
# import.
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t


cdef inline uint16_t ld16(const uint8_t* p) noexcept nogil:
    return <uint16_t>(p[0] | (<uint16_t>p[1] << 8))


cdef inline uint32_t ld32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
            | (<uint32_t>p[3] << 24))


cdef inline uint64_t ld64(const uint8_t* p) noexcept nogil:
    return <uint64_t>ld32(p) | (<uint64_t>ld32(p + 4) << 32)


cdef inline void st16(uint8_t* p, uint16_t v) noexcept nogil:
    p[0] = <uint8_t>v
    p[1] = <uint8_t>(v >> 8)


cdef inline void st32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = <uint8_t>v
    p[1] = <uint8_t>(v >> 8)
    p[2] = <uint8_t>(v >> 16)
    p[3] = <uint8_t>(v >> 24)


cdef inline void st64(uint8_t* p, uint64_t v) noexcept nogil:
    st32(p, <uint32_t>v)
    st32(p + 4, <uint32_t>(v >> 32))
