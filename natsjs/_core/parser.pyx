# cython: language_level=3
"""The NATS protocol parser: step 2 of a message's path.

Before it: a connection's read loop (``natsjs/client.py``, ``natsjs/route.py``) hands
every chunk it reads from the socket to ``ProtoParser.feed``.  After it: message
operations (PUB, HPUB, and a route's RMSG/HMSG) go to ``process_msg``, which the
fan-out core (``fanout.pyx``) overrides to match the subject and queue the frames;
control operations (CONNECT, SUB, UNSUB, PING, ...) go to the Python callback
``on_op(op, args)``, bound once when the connection is set up.

The parser is a state machine over two states: a control line is being read
(``OP_START``) or a payload is (``MSG_PAYLOAD``).  A control line is found with
``memchr`` and its arguments are sliced in place, so a message that arrives whole in
one read is handled without copying.  Only what a read splits is copied: the
unfinished control line, or the control line plus the part of the payload seen so
far.  The same framing rules as nats-server's ``server/parser.go`` apply: operation
names are case-insensitive, arguments are separated by spaces or tabs, ``\\r`` before
``\\n`` is optional on control lines, and a payload must be followed by exactly
``\\r\\n``.

No I/O, no trio: bytes in, calls out.  Errors raise ``ProtocolError`` whose
``client_error`` is the text nats-server sends in ``-ERR`` (None when the reference
closes the connection without one).
"""
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.string cimport memchr


class ProtocolError(Exception):
    """A protocol violation; the connection is closed after it.

    ``client_error`` is what goes in ``-ERR '...'`` (None: close silently, as
    nats-server does for malformed arguments).
    """

    def __init__(self, message, client_error=None):
        super().__init__(message)
        self.client_error = client_error


# -ERR texts, as nats-server sends them (server/parser.go, server/client.go).
ERR_UNKNOWN_OP = "Unknown Protocol Operation"
ERR_MAX_PAYLOAD = "Maximum Payload Violation"
ERR_MAX_CONTROL_LINE = "maximum control line exceeded"
ERR_AUTH_VIOLATION = "Authorization Violation"

cdef enum:
    OP_START = 0
    MSG_PAYLOAD = 1

# message op codes (internal; never reach Python)
cdef enum:
    M_PUB = 100
    M_HPUB = 101
    M_RMSG = 102
    M_RHMSG = 103

DEF MAX_ARGS = 64


cdef inline unsigned char _upper(unsigned char c) nogil:
    if c >= c'a' and c <= c'z':
        return c - 32
    return c


cdef inline bint _word_is(const unsigned char* p, Py_ssize_t n, const char* word,
                          Py_ssize_t wn) nogil:
    cdef Py_ssize_t k
    if n != wn:
        return False
    for k in range(n):
        if _upper(p[k]) != <unsigned char>word[k]:
            return False
    return True


cdef bytes _snippet(const unsigned char* p, Py_ssize_t n):
    return PyBytes_FromStringAndSize(<const char*>p, n if n < 32 else 32)


cdef class ProtoParser:
    """Incremental parser; subclasses override ``process_msg``."""

    def __init__(self, on_op, int kind=CLIENT, Py_ssize_t max_control_line=4096,
                 Py_ssize_t max_payload=1048576):
        self.state = OP_START
        self.kind = kind
        self.max_control_line = max_control_line
        self.max_payload = max_payload
        self.line = bytearray()
        self.payload = bytearray()
        self.on_op = on_op
        self.on_trace = None
        self.on_trace_payload = None
        self.connect_required = False
        self.closed = False
        self.no_account = False
        self.pause = False

    cpdef feed(self, data, Py_ssize_t length=-1):
        """Parse ``data`` (any bytes-like object, any split), or its first ``length``
        bytes; returns the bytes consumed.

        That is all of them unless a handler set ``pause`` (or closed the connection).
        """
        cdef const unsigned char[::1] view = data
        cdef Py_ssize_t n = view.shape[0]
        cdef Py_ssize_t i = 0, take, need, used, have, ctl_len
        cdef const unsigned char* p
        cdef const unsigned char* nl
        cdef const unsigned char* ctl
        if 0 <= length < n:
            n = length
        if n == 0:
            return 0
        p = &view[0]
        while i < n and not self.closed and not self.pause:
            if self.state == MSG_PAYLOAD:
                have = PyByteArray_GET_SIZE(self.payload)
                need = self.pa.size + 2 - have
                take = need if need < n - i else n - i
                self.payload.extend(view[i:i + take])
                i += take
                if take == need:
                    ctl = <const unsigned char*>PyByteArray_AS_STRING(self.payload)
                    self._finish_msg(ctl)
                    # Drop what a large split message left behind.
                    self.payload = bytearray()
                    del self.line[:]
                    self.state = OP_START
                continue
            nl = <const unsigned char*>memchr(p + i, c'\n', n - i)
            if nl == NULL:
                self.line.extend(view[i:n])
                if PyByteArray_GET_SIZE(self.line) > self._line_limit():
                    raise ProtocolError(
                        "maximum control line exceeded (%d bytes)" % PyByteArray_GET_SIZE(self.line),
                        ERR_MAX_CONTROL_LINE)
                self.end_batch()
                return n
            if PyByteArray_GET_SIZE(self.line) > 0:
                self.line.extend(view[i:(nl - p) + 1])
                i = (nl - p) + 1
                ctl = <const unsigned char*>PyByteArray_AS_STRING(self.line)
                ctl_len = PyByteArray_GET_SIZE(self.line) - 1
            else:
                ctl = p + i
                ctl_len = nl - ctl
                i = (nl - p) + 1
            if ctl_len > 0 and ctl[ctl_len - 1] == c'\r':
                ctl_len -= 1
            used = 0
            self._control(ctl, ctl_len, p + i, n - i, &used)
            i += used
        self.end_batch()
        return i

    cdef Py_ssize_t _line_limit(self):
        # Routes carry account, reply and queue names, so nats-server allows them
        # 16 times the client limit (server/parser.go overMaxControlLineLimit).
        if self.kind == CLIENT:
            return self.max_control_line
        return self.max_control_line * 16

    cdef int _control(self, const unsigned char* ctl, Py_ssize_t n,
                      const unsigned char* rest, Py_ssize_t avail,
                      Py_ssize_t* used) except -1:
        """Dispatch one control line; ``rest`` is what follows it in this read."""
        cdef Py_ssize_t w = 0, a
        cdef int op = 0
        cdef Py_ssize_t total
        cdef bint in_line
        while w < n and ctl[w] != c' ' and ctl[w] != c'\t':
            w += 1
        a = w
        while a < n and (ctl[a] == c' ' or ctl[a] == c'\t'):
            a += 1
        if n > self._line_limit():
            raise ProtocolError("maximum control line exceeded (%d bytes)" % n,
                                ERR_MAX_CONTROL_LINE)
        if self.on_trace is not None:
            self.on_trace(PyBytes_FromStringAndSize(<const char*>ctl, n))
        if self.connect_required and not _word_is(ctl, w, "CONNECT", 7):
            raise ProtocolError("authentication required before %r" % _snippet(ctl, w),
                                ERR_AUTH_VIOLATION)
        if _word_is(ctl, w, "PUB", 3) and self.kind == CLIENT:
            op = M_PUB
        elif _word_is(ctl, w, "HPUB", 4) and self.kind == CLIENT:
            op = M_HPUB
        elif _word_is(ctl, w, "RMSG", 4) and self.kind == ROUTER:
            op = M_RMSG
        elif _word_is(ctl, w, "HMSG", 4) and self.kind == ROUTER:
            op = M_RHMSG
        if op != 0:
            if w == n:
                raise ProtocolError("parser error: proto=%r" % _snippet(ctl, n), ERR_UNKNOWN_OP)
            self._parse_pub(op, ctl + a, n - a)
            total = self.pa.size + 2
            if avail >= total:
                if rest[total - 2] != c'\r' or rest[total - 1] != c'\n':
                    raise ProtocolError("message payload not followed by CRLF: %r"
                                        % _snippet(rest + self.pa.size, 2),
                                        ERR_UNKNOWN_OP)
                if self.on_trace_payload is not None:
                    self.on_trace_payload(PyBytes_FromStringAndSize(<const char*>rest,
                                                                    self.pa.size))
                self.process_msg(rest)
                del self.line[:]
                used[0] = total
                return 0
            # The payload straddles reads: keep the control line (so the argument
            # pointers stay valid) and what we have of the payload.
            in_line = PyByteArray_GET_SIZE(self.line) > 0 and \
                ctl == <const unsigned char*>PyByteArray_AS_STRING(self.line)
            if not in_line:
                self.line.extend(PyBytes_FromStringAndSize(<const char*>ctl, n))
            self._repoint(ctl, n)
            self.payload.extend(PyBytes_FromStringAndSize(<const char*>rest, avail))
            self.state = MSG_PAYLOAD
            used[0] = avail
            return 0

        # PING, PONG and +OK only look at their first letters and skip the rest of
        # the line (server/parser.go OP_PING/OP_PONG/OP_PLUS_OK states).
        if w >= 4 and _word_is(ctl, 4, "PING", 4):
            op = OP_PING
        elif w >= 4 and _word_is(ctl, 4, "PONG", 4):
            op = OP_PONG
        elif w >= 3 and _word_is(ctl, 3, "+OK", 3):
            op = OP_OK
        elif _word_is(ctl, w, "SUB", 3) and self.kind == CLIENT:
            op = OP_SUB
        elif _word_is(ctl, w, "UNSUB", 5) and self.kind == CLIENT:
            op = OP_UNSUB
        elif _word_is(ctl, w, "CONNECT", 7):
            op = OP_CONNECT
        elif _word_is(ctl, w, "INFO", 4):
            op = OP_INFO
        elif _word_is(ctl, w, "-ERR", 4):
            op = OP_ERR
        elif self.kind == ROUTER and _word_is(ctl, w, "RS+", 3):
            op = OP_RS_PLUS
        elif self.kind == ROUTER and _word_is(ctl, w, "RS-", 3):
            op = OP_RS_MINUS
        elif self.kind == ROUTER and _word_is(ctl, w, "LS+", 3):
            op = OP_LS_PLUS
        elif self.kind == ROUTER and _word_is(ctl, w, "LS-", 3):
            op = OP_LS_MINUS
        else:
            raise ProtocolError("parser error: proto=%r" % _snippet(ctl, n), ERR_UNKNOWN_OP)
        if w == n and (op == OP_SUB or op == OP_UNSUB):
            # An operation that takes arguments needs a space after its name.
            raise ProtocolError("parser error: proto=%r" % _snippet(ctl, n), ERR_UNKNOWN_OP)
        if self.control_op(op, ctl + a, n - a):
            del self.line[:]
            return 0
        # Python sees operations in order: what the core batched goes out first.
        self.end_batch()
        # Release the carried-over line before the callback: the callback may feed
        # nothing back, but it must never see a half-reset parser.
        args = PyBytes_FromStringAndSize(<const char*>(ctl + a), n - a)
        del self.line[:]
        self.on_op(op, args)
        return 0

    cdef int _parse_pub(self, int op, const unsigned char* arg, Py_ssize_t n) except -1:
        cdef Py_ssize_t starts[MAX_ARGS]
        cdef Py_ssize_t lens[MAX_ARGS]
        cdef Py_ssize_t c, first_q, last_q, k, nsize, o
        c = split_args(arg, n, starts, lens, MAX_ARGS)
        self.pa.reply = NULL
        self.pa.reply_len = 0
        self.pa.account = NULL
        self.pa.account_len = 0
        self.pa.queues = NULL
        self.pa.queues_len = 0
        self.pa.hdr = -1
        if op == M_PUB or op == M_HPUB:
            nsize = 1 if op == M_PUB else 2
            if c == 1 + nsize:
                pass
            elif c == 2 + nsize:
                self.pa.reply = arg + starts[1]
                self.pa.reply_len = lens[1]
            else:
                raise ProtocolError("process%sPub Parse Error: %r" % (
                    "" if op == M_PUB else "Header", _snippet(arg, n)))
            self.pa.subject = arg + starts[0]
            self.pa.subject_len = lens[0]
        else:
            # RMSG acc subj [reply] size | RMSG acc subj (+ reply | "|") q1 q2 ... size
            # (server/route.go processRoutedMsgArgs); HMSG adds the header size.  A
            # pinned-account route leaves the account out.
            nsize = 1 if op == M_RMSG else 2
            o = 0 if self.no_account else 1
            if c > MAX_ARGS or c < 1 + o + nsize:
                raise ProtocolError("processRoutedMsgArgs Parse Error: %r" % _snippet(arg, n))
            if o:
                self.pa.account = arg + starts[0]
                self.pa.account_len = lens[0]
            self.pa.subject = arg + starts[o]
            self.pa.subject_len = lens[o]
            if c == 2 + o + nsize:
                self.pa.reply = arg + starts[o + 1]
                self.pa.reply_len = lens[o + 1]
            elif c > 2 + o + nsize:
                if lens[o + 1] != 1 or (arg[starts[o + 1]] != c'+' and arg[starts[o + 1]] != c'|'):
                    raise ProtocolError("processRoutedMsgArgs Bad or Missing Reply Indicator: %r"
                                        % _snippet(arg, n))
                first_q = o + 2
                if arg[starts[o + 1]] == c'+':
                    self.pa.reply = arg + starts[o + 2]
                    self.pa.reply_len = lens[o + 2]
                    first_q = o + 3
                last_q = c - nsize - 1
                if last_q >= first_q:
                    self.pa.queues = arg + starts[first_q]
                    self.pa.queues_len = starts[last_q] + lens[last_q] - starts[first_q]
        if op == M_HPUB or op == M_RHMSG:
            self.pa.hdr = parse_size(arg + starts[c - 2], lens[c - 2])
            self.pa.size = parse_size(arg + starts[c - 1], lens[c - 1])
            if self.pa.hdr < 0:
                raise ProtocolError("processHeaderPub Bad or Missing Header Size: %r"
                                    % _snippet(arg, n))
            if self.pa.size < 0:
                raise ProtocolError("processHeaderPub Bad or Missing Total Size: %r"
                                    % _snippet(arg, n))
            if self.pa.hdr > self.pa.size:
                raise ProtocolError("processHeaderPub Header Size larger then TotalSize: %r"
                                    % _snippet(arg, n))
        else:
            self.pa.size = parse_size(arg + starts[c - 1], lens[c - 1])
            if self.pa.size < 0:
                raise ProtocolError("processPub Bad or Missing Size: %r" % _snippet(arg, n))
        # Routes get a limit too (their own, larger one): nats-server has none there,
        # but an unauthenticated route port must not buffer gigabytes.
        if self.pa.size > self.max_payload:
            raise ProtocolError("maximum payload exceeded: %d vs %d"
                                % (self.pa.size, self.max_payload), ERR_MAX_PAYLOAD)
        return 0

    cdef int _repoint(self, const unsigned char* old_base, Py_ssize_t ctl_len) except -1:
        """Move the argument pointers from ``old_base`` into the copy in ``line``."""
        cdef const unsigned char* base = <const unsigned char*>PyByteArray_AS_STRING(self.line)
        if base == old_base:
            return 0
        if self.pa.subject != NULL:
            self.pa.subject = base + (self.pa.subject - old_base)
        if self.pa.reply != NULL:
            self.pa.reply = base + (self.pa.reply - old_base)
        if self.pa.account != NULL:
            self.pa.account = base + (self.pa.account - old_base)
        if self.pa.queues != NULL:
            self.pa.queues = base + (self.pa.queues - old_base)
        return 0

    cdef int _finish_msg(self, const unsigned char* msg) except -1:
        if msg[self.pa.size] != c'\r' or msg[self.pa.size + 1] != c'\n':
            raise ProtocolError("message payload not followed by CRLF", ERR_UNKNOWN_OP)
        if self.on_trace_payload is not None:
            self.on_trace_payload(PyBytes_FromStringAndSize(<const char*>msg, self.pa.size))
        self.process_msg(msg)
        return 0

    cdef int process_msg(self, const unsigned char* msg) except -1:
        """Called with the payload of the message described by ``self.pa``.

        The base class hands Python a tuple, which is what the tests of the parser
        itself use; the fan-out core overrides this and stays in C.
        """
        self.on_op(-1, self.current_message(msg))
        return 0

    cdef int control_op(self, int op, const unsigned char* arg, Py_ssize_t n) except -1:
        """A control operation handled in C (SUB, UNSUB, RS+, RS- on the common path):
        1 if it was, 0 to hand it to ``on_op``.  ``arg`` is valid for this call only."""
        return 0

    cdef int end_batch(self) except -1:
        """Called when ``feed`` returns and before any ``on_op`` call: the core hands
        Python what it gathered over the operations handled in C (interest changes)."""
        return 0

    cdef tuple current_message(self, const unsigned char* msg):
        return (
            PyBytes_FromStringAndSize(<const char*>self.pa.subject, self.pa.subject_len),
            PyBytes_FromStringAndSize(<const char*>self.pa.reply, self.pa.reply_len)
            if self.pa.reply != NULL else None,
            self.pa.hdr,
            PyBytes_FromStringAndSize(<const char*>msg, self.pa.size),
            PyBytes_FromStringAndSize(<const char*>self.pa.account, self.pa.account_len)
            if self.pa.account != NULL else None,
            PyBytes_FromStringAndSize(<const char*>self.pa.queues, self.pa.queues_len)
            if self.pa.queues != NULL else None,
        )

    def release(self):
        """Drop what a split message left buffered (the connection is closed)."""
        self.line = bytearray()
        self.payload = bytearray()

    @property
    def pending_bytes(self):
        """Bytes held back for an unfinished control line or payload."""
        return PyByteArray_GET_SIZE(self.line) + PyByteArray_GET_SIZE(self.payload)


# The constants for Python callers (the Python layer dispatches on these).
KIND_CLIENT = CLIENT
KIND_ROUTER = ROUTER
CONNECT = OP_CONNECT
INFO = OP_INFO
SUB = OP_SUB
UNSUB = OP_UNSUB
PING = OP_PING
PONG = OP_PONG
OK = OP_OK
ERR = OP_ERR
RS_PLUS = OP_RS_PLUS
RS_MINUS = OP_RS_MINUS
LS_PLUS = OP_LS_PLUS
LS_MINUS = OP_LS_MINUS
MSG = -1
