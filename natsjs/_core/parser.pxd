# Declarations for the protocol parser (see parser.pyx).

# Argument helpers shared with the cores that handle operations in C (fanout.pyx).
cdef inline Py_ssize_t parse_size(const unsigned char* p, Py_ssize_t n) nogil:
    """Decimal digits only, at most 9 of them (as nats-server's parseSize); -1 if not."""
    cdef Py_ssize_t v = 0, k
    if n == 0 or n > 9:
        return -1
    for k in range(n):
        if p[k] < c'0' or p[k] > c'9':
            return -1
        v = v * 10 + (p[k] - c'0')
    return v


cdef inline Py_ssize_t split_args(const unsigned char* p, Py_ssize_t n,
                                  Py_ssize_t* starts, Py_ssize_t* lens,
                                  Py_ssize_t maxn) nogil:
    """Split on spaces and tabs; returns the count, or maxn + 1 if there are more."""
    cdef Py_ssize_t i = 0, count = 0, s
    while i < n:
        while i < n and (p[i] == c' ' or p[i] == c'\t'):
            i += 1
        if i >= n:
            break
        s = i
        while i < n and p[i] != c' ' and p[i] != c'\t':
            i += 1
        if count == maxn:
            return maxn + 1
        starts[count] = s
        lens[count] = i - s
        count += 1
    return count


# Connection kinds: which operations the parser accepts and how it reads their
# arguments (a route's RMSG carries an account and queue names, a client's PUB
# does not).
cdef enum:
    CLIENT = 0
    ROUTER = 1

# Control operations handed to the Python layer through ``on_op``.  Message
# operations (PUB, HPUB, RMSG, routed HMSG) never leave Cython: they go to
# ``process_msg`` with pointers into the read buffer.
cdef enum:
    OP_CONNECT = 1
    OP_INFO = 2
    OP_SUB = 3
    OP_UNSUB = 4
    OP_PING = 5
    OP_PONG = 6
    OP_OK = 7
    OP_ERR = 8
    OP_RS_PLUS = 9
    OP_RS_MINUS = 10
    OP_LS_PLUS = 11
    OP_LS_MINUS = 12

# The arguments of the message being parsed.  Pointers refer either into the
# caller's buffer (the common, zero-copy case) or into ``ProtoParser.line`` when
# the message straddles two reads.
cdef struct PubArg:
    const unsigned char* subject
    Py_ssize_t subject_len
    const unsigned char* reply
    Py_ssize_t reply_len
    const unsigned char* account
    Py_ssize_t account_len
    const unsigned char* queues      # space separated queue names (routes)
    Py_ssize_t queues_len
    Py_ssize_t hdr                   # header length, -1 when the op has none
    Py_ssize_t size                  # total payload length (headers included)


cdef class ProtoParser:
    cdef int state
    cdef public int kind
    cdef public Py_ssize_t max_control_line
    cdef public Py_ssize_t max_payload
    # Leftover of a control line, or the control line of a message whose
    # payload is still arriving: copied only when a read splits them.
    cdef bytearray line
    cdef bytearray payload
    cdef PubArg pa
    # Python callback for control operations: on_op(op, args_bytes).
    cdef object on_op
    # Raw control-line tracer (``-V``): on_trace(line_bytes) or None.
    cdef public object on_trace
    cdef public object on_trace_payload
    # Authentication pending: every operation but CONNECT is an Authorization
    # Violation (server/parser.go authErr).
    cdef public bint connect_required
    # Set when the connection is closed: the rest of the read batch is dropped, as the
    # reference stops at the error.
    cdef public bint closed
    # A route dedicated to one account (pinned): RMSG/HMSG carry no account.
    cdef public bint no_account
    # Set by an on_op handler to stop after the current operation: feed() then
    # returns how much it consumed (a route switching its reader to S2).
    cdef public bint pause

    cpdef feed(self, data, Py_ssize_t length=*)
    cdef int _control(self, const unsigned char* ctl, Py_ssize_t n,
                      const unsigned char* rest, Py_ssize_t avail,
                      Py_ssize_t* used) except -1
    cdef int _parse_pub(self, int op, const unsigned char* arg, Py_ssize_t n) except -1
    cdef int _repoint(self, const unsigned char* old_base, Py_ssize_t ctl_len) except -1
    cdef int _finish_msg(self, const unsigned char* msg) except -1
    cdef int process_msg(self, const unsigned char* msg) except -1
    cdef int control_op(self, int op, const unsigned char* arg, Py_ssize_t n) except -1
    cdef int end_batch(self) except -1
    cdef tuple current_message(self, const unsigned char* msg)
    cdef Py_ssize_t _line_limit(self)
