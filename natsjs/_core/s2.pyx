# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""S2 compression for NATS routes: block codec, stream framing and CRC-32C.

Where it sits on the route path::

    route write loop -> S2Writer.compress(flush) -> socket
    socket -> S2Reader.feed(bytes) -> route protocol parser

Both directions switch to S2 only after the INFO exchange has negotiated a
compression mode; this module knows nothing about that handshake and does no I/O.

Wire facts, restated from the reference sources (no code was taken from them):

* nats-server ``server/client.go`` (flushOutbound) resets its ``s2.Writer`` onto a fresh
  buffer for every flush and closes it afterwards, so every flush on the wire is a
  complete S2 stream that starts with its own stream identifier chunk; the reading side
  (``readLoop``) keeps one ``s2.Reader`` for the life of the connection and therefore
  sees a stream identifier again at the start of each flush.  natsjs's writer keeps one
  stream per connection instead (the identifier once, then chunks), which that reader
  takes as well.  S2 blocks never refer to earlier blocks, so what decides the ratio is
  how long the blocks are: the route writer (natsjs/connection.py) lets a flush gather
  what the producers of the moment still add before it compresses.  ``server/server.go``
  (s2WriterOptions) maps s2_uncompressed / s2_fast / s2_better / s2_best onto the writer's
  levels; ``server/route.go`` (negotiateRouteCompression) switches the writer before the
  acceptor's reply INFO and the reader right after the INFO that was parsed.
* klauspost/compress ``s2/s2.go`` and ``s2/README.md`` ("Format Extensions"): chunk =
  1-byte type, 3-byte little-endian length that counts the 4-byte CRC, CRC-32C
  (Castagnoli) of the *uncompressed* bytes masked as ``((c >> 15) | (c << 17)) +
  0xa282ead8``, then the body.  Identifier ``ff 06 00 00 "S2sTwO"`` (a reader also takes
  Snappy's ``sNaPpY``); 0x00 = compressed block, 0x01 = raw, 0xfe padding, 0x80-0xfd
  skippable, 0x02-0x7f reserved.  Blocks hold at most 4 MiB (writer default 1 MiB).
* The S2 block is the Snappy block (uvarint decoded length, then literal/copy tags) plus
  one extension: a copy with a 1-byte offset whose offset is 0 repeats the previous
  offset, its 3-bit length field meaning 4..8, or 8 + next byte, or 260 + next 2 bytes,
  or 65540 + next 3 bytes (``s2/decode_other.go``).  The repeat offset starts unset in
  every block, so a block cannot open with a repeat.
* ``s2/writer.go`` stores a block raw (type 0x01) when it is shorter than 32 bytes or the
  encoder could not beat ``len - len/32`` by a few bytes; ``s2/reader.go`` refuses a
  stream that does not start with an identifier and caps Snappy-framed blocks at 64 KiB.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memset, memcmp

from natsjs._core.byteorder cimport ld32, ld64, st32

cdef extern from *:
    """
    static inline int natsjs_s2_ctz64(unsigned long long x) { return __builtin_ctzll(x); }
    """
    int ctz64 "natsjs_s2_ctz64"(unsigned long long x) noexcept nogil


class S2Error(ValueError):
    """Corrupt, truncated or unsupported S2/Snappy input."""


cdef enum:
    _MAX_BLOCK = 4 << 20        # largest S2 block in a stream
    _DEFAULT_BLOCK = 1 << 20    # reference writer's default block size
    _SNAPPY_BLOCK = 1 << 16     # Snappy framing's block limit
    _MIN_BLOCK = 4 << 10        # smallest block size a writer accepts
    _MIN_COMPRESS = 32          # shorter blocks are stored raw (as the reference does)
    _INPUT_MARGIN = 8           # searches stop this far from the end so 8-byte loads stay in bounds
    _BEST_DEPTH = 32            # hash-chain candidates examined per position by "best"
    _BEST_NICE = 512            # a match this long ends the chain walk early
    _RETAIN_LIMIT = 16 << 20    # scratch larger than this is released after the call

cdef uint32_t _EMPTY = 0xFFFFFFFF   # empty hash-chain slot in the "best" encoder

MAX_BLOCK_SIZE = _MAX_BLOCK
DEFAULT_BLOCK_SIZE = _DEFAULT_BLOCK
STREAM_IDENTIFIER = b"\xff\x06\x00\x00S2sTwO"
SNAPPY_STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"

cdef enum:
    LEVEL_UNCOMPRESSED = 0
    LEVEL_FAST = 1
    LEVEL_BETTER = 2
    LEVEL_BEST = 3

cdef dict _LEVELS = {
    "uncompressed": LEVEL_UNCOMPRESSED,
    "fast": LEVEL_FAST,
    "better": LEVEL_BETTER,
    "best": LEVEL_BEST,
}
LEVELS = ("uncompressed", "fast", "better", "best")


cdef int _parse_level(object level) except -1:
    # Route code can hand over the negotiated mode ("s2_fast", ...) unchanged.
    cdef str name = str(level).lower()
    if name.startswith("s2_"):
        name = name[3:]
    try:
        return _LEVELS[name]
    except KeyError:
        raise ValueError(f"unknown S2 level {level!r}; use one of {LEVELS}") from None


# ----------------------------------------------------------------------------------------
# CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), slicing-by-8: eight tables let
# the loop fold 8 input bytes per step instead of one.

cdef uint32_t _CRC[8][256]


cdef void _crc_init() noexcept:
    cdef uint32_t c
    cdef int i, k, j
    for i in range(256):
        c = <uint32_t>i
        for j in range(8):
            if c & 1:
                c = (c >> 1) ^ 0x82F63B78
            else:
                c >>= 1
        _CRC[0][i] = c
    for i in range(256):
        c = _CRC[0][i]
        for k in range(1, 8):
            c = (c >> 8) ^ _CRC[0][c & 0xFF]
            _CRC[k][i] = c


_crc_init()


cdef inline uint32_t _crc32c(uint32_t crc, const uint8_t* p, size_t n) noexcept nogil:
    cdef uint32_t lo, hi
    crc = ~crc
    while n >= 8:
        lo = ld32(p) ^ crc
        hi = ld32(p + 4)
        crc = (_CRC[7][lo & 0xFF] ^ _CRC[6][(lo >> 8) & 0xFF] ^
               _CRC[5][(lo >> 16) & 0xFF] ^ _CRC[4][lo >> 24] ^
               _CRC[3][hi & 0xFF] ^ _CRC[2][(hi >> 8) & 0xFF] ^
               _CRC[1][(hi >> 16) & 0xFF] ^ _CRC[0][hi >> 24])
        p += 8
        n -= 8
    while n:
        crc = _CRC[0][(crc ^ p[0]) & 0xFF] ^ (crc >> 8)
        p += 1
        n -= 1
    return ~crc


cdef inline uint32_t _mask(uint32_t c) noexcept nogil:
    # Framing masks the CRC so that CRCs of data that itself holds CRCs stay robust.
    return (((c >> 15) | (c << 17)) + <uint32_t>0xA282EAD8U)


# ----------------------------------------------------------------------------------------
# uvarint (the block's decoded-length prefix)

cdef inline size_t _put_uvarint(uint8_t* dst, uint64_t v) noexcept nogil:
    cdef size_t i = 0
    while v >= 0x80:
        dst[i] = <uint8_t>(v | 0x80)
        v >>= 7
        i += 1
    dst[i] = <uint8_t>v
    return i + 1


cdef inline size_t _get_uvarint(const uint8_t* src, size_t n, uint64_t* out) noexcept nogil:
    # Returns bytes used, 0 for truncated/oversized: a block length never needs more than
    # 32 bits, so more than 5 bytes is corruption rather than a big block.
    cdef uint64_t v = 0
    cdef size_t i
    cdef int shift = 0
    cdef uint8_t b
    for i in range(5 if n > 5 else n):
        b = src[i]
        v |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            if v > 0xFFFFFFFFULL:
                return 0
            out[0] = v
            return i + 1
        shift += 7
    return 0


cdef inline size_t _max_encoded(size_t n) noexcept nogil:
    # Worst case: a single literal run.  The extra 64 bytes absorb the few bytes a match
    # emitter may write past the bail-out limit before the encoder notices.
    return n + 5 + 5 + 64


# ----------------------------------------------------------------------------------------
# Block decoder.  Every read of a tag's extra bytes and every copy is bounds-checked
# against both buffers, because the input may be hostile.

cdef int _decode_body(const uint8_t* src, size_t slen, uint8_t* dst, size_t dlen) noexcept nogil:
    """Decode block tags (after the uvarint) into dst[0:dlen]; 0 on success, else 1."""
    cdef size_t s = 0, d = 0, length, offset = 0, toff, i
    cdef uint32_t x
    cdef uint8_t tag
    cdef uint8_t* op
    while s < slen:
        tag = src[s]
        if (tag & 3) == 0:
            x = tag >> 2
            if x < 60:
                s += 1
            elif x == 60:
                if slen - s < 2:
                    return 1
                x = src[s + 1]
                s += 2
            elif x == 61:
                if slen - s < 3:
                    return 1
                x = (<uint32_t>src[s + 1]) | (<uint32_t>src[s + 2] << 8)
                s += 3
            elif x == 62:
                if slen - s < 4:
                    return 1
                x = (<uint32_t>src[s + 1]) | (<uint32_t>src[s + 2] << 8) | (<uint32_t>src[s + 3] << 16)
                s += 4
            else:
                if slen - s < 5:
                    return 1
                x = ld32(src + s + 1)
                s += 5
            length = <size_t>x + 1
            if length > dlen - d or length > slen - s:
                return 1
            memcpy(dst + d, src + s, length)
            d += length
            s += length
            continue
        elif (tag & 3) == 1:
            if slen - s < 2:
                return 1
            length = (tag >> 2) & 7
            toff = ((<size_t>tag & 0xE0) << 3) | src[s + 1]
            s += 2
            if toff == 0:
                # S2 repeat: keep the previous offset, length field selects an encoding.
                if length == 5:
                    if slen - s < 1:
                        return 1
                    length = <size_t>src[s] + 4
                    s += 1
                elif length == 6:
                    if slen - s < 2:
                        return 1
                    length = ((<size_t>src[s]) | (<size_t>src[s + 1] << 8)) + 256
                    s += 2
                elif length == 7:
                    if slen - s < 3:
                        return 1
                    length = ((<size_t>src[s]) | (<size_t>src[s + 1] << 8) |
                              (<size_t>src[s + 2] << 16)) + 65536
                    s += 3
            else:
                offset = toff
            length += 4
        elif (tag & 3) == 2:
            if slen - s < 3:
                return 1
            length = (tag >> 2) + 1
            offset = (<size_t>src[s + 1]) | (<size_t>src[s + 2] << 8)
            s += 3
        else:
            if slen - s < 5:
                return 1
            length = (tag >> 2) + 1
            offset = ld32(src + s + 1)
            s += 5
        if offset == 0 or offset > d or length > dlen - d:
            return 1
        op = dst + d
        if offset >= length:
            memcpy(op, op - offset, length)
        elif offset >= 8:
            # Overlapping copy: 8-byte steps are safe because each step only reads bytes
            # that are at least 8 behind what it writes.
            i = 0
            while i + 8 <= length:
                memcpy(op + i, op + i - offset, 8)
                i += 8
            while i < length:
                op[i] = op[i - offset]
                i += 1
        else:
            for i in range(length):
                op[i] = op[i - offset]
        d += length
    return 0 if d == dlen else 1


# ----------------------------------------------------------------------------------------
# Emitters.  dst always has room (see _max_encoded); they return bytes written.

cdef inline size_t _emit_literal(uint8_t* dst, const uint8_t* lit, size_t n) noexcept nogil:
    cdef size_t m, i
    if n == 0:
        return 0
    m = n - 1
    if m < 60:
        dst[0] = <uint8_t>(m << 2)
        i = 1
    elif m < 0x100:
        dst[0] = 60 << 2
        dst[1] = <uint8_t>m
        i = 2
    elif m < 0x10000:
        dst[0] = 61 << 2
        dst[1] = <uint8_t>m
        dst[2] = <uint8_t>(m >> 8)
        i = 3
    elif m < 0x1000000:
        dst[0] = 62 << 2
        dst[1] = <uint8_t>m
        dst[2] = <uint8_t>(m >> 8)
        dst[3] = <uint8_t>(m >> 16)
        i = 4
    else:
        dst[0] = 63 << 2
        st32(dst + 1, <uint32_t>m)
        i = 5
    memcpy(dst + i, lit, n)
    return i + n


cdef inline size_t _emit_repeat(uint8_t* dst, size_t offset, size_t length) noexcept nogil:
    """S2 repeat of the previous offset; length >= 4."""
    cdef size_t i = 0, v, chunk
    # A single code 7 covers up to 65540 + 0xFFFFFF; split longer runs, keeping >= 4 left.
    while length > 65540 + 0xFFFFFF:
        chunk = 65540 + 0xFFFFFF - 4
        v = chunk - 65540
        dst[i] = (7 << 2) | 1
        dst[i + 1] = 0
        dst[i + 2] = <uint8_t>v
        dst[i + 3] = <uint8_t>(v >> 8)
        dst[i + 4] = <uint8_t>(v >> 16)
        i += 5
        length -= chunk
    if length <= 8:
        dst[i] = <uint8_t>(((length - 4) << 2) | 1)
        dst[i + 1] = 0
        return i + 2
    if length < 12 and offset < 2048:
        # A plain copy1 restating the offset is as short and keeps the same offset.
        dst[i] = <uint8_t>(((offset >> 8) << 5) | ((length - 4) << 2) | 1)
        dst[i + 1] = <uint8_t>offset
        return i + 2
    if length < 264:
        dst[i] = (5 << 2) | 1
        dst[i + 1] = 0
        dst[i + 2] = <uint8_t>(length - 8)
        return i + 3
    if length < 65540:
        v = length - 260
        dst[i] = (6 << 2) | 1
        dst[i + 1] = 0
        dst[i + 2] = <uint8_t>v
        dst[i + 3] = <uint8_t>(v >> 8)
        return i + 4
    v = length - 65540
    dst[i] = (7 << 2) | 1
    dst[i + 1] = 0
    dst[i + 2] = <uint8_t>v
    dst[i + 3] = <uint8_t>(v >> 8)
    dst[i + 4] = <uint8_t>(v >> 16)
    return i + 5


cdef inline size_t _emit_copy_short(uint8_t* dst, size_t offset, size_t length) noexcept nogil:
    """One plain Snappy copy tag; 1 <= length <= 64 (copy1 needs 4..11, offset < 2048)."""
    if offset < 2048 and 4 <= length < 12:
        dst[0] = <uint8_t>(((offset >> 8) << 5) | ((length - 4) << 2) | 1)
        dst[1] = <uint8_t>offset
        return 2
    if offset < 65536:
        dst[0] = <uint8_t>(((length - 1) << 2) | 2)
        dst[1] = <uint8_t>offset
        dst[2] = <uint8_t>(offset >> 8)
        return 3
    dst[0] = <uint8_t>(((length - 1) << 2) | 3)
    st32(dst + 1, <uint32_t>offset)
    return 5


cdef inline size_t _emit_copy(uint8_t* dst, size_t offset, size_t length) noexcept nogil:
    """S2 copy: one Snappy copy tag, then repeats for whatever a single tag cannot hold."""
    cdef size_t first
    if length <= 64:
        return _emit_copy_short(dst, offset, length)
    # The first tag must leave >= 4 bytes for the repeat: copy1 holds 11, the wider tags
    # hold 60 (not 64) because length > 64 then always leaves at least 5.
    first = 11 if offset < 2048 else 60
    first = _emit_copy_short(dst, offset, first)
    return first + _emit_repeat(dst + first, offset, length - (11 if offset < 2048 else 60))


cdef inline size_t _emit_copy_snappy(uint8_t* dst, size_t offset, size_t length) noexcept nogil:
    """Plain Snappy: only copy tags of <= 64 bytes, so no S2 repeat codes."""
    cdef size_t i = 0
    while length >= 68:
        i += _emit_copy_short(dst + i, offset, 64)
        length -= 64
    if length > 64:
        i += _emit_copy_short(dst + i, offset, 60)
        length -= 60
    return i + _emit_copy_short(dst + i, offset, length)


cdef inline size_t _emit_match(uint8_t* dst, size_t offset, size_t length,
                               size_t last_off, bint snappy) noexcept nogil:
    if snappy:
        return _emit_copy_snappy(dst, offset, length)
    if offset == last_off:
        return _emit_repeat(dst, offset, length)
    return _emit_copy(dst, offset, length)


cdef inline size_t _match_len(const uint8_t* a, const uint8_t* b, size_t limit) noexcept nogil:
    cdef size_t i = 0
    cdef uint64_t x
    while i + 8 <= limit:
        x = ld64(a + i) ^ ld64(b + i)
        if x != 0:
            return i + (<size_t>ctz64(x) >> 3)
        i += 8
    while i < limit and a[i] == b[i]:
        i += 1
    return i


# Multiplicative hashes of the low 4, 6, 7 or 8 bytes of a word.
cdef inline uint32_t _h4(uint64_t u, int bits) noexcept nogil:
    return <uint32_t>(((<uint32_t>u) * <uint32_t>2654435761U) >> (32 - bits))


cdef inline uint32_t _h6(uint64_t u, int bits) noexcept nogil:
    return <uint32_t>(((u << 16) * <uint64_t>227718039650203ULL) >> (64 - bits))


cdef inline uint32_t _h7(uint64_t u, int bits) noexcept nogil:
    return <uint32_t>(((u << 8) * <uint64_t>58295818150454627ULL) >> (64 - bits))


cdef inline uint32_t _h8(uint64_t u, int bits) noexcept nogil:
    return <uint32_t>((u * <uint64_t>0xCF1BBCDCB7A56463ULL) >> (64 - bits))


cdef inline int _bits_for(size_t n, int lo, int hi) noexcept nogil:
    # Tables scale with the input so a 100-byte flush does not clear 256 KiB of table.
    cdef int b = lo
    while b < hi and (<size_t>1 << b) < n:
        b += 1
    return b


cdef inline size_t _bail_limit(size_t n) noexcept nogil:
    # Not worth a compressed chunk unless it saves about 3% (mirrors the reference writer).
    return n - (n >> 5) - 6


# ----------------------------------------------------------------------------------------
# Level "fast": one 6-byte-hash table (up to 2^16 entries: 4x the reference's, for about
# 0.5% on route traffic at the same speed class), greedy matching, the previous offset
# tried first, and a search step that grows across incompressible stretches.

cdef size_t _enc_fast(uint8_t* dst, const uint8_t* src, size_t n, uint32_t* table,
                      bint snappy) noexcept nogil:
    cdef int tb = _bits_for(n, 9, 16)
    cdef size_t s_limit = n - _INPUT_MARGIN
    cdef size_t dst_limit = _bail_limit(n)
    cdef size_t d = 0, next_emit = 0, s = 1, cand, cand1, cand2, next_s, base, e, off, i
    cdef size_t last_off = 0
    cdef uint64_t cv, x
    cdef uint32_t h0, h1, h2
    cdef bint found, stop = False
    memset(table, 0, (<size_t>1 << tb) * sizeof(uint32_t))
    cv = ld64(src + s)
    while True:
        found = False
        while True:
            next_s = s + ((s - next_emit) >> 6) + 4
            if next_s > s_limit:
                break
            h0 = _h6(cv, tb)
            h1 = _h6(cv >> 8, tb)
            cand = table[h0]
            cand1 = table[h1]
            table[h0] = <uint32_t>s
            table[h1] = <uint32_t>(s + 1)
            if last_off != 0 and <uint32_t>(cv >> 8) == ld32(src + s + 1 - last_off):
                base = s + 1
                cand = base - last_off
                while base > next_emit and cand > 0 and src[base - 1] == src[cand - 1]:
                    base -= 1
                    cand -= 1
                if d + (base - next_emit) + 5 > dst_limit:
                    return 0
                d += _emit_literal(dst + d, src + next_emit, base - next_emit)
                e = s + 5 + _match_len(src + s + 5, src + s + 5 - last_off, n - s - 5)
                d += _emit_match(dst + d, last_off, e - base, last_off, snappy)
                s = e
                next_emit = e
                if s >= s_limit:
                    break
                if d > dst_limit:
                    return 0
                cv = ld64(src + s)
                continue
            if <uint32_t>cv == ld32(src + cand):
                found = True
                break
            h2 = _h6(cv >> 16, tb)
            cand2 = table[h2]
            table[h2] = <uint32_t>(s + 2)
            if <uint32_t>(cv >> 8) == ld32(src + cand1):
                s += 1
                cand = cand1
                found = True
                break
            if <uint32_t>(cv >> 16) == ld32(src + cand2):
                s += 2
                cand = cand2
                found = True
                break
            s = next_s
            cv = ld64(src + s)
        if not found:
            break
        while cand > 0 and s > next_emit and src[cand - 1] == src[s - 1]:
            cand -= 1
            s -= 1
        if d + (s - next_emit) + 5 > dst_limit:
            return 0
        d += _emit_literal(dst + d, src + next_emit, s - next_emit)
        # Emit this match, then keep emitting while the bytes right after it match too.
        while True:
            off = s - cand
            base = s
            e = s + 4 + _match_len(src + s + 4, src + cand + 4, n - s - 4)
            d += _emit_match(dst + d, off, e - s, last_off, snappy)
            last_off = off
            s = e
            next_emit = e
            if s >= s_limit:
                stop = True
                break
            if d > dst_limit:
                return 0
            # Every fourth position inside the match goes into the table too (the
            # reference indexes only around its end): repeated records then find a
            # recent copy of any part of them.
            i = base + 1
            while i < e - 2:
                table[_h6(ld64(src + i), tb)] = <uint32_t>i
                i += 4
            x = ld64(src + s - 2)
            table[_h6(x, tb)] = <uint32_t>(s - 2)
            h0 = _h6(x >> 16, tb)
            cand = table[h0]
            table[h0] = <uint32_t>s
            if <uint32_t>(x >> 16) != ld32(src + cand):
                s += 1
                cv = ld64(src + s)
                break
        if stop:
            break
    if next_emit < n:
        if d + (n - next_emit) + 5 > dst_limit:
            return 0
        d += _emit_literal(dst + d, src + next_emit, n - next_emit)
    return d


# ----------------------------------------------------------------------------------------
# Level "better": a long (7-byte) and a short (4-byte) hash table; at each position the
# longest of both table candidates and the long candidate one byte later wins (a repeat
# of the previous offset is not tried first: on route traffic it took short repeats
# where a table candidate ran longer), and every other position inside an emitted match
# goes into the tables.

cdef inline void _index_better(uint32_t* ltab, uint32_t* stab, int lb, int sb,
                               const uint8_t* src, size_t base, size_t e) noexcept nogil:
    # Caller guarantees e + 8 <= n, so every load here stays in bounds.
    cdef size_t i, j, last
    ltab[_h7(ld64(src + base + 1), lb)] = <uint32_t>(base + 1)
    stab[_h4(ld64(src + base + 2), sb)] = <uint32_t>(base + 2)
    ltab[_h7(ld64(src + e - 2), lb)] = <uint32_t>(e - 2)
    stab[_h4(ld64(src + e - 1), sb)] = <uint32_t>(e - 1)
    # Every other position inside the match goes into the long table (and the one
    # after it into the short table), walked from both halves at once: records that
    # repeat (JSON keys, log prefixes) then find their earlier copies wherever a
    # previous match happened to cover them.
    i = base + 2
    last = e - 3
    j = (i + last + 1) >> 1
    while j < last:
        ltab[_h7(ld64(src + i), lb)] = <uint32_t>i
        ltab[_h7(ld64(src + j), lb)] = <uint32_t>j
        stab[_h4(ld64(src + i + 1), sb)] = <uint32_t>(i + 1)
        stab[_h4(ld64(src + j + 1), sb)] = <uint32_t>(j + 1)
        i += 2
        j += 2


cdef size_t _enc_better(uint8_t* dst, const uint8_t* src, size_t n, uint32_t* work,
                        bint snappy) noexcept nogil:
    cdef int lb = _bits_for(n, 10, 18)
    cdef int sb = _bits_for(n, 9, 16)
    cdef uint32_t* ltab = work
    cdef uint32_t* stab = work + (<size_t>1 << lb)
    cdef size_t s_limit = n - _INPUT_MARGIN
    cdef size_t dst_limit = _bail_limit(n)
    cdef size_t d = 0, next_emit = 0, s = 1, cand = 0, cl, cs, c1, next_s, base, e, off, l, blen
    cdef size_t last_off = 0
    cdef uint64_t cv
    cdef uint32_t hl, hs, h1
    cdef bint found
    memset(work, 0, ((<size_t>1 << lb) + (<size_t>1 << sb)) * sizeof(uint32_t))
    cv = ld64(src + s)
    while True:
        found = False
        while True:
            next_s = s + ((s - next_emit) >> 7) + 1
            if next_s > s_limit:
                break
            hl = _h7(cv, lb)
            hs = _h4(cv, sb)
            cl = ltab[hl]
            cs = stab[hs]
            ltab[hl] = <uint32_t>s
            stab[hs] = <uint32_t>s
            blen = 0
            # Table slots may hold s itself (written a step earlier as "s + 1"); only
            # strictly earlier positions make a valid offset.
            if cl < s and ld32(src + cl) == <uint32_t>cv:
                blen = 4 + _match_len(src + s + 4, src + cl + 4, n - s - 4)
                cand = cl
            if cs < s and cs != cl and ld32(src + cs) == <uint32_t>cv:
                l = 4 + _match_len(src + s + 4, src + cs + 4, n - s - 4)
                if l > blen:
                    blen = l
                    cand = cs
            h1 = _h7(cv >> 8, lb)
            c1 = ltab[h1]
            ltab[h1] = <uint32_t>(s + 1)
            if c1 < s + 1 and ld32(src + c1) == <uint32_t>(cv >> 8):
                l = 4 + _match_len(src + s + 5, src + c1 + 4, n - s - 5)
                # Starting a byte later costs a literal, so demand more than that back.
                if l > blen + 1:
                    blen = l
                    cand = c1
                    s += 1
            if blen:
                found = True
                break
            s = next_s
            cv = ld64(src + s)
        if not found:
            break
        e = s + blen
        while cand > 0 and s > next_emit and src[cand - 1] == src[s - 1]:
            cand -= 1
            s -= 1
        if d + (s - next_emit) + 5 > dst_limit:
            return 0
        d += _emit_literal(dst + d, src + next_emit, s - next_emit)
        off = s - cand
        d += _emit_match(dst + d, off, e - s, last_off, snappy)
        last_off = off
        base = s
        s = e
        next_emit = e
        if s >= s_limit:
            break
        if d > dst_limit:
            return 0
        _index_better(ltab, stab, lb, sb, src, base, e)
        cv = ld64(src + s)
    if next_emit < n:
        if d + (n - next_emit) + 5 > dst_limit:
            return 0
        d += _emit_literal(dst + d, src + next_emit, n - next_emit)
    return d


# ----------------------------------------------------------------------------------------
# Level "best": every position goes into a 4-byte hash chain (bounded window) plus an
# 8-byte hash table; each position weighs all candidates by bytes saved after the tag
# cost (repeats are cheap), and a match is deferred by one byte when that wins more.

cdef inline size_t _repeat_cost(size_t length) noexcept nogil:
    if length <= 8:
        return 2
    if length < 264:
        return 3
    if length < 65540:
        return 4
    return 5


cdef inline size_t _copy_cost(size_t offset, size_t length, bint snappy) noexcept nogil:
    cdef size_t tag = 2 if offset < 2048 else (3 if offset < 65536 else 5)
    if snappy:
        if tag == 2 and length >= 12:
            tag = 3
        return tag * ((length + 63) >> 6)
    if length <= 64:
        if tag == 2 and length >= 12:
            return 3
        return tag
    if offset < 2048:
        return 2 + _repeat_cost(length - 11)
    return tag + _repeat_cost(length - 60)


cdef struct _Best:
    size_t length
    size_t offset
    long score


cdef struct _Chain:
    uint32_t* head
    uint32_t* ltab
    uint32_t* prev
    int hb
    int lb
    size_t wmask
    size_t inserted     # every position below this is in the chain


cdef inline void _chain_insert_to(_Chain* c, const uint8_t* src, size_t upto) noexcept nogil:
    cdef size_t p = c.inserted
    cdef uint64_t v
    cdef uint32_t h
    while p < upto:
        v = ld64(src + p)
        h = _h4(v, c.hb)
        c.prev[p & c.wmask] = c.head[h]
        c.head[h] = <uint32_t>p
        c.ltab[_h8(v, c.lb)] = <uint32_t>p
        p += 1
    if upto > c.inserted:
        c.inserted = upto


cdef inline void _best_consider(_Best* b, const uint8_t* src, size_t n, size_t s, size_t cand,
                                size_t last_off, bint snappy) noexcept nogil:
    cdef size_t off = s - cand, l
    cdef long score
    if b.length >= 4 and s + b.length < n and src[cand + b.length] != src[s + b.length]:
        return  # cannot beat the current best length
    if ld32(src + cand) != ld32(src + s):
        return
    l = 4 + _match_len(src + s + 4, src + cand + 4, n - s - 4)
    if off == last_off and not snappy:
        score = <long>l - <long>_repeat_cost(l)
    else:
        score = <long>l - <long>_copy_cost(off, l, snappy)
    if score > b.score:
        b.score = score
        b.length = l
        b.offset = off


cdef inline void _best_at(_Best* b, _Chain* c, const uint8_t* src, size_t n, size_t s,
                          size_t last_off, bint snappy) noexcept nogil:
    cdef uint64_t v = ld64(src + s)
    cdef size_t cand, nxt, depth = 0
    cdef size_t window = c.wmask + 1
    b.length = 0
    b.offset = 0
    b.score = 0
    if last_off != 0 and last_off <= s:
        _best_consider(b, src, n, s, s - last_off, last_off, snappy)
    cand = c.ltab[_h8(v, c.lb)]
    if cand != _EMPTY and cand < s:
        _best_consider(b, src, n, s, cand, last_off, snappy)
    cand = c.head[_h4(v, c.hb)]
    while cand != _EMPTY and cand < s and s - cand < window and depth < _BEST_DEPTH:
        _best_consider(b, src, n, s, cand, last_off, snappy)
        if b.length >= _BEST_NICE:
            break
        nxt = c.prev[cand & c.wmask]
        # Chains only run backwards; anything else is a slot reused by a newer position.
        if nxt == _EMPTY or nxt >= cand:
            break
        cand = nxt
        depth += 1


cdef size_t _enc_best(uint8_t* dst, const uint8_t* src, size_t n, uint32_t* work,
                      bint snappy) noexcept nogil:
    cdef _Chain c
    cdef _Best b, b1
    cdef size_t s_limit = n - _INPUT_MARGIN
    cdef size_t dst_limit = _bail_limit(n)
    cdef size_t d = 0, next_emit = 0, s = 1, cand, e, last_off = 0
    c.hb = _bits_for(n, 10, 17)
    c.lb = _bits_for(n, 10, 17)
    c.wmask = (<size_t>1 << _bits_for(n, 10, 18)) - 1
    c.head = work
    c.ltab = work + (<size_t>1 << c.hb)
    c.prev = c.ltab + (<size_t>1 << c.lb)
    c.inserted = 0
    # Only head/ltab need clearing: prev slots are written before any chain reaches them.
    memset(work, 0xFF, ((<size_t>1 << c.hb) + (<size_t>1 << c.lb)) * sizeof(uint32_t))
    while s < s_limit:
        _chain_insert_to(&c, src, s)
        _best_at(&b, &c, src, n, s, last_off, snappy)
        if b.score <= 0:
            # Step faster through long unmatched stretches (incompressible payloads).
            s += 1 + ((s - next_emit) >> 9)
            continue
        while s + 1 < s_limit:
            _chain_insert_to(&c, src, s + 1)
            _best_at(&b1, &c, src, n, s + 1, last_off, snappy)
            if b1.score <= b.score + 1:
                break
            b = b1
            s += 1
        e = s + b.length
        cand = s - b.offset
        while cand > 0 and s > next_emit and src[cand - 1] == src[s - 1]:
            cand -= 1
            s -= 1
        if d + (s - next_emit) + 5 > dst_limit:
            return 0
        d += _emit_literal(dst + d, src + next_emit, s - next_emit)
        d += _emit_match(dst + d, b.offset, e - s, last_off, snappy)
        last_off = b.offset
        s = e
        next_emit = e
        if d > dst_limit:
            return 0
    if next_emit < n:
        if d + (n - next_emit) + 5 > dst_limit:
            return 0
        d += _emit_literal(dst + d, src + next_emit, n - next_emit)
    return d


# ----------------------------------------------------------------------------------------
# Level dispatch

cdef inline size_t _work_entries(int level, size_t n) noexcept nogil:
    if level == LEVEL_FAST:
        return <size_t>1 << _bits_for(n, 9, 16)
    if level == LEVEL_BETTER:
        return (<size_t>1 << _bits_for(n, 10, 18)) + (<size_t>1 << _bits_for(n, 9, 16))
    if level == LEVEL_BEST:
        return ((<size_t>1 << _bits_for(n, 10, 17)) * 2 + (<size_t>1 << _bits_for(n, 10, 18)))
    return 0


cdef size_t _encode_tags(uint8_t* dst, const uint8_t* src, size_t n, int level,
                         uint32_t* work, bint snappy) noexcept nogil:
    """Block tags for src (no length prefix), or 0 when a raw store is the better deal."""
    if n < _MIN_COMPRESS or level == LEVEL_UNCOMPRESSED:
        return 0
    if level == LEVEL_FAST:
        return _enc_fast(dst, src, n, work, snappy)
    if level == LEVEL_BETTER:
        return _enc_better(dst, src, n, work, snappy)
    return _enc_best(dst, src, n, work, snappy)


cdef size_t _frame(uint8_t* out, const uint8_t* src, size_t n, size_t bs, int level,
                   bint snappy, uint32_t* work, bint ident) noexcept nogil:
    """One flush: the stream identifier if the stream starts here, then one chunk per
    block of at most bs bytes."""
    cdef size_t o = 0, pos = 0, bn, v, enc, blen
    cdef uint8_t* body
    cdef uint8_t ctype
    if ident:
        o = 10
        if snappy:
            memcpy(out, b"\xff\x06\x00\x00sNaPpY", 10)
        else:
            memcpy(out, b"\xff\x06\x00\x00S2sTwO", 10)
    while pos < n:
        bn = n - pos if n - pos < bs else bs
        body = out + o + 8
        ctype = 1
        blen = bn
        v = _put_uvarint(body, bn)
        enc = _encode_tags(body + v, src + pos, bn, level, work, snappy)
        if enc:
            ctype = 0
            blen = v + enc
        else:
            memcpy(body, src + pos, bn)
        out[o] = ctype
        out[o + 1] = <uint8_t>(blen + 4)
        out[o + 2] = <uint8_t>((blen + 4) >> 8)
        out[o + 3] = <uint8_t>((blen + 4) >> 16)
        st32(out + o + 4, _mask(_crc32c(0, src + pos, bn)))
        o += 8 + blen
        pos += bn
    return o


# ----------------------------------------------------------------------------------------
# Python API

def crc32c(data, uint32_t value=0):
    """CRC-32C (Castagnoli) of data; pass a previous result as value to continue it."""
    cdef const uint8_t[::1] mv = data
    if mv.shape[0] == 0:
        return value
    return _crc32c(value, &mv[0], mv.shape[0])


def masked_crc(data):
    """The masked CRC-32C that S2/Snappy framing stores in every data chunk."""
    cdef const uint8_t[::1] mv = data
    if mv.shape[0] == 0:
        return _mask(0)
    return _mask(_crc32c(0, &mv[0], mv.shape[0]))


def encode_block(data, level="fast", *, bint snappy=False):
    """Encode one S2 block (uvarint length + tags).

    ``snappy=True`` restricts the output to plain Snappy (no repeat codes), which any
    Snappy decoder reads.  Incompressible or tiny input becomes a single literal.
    """
    cdef int lvl = _parse_level(level)
    cdef const uint8_t[::1] mv = data
    cdef size_t n = mv.shape[0], d, enc = 0, entries
    cdef uint8_t* out
    cdef uint32_t* work = NULL
    cdef const uint8_t* src = &mv[0] if n else NULL
    if n > 0xFFFFFFFFULL:
        raise ValueError("S2 blocks hold at most 4 GiB - 1 bytes")
    entries = _work_entries(lvl, n)
    out = <uint8_t*>malloc(_max_encoded(n))
    if entries:
        work = <uint32_t*>malloc(entries * sizeof(uint32_t))
    if out == NULL or (entries and work == NULL):
        free(out)
        free(work)
        raise MemoryError()
    try:
        with nogil:
            d = _put_uvarint(out, n)
            if n:
                enc = _encode_tags(out + d, src, n, lvl, work, snappy)
                if enc:
                    d += enc
                else:
                    d += _emit_literal(out + d, src, n)
        return PyBytes_FromStringAndSize(<char*>out, d)
    finally:
        free(out)
        free(work)


def decode_block(data, *, Py_ssize_t max_size=_MAX_BLOCK):
    """Decode one S2 or Snappy block; S2Error if corrupt or longer than max_size."""
    cdef const uint8_t[::1] mv = data
    cdef size_t n = mv.shape[0], v
    cdef uint64_t dlen
    cdef int rc
    cdef bytes out
    cdef uint8_t* op
    if n == 0:
        raise S2Error("empty block: missing the decoded-length prefix")
    v = _get_uvarint(&mv[0], n, &dlen)
    if v == 0:
        raise S2Error("corrupt block: bad decoded-length prefix")
    if max_size < 0 or dlen > <uint64_t>max_size:
        raise S2Error(f"block decodes to {dlen} bytes, over the limit of {max_size}")
    out = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>dlen)
    op = <uint8_t*><char*>out
    with nogil:
        rc = _decode_body(&mv[0] + v, n - v, op, <size_t>dlen)
    if rc:
        raise S2Error("corrupt block")
    return out


def max_encoded_len(Py_ssize_t n):
    """Upper bound of encode_block()'s output for n input bytes."""
    if n < 0:
        raise ValueError("negative length")
    return <Py_ssize_t>_max_encoded(<size_t>n)


cdef class S2Writer:
    """The S2 stream a route writes for the life of its connection.

    The first ``compress()`` opens the stream with its identifier; every later one
    continues it with chunks only.  The level can change between flushes without a
    new stream (a reload, or ``s2_auto`` following the RTT).
    """

    def __cinit__(self, level="fast", *, Py_ssize_t block_size=_DEFAULT_BLOCK, bint snappy=False):
        self._work = NULL
        self._obuf = NULL
        self._work_cap = 0
        self._obuf_cap = 0
        self._busy = False
        self._started = False
        self._level = _parse_level(level)
        self._snappy = snappy
        if snappy and block_size > _SNAPPY_BLOCK:
            block_size = _SNAPPY_BLOCK
        if block_size < _MIN_BLOCK or block_size > _MAX_BLOCK:
            raise ValueError(f"block_size must be in [{_MIN_BLOCK}, {_MAX_BLOCK}]")
        self._block_size = block_size

    def __dealloc__(self):
        free(self._work)
        free(self._obuf)

    @property
    def level(self):
        return LEVELS[self._level]

    @level.setter
    def level(self, value):
        self._level = _parse_level(value)

    @property
    def started(self):
        """True once the stream identifier has been written."""
        return self._started

    @property
    def block_size(self):
        return self._block_size

    cdef int _ensure(self, size_t work_entries, size_t obuf_bytes) except -1:
        cdef void* p
        if work_entries > self._work_cap:
            p = realloc(self._work, work_entries * sizeof(uint32_t))
            if p == NULL:
                raise MemoryError()
            self._work = <uint32_t*>p
            self._work_cap = work_entries
        if obuf_bytes > self._obuf_cap:
            p = realloc(self._obuf, obuf_bytes)
            if p == NULL:
                raise MemoryError()
            self._obuf = <uint8_t*>p
            self._obuf_cap = obuf_bytes
        return 0

    cpdef bytes compress(self, data):
        """The chunks of one flush (after the identifier on the first); b"" for empty
        input (the reference writes nothing)."""
        cdef const uint8_t[::1] mv = data
        cdef size_t n = mv.shape[0], bs = <size_t>self._block_size, nblocks, o
        cdef const uint8_t* src
        cdef bytes result
        if n == 0:
            return b""
        if self._busy:
            raise RuntimeError("S2Writer.compress() is not re-entrant")
        nblocks = (n + bs - 1) // bs
        self._ensure(_work_entries(self._level, n if n < bs else bs),
                     10 + nblocks * (8 + _max_encoded(bs if n > bs else n)))
        src = &mv[0]
        self._busy = True
        try:
            with nogil:
                o = _frame(self._obuf, src, n, bs, self._level, self._snappy, self._work,
                           not self._started)
        finally:
            self._busy = False
        self._started = True
        result = PyBytes_FromStringAndSize(<char*>self._obuf, o)
        if self._obuf_cap > _RETAIN_LIMIT:
            # One huge flush should not pin its scratch for the life of the route.
            free(self._obuf)
            self._obuf = NULL
            self._obuf_cap = 0
        return result


cdef class S2Reader:
    """Incremental S2/Snappy stream decoder: feed() any split of the wire bytes."""

    def __cinit__(self, *, Py_ssize_t max_block_size=_MAX_BLOCK):
        self._pend = NULL
        self._out = NULL
        self._pend_len = self._pend_cap = 0
        self._out_len = self._out_cap = 0
        if max_block_size < 1 or max_block_size > _MAX_BLOCK:
            raise ValueError(f"max_block_size must be in [1, {_MAX_BLOCK}]")
        self._max_block = max_block_size
        # Largest body of a compressed chunk: CRC + worst-case encoding of a full block.
        self._max_chunk = 4 + _max_encoded(<size_t>max_block_size)
        self._seen_ident = False
        self._snappy_frame = False
        self._failed = False
        self._skip = 0

    def __dealloc__(self):
        free(self._pend)
        free(self._out)

    @property
    def failed(self):
        return self._failed

    @property
    def buffered(self):
        """Bytes held back until the chunk they belong to is complete."""
        return self._pend_len

    def finish(self):
        """Declare end of input: S2Error if the stream stopped inside a chunk.

        feed() cannot tell a truncated stream from one whose next bytes are still in
        flight, so the connection's EOF handler calls this to surface truncation.
        """
        if self._failed:
            raise S2Error("S2 stream already failed")
        if self._pend_len or self._skip:
            self._failed = True
            raise S2Error(f"S2 stream truncated inside a chunk "
                          f"({self._pend_len} bytes buffered, {self._skip} left to skip)")

    cdef int _grow_out(self, size_t extra) except -1:
        cdef size_t need = self._out_len + extra, cap
        cdef void* p
        if need <= self._out_cap:
            return 0
        cap = self._out_cap * 2 if self._out_cap else 4096
        if cap < need:
            cap = need
        p = realloc(self._out, cap)
        if p == NULL:
            raise MemoryError()
        self._out = <uint8_t*>p
        self._out_cap = cap
        return 0

    cdef int _grow_pend(self, size_t need) except -1:
        cdef void* p
        if need <= self._pend_cap:
            return 0
        p = realloc(self._pend, need)
        if p == NULL:
            raise MemoryError()
        self._pend = <uint8_t*>p
        self._pend_cap = need
        return 0

    cdef int _chunk_header(self, const uint8_t* hdr, size_t* body_len) except -1:
        """Validate a chunk header; 0 = body must be buffered and processed, 1 = skip it.

        Pure (no state change) so it can be re-run when a buffered chunk completes, and
        it rejects bad lengths before any body byte is buffered.
        """
        cdef uint8_t t = hdr[0]
        cdef size_t blen = (<size_t>hdr[1]) | (<size_t>hdr[2] << 8) | (<size_t>hdr[3] << 16)
        cdef size_t raw_limit = _SNAPPY_BLOCK if self._snappy_frame else <size_t>self._max_block
        body_len[0] = blen
        if not self._seen_ident and t != 0xFF:
            raise S2Error(f"stream does not start with a stream identifier (chunk type 0x{t:02x})")
        if t == 0x00:
            if blen < 5:
                raise S2Error(f"compressed chunk too short ({blen} bytes)")
            if blen > self._max_chunk:
                raise S2Error(f"compressed chunk of {blen} bytes exceeds the limit of {self._max_chunk}")
            return 0
        if t == 0x01:
            if blen < 4:
                raise S2Error(f"uncompressed chunk too short ({blen} bytes)")
            if blen - 4 > raw_limit:
                raise S2Error(f"uncompressed chunk of {blen - 4} bytes exceeds the block limit of {raw_limit}")
            return 0
        if t == 0xFF:
            if blen != 6:
                raise S2Error(f"stream identifier chunk has length {blen}, expected 6")
            return 0
        if t <= 0x7F:
            raise S2Error(f"reserved unskippable chunk type 0x{t:02x}")
        return 1

    cdef int _chunk_body(self, uint8_t ctype, const uint8_t* body, size_t blen) except -1:
        cdef uint32_t want, got
        cdef uint64_t dlen
        cdef size_t v
        cdef int rc
        cdef uint8_t* dst
        cdef size_t limit
        if ctype == 0xFF:
            if memcmp(body, b"S2sTwO", 6) == 0:
                self._snappy_frame = False
            elif memcmp(body, b"sNaPpY", 6) == 0:
                self._snappy_frame = True
            else:
                raise S2Error(f"unknown stream identifier {(<const char*>body)[:6]!r}")
            self._seen_ident = True
            return 0
        want = ld32(body)
        if ctype == 0x01:
            dlen = blen - 4
            self._grow_out(dlen)
            dst = self._out + self._out_len
            memcpy(dst, body + 4, dlen)
        else:
            v = _get_uvarint(body + 4, blen - 4, &dlen)
            if v == 0:
                raise S2Error("compressed chunk has a corrupt decoded-length prefix")
            limit = _SNAPPY_BLOCK if self._snappy_frame else <size_t>self._max_block
            if dlen > limit:
                raise S2Error(f"compressed chunk decodes to {dlen} bytes, over the block limit of {limit}")
            self._grow_out(dlen)
            dst = self._out + self._out_len
            with nogil:
                rc = _decode_body(body + 4 + v, blen - 4 - v, dst, <size_t>dlen)
            if rc:
                raise S2Error("corrupt compressed block")
        got = _mask(_crc32c(0, dst, dlen))
        if got != want:
            raise S2Error(f"CRC mismatch: chunk says 0x{want:08x}, data has 0x{got:08x}")
        self._out_len += dlen
        return 0

    cpdef bytes feed(self, data):
        """Consume wire bytes; return every uncompressed byte completed so far."""
        cdef const uint8_t[::1] mv = data
        cdef size_t n = mv.shape[0], k, blen, total
        cdef const uint8_t* p
        cdef bytes result
        if self._failed:
            raise S2Error("S2 stream already failed; the reader cannot resynchronise")
        if n == 0:
            return b""
        p = &mv[0]
        self._out_len = 0
        try:
            while n:
                if self._skip:
                    k = self._skip if self._skip < n else n
                    p += k
                    n -= k
                    self._skip -= k
                    continue
                if self._pend_len == 0:
                    if n < 4:
                        self._grow_pend(4)
                        memcpy(self._pend, p, n)
                        self._pend_len = n
                        break
                    if self._chunk_header(p, &blen):
                        p += 4
                        n -= 4
                        self._skip = blen
                        continue
                    total = 4 + blen
                    if n >= total:
                        self._chunk_body(p[0], p + 4, blen)
                        p += total
                        n -= total
                        continue
                    # Incomplete chunk; its size was validated, so buffering is bounded.
                    self._grow_pend(total)
                    memcpy(self._pend, p, n)
                    self._pend_len = n
                    break
                if self._pend_len < 4:
                    k = 4 - self._pend_len
                    if k > n:
                        k = n
                    memcpy(self._pend + self._pend_len, p, k)
                    self._pend_len += k
                    p += k
                    n -= k
                    if self._pend_len < 4:
                        break
                    if self._chunk_header(self._pend, &blen):
                        self._pend_len = 0
                        self._skip = blen
                        continue
                else:
                    self._chunk_header(self._pend, &blen)
                total = 4 + blen
                self._grow_pend(total)
                k = total - self._pend_len
                if k > n:
                    k = n
                memcpy(self._pend + self._pend_len, p, k)
                self._pend_len += k
                p += k
                n -= k
                if self._pend_len < total:
                    break
                self._pend_len = 0
                self._chunk_body(self._pend[0], self._pend + 4, blen)
        except BaseException:
            self._failed = True
            raise
        result = PyBytes_FromStringAndSize(<char*>self._out, self._out_len)
        if self._out_cap > _RETAIN_LIMIT:
            free(self._out)
            self._out = NULL
            self._out_cap = 0
        return result
