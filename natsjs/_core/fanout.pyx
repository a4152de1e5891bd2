# cython: language_level=3
"""Fan-out: steps 3 and 4 of a message's path, in C.

Before it: ``ProtoParser.feed`` (parser.pyx) has sliced a PUB/HPUB out of the read
buffer and calls ``process_msg`` with a pointer to the payload.  Here the subject is
matched in the account's sublist (sublist.pyx), one ``MSG``/``HMSG`` frame is
appended to the outbound buffer of every interested connection, one member of each
queue group is picked at random, and each connection written to is put once on the
producer's ``pcd`` list.  After it: when ``feed`` returns, the connection's read
loop (natsjs/client.py) flushes every connection on ``pcd`` once for the whole read
batch, as nats-server does with its per-read ``pcd`` map (server/client.go
flushClients).

Nothing here allocates per delivered message: the frame is written straight into
the target's ``bytearray``.  The only per-message Python object is the subject, and
even that is skipped while a connection keeps publishing to the same subject and
the sublist has not changed (``last_subject``/``genid``).

An internal subscriber (``Subscription.callback``: imports, $SYS handlers, JetStream)
is called in place of a frame write; if it raises, its ``owner`` binding is told
(it logs and answers with an error, natsjs/server.py) and the fan-out goes on, so a
failing handler never costs the publisher its connection.  A callback that returns
``UNDELIVERED`` took no interest in the message: it does not count as a responder
(the JetStream API passing on pull requests and direct gets, as nats-server's
service import does).

Back-pressure (server/client.go queueOutbound): a connection whose pending output
passes 3/4 of ``max_pending`` is reported in the producer's ``stalled`` so the read
loop waits for it to drain before reading more; one that passes ``max_pending`` is a
slow consumer and is closed through its Python object.
"""
from cpython.bytearray cimport (PyByteArray_AS_STRING, PyByteArray_GET_SIZE,
                                PyByteArray_Resize)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyObject_Free, PyObject_Malloc
from libc.string cimport memcmp, memcpy, memmove
from libc.stdint cimport uint64_t

from natsjs._core.parser cimport (CLIENT, OP_RS_MINUS, OP_RS_PLUS, OP_SUB, OP_UNSUB, ROUTER,
                                  ProtoParser, parse_size, split_args)
from natsjs._core.parser import ProtocolError
from natsjs._core.sublist cimport Sublist, SublistResult, Subscription
from natsjs._core.sublist cimport hold_sub, literal_ok, new_sub, release_sub

import os

DEF MAX_PENDING_SIZE = 67108864

# What an internal subscriber's callback returns when the message was not for it.
UNDELIVERED = object()


class UnsafeSubject(ValueError):
    """Server code asked to publish on a subject or reply that would break the
    protocol line it is written into (a space, a tab, CR, LF, VT or FF)."""


cdef inline bint _line_safe(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    """No byte that ends or splits a protocol line (whitespace: the parser splits a
    client's arguments on space and tab, so none of these comes from a client).  Names
    and subjects are checked where they enter (natsjs/jetstream/names.py); this is the
    second wall, so that a check missed there can not become a forged MSG or RMSG."""
    cdef Py_ssize_t i
    cdef unsigned char c
    for i in range(n):
        c = p[i]
        if c == 32 or 9 <= c <= 13:
            return False
    return True


cdef int _check_line_safe(bytes what) except -1:
    if what is not None and not _line_safe(<const unsigned char*>PyBytes_AS_STRING(what),
                                           PyBytes_GET_SIZE(what)):
        raise UnsafeSubject("refusing to write %r into a protocol line" % (what[:64],))
    return 0


cdef class WithProducer:
    """An internal subscriber's callback that is also told who published: called as
    ``fn(producer, sub, subject, reply, hdr, msg)``, ``producer`` being the publishing
    connection's Python object (None for server code).  The JetStream API names the
    requester in its audit advisories, as nats-server's request info does."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, sub, subject, reply, hdr, msg):
        return self.fn(None, sub, subject, reply, hdr, msg)


cdef inline Py_ssize_t _ndigits(Py_ssize_t v) noexcept nogil:
    cdef Py_ssize_t d = 1
    while v >= 10:
        v //= 10
        d += 1
    return d


cdef inline char* _put_int(char* p, Py_ssize_t v, Py_ssize_t nd) noexcept nogil:
    cdef Py_ssize_t k = nd - 1
    while k >= 0:
        p[k] = <char>(48 + v % 10)
        v //= 10
        k -= 1
    return p + nd


cdef inline char* _put(char* p, const void* src, Py_ssize_t n) noexcept nogil:
    memcpy(p, src, n)
    return p + n


cdef inline char* _put_word(char* p, const void* src, Py_ssize_t n) noexcept nogil:
    """``src`` and the space that separates protocol arguments."""
    memcpy(p, src, n)
    p[n] = c' '
    return p + n + 1


cdef inline char* _put_sizes(char* p, Py_ssize_t hdr, Py_ssize_t hd, Py_ssize_t size,
                             Py_ssize_t nd) noexcept nogil:
    """The size arguments that end MSG/HMSG/RMSG lines: ``[hdr ]size``."""
    if hdr >= 0:
        p = _put_int(p, hdr, hd)
        p[0] = c' '
        p += 1
    return _put_int(p, size, nd)


cdef inline char* _put_payload(char* p, const unsigned char* msg, Py_ssize_t size) noexcept nogil:
    """``\\r\\n<payload>\\r\\n`` after a control line."""
    p[0] = c'\r'
    p[1] = c'\n'
    p = _put(p + 2, msg, size)
    p[0] = c'\r'
    p[1] = c'\n'
    return p + 2


cdef inline bint _has_prefix(const unsigned char* p, Py_ssize_t n, const char* pre,
                             Py_ssize_t plen) noexcept nogil:
    return n > plen and memcmp(p, pre, plen) == 0


cdef inline bint _reserved_reply(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    """Reply subjects reserved to servers: service-import responses (``_R_.``),
    JetStream acknowledgements (``$JS.ACK.``) and gateway replies (``_GR_.``)."""
    return (n > 3 and memcmp(p, b"_R_.", 4) == 0) or _has_prefix(p, n, b"$JS.ACK.", 8) \
        or _has_prefix(p, n, b"_GR_.", 5)


# A connection's pending output: appended at the back (``reserve``), written from the
# front (``consume``).  With CPython's own resizing, each append that met the end of the
# allocation while written bytes lay in front copied everything pending into a new
# buffer an eighth larger, and each write that left less than half the allocation
# pending copied it into a smaller one: with megabytes pending for a subscriber that
# cannot keep up, every byte was copied about eight times (a fifth of the server's CPU
# in pub/sub of 1 KB messages).  Past BIG_OUT bytes, what is pending moves to the front
# of its own allocation when the written bytes in front of it make room, and a new
# allocation is twice what is needed: each byte is copied at most twice, and in a
# steady backlog once (the room a new allocation leaves is what the next move needs;
# with less, say half as large again, every append at the end paid a copy into fresh
# memory instead, and the page faults on it stopped the server for tens of
# milliseconds at a time).  The buffer stays a plain bytearray (the same fields, the
# same allocator as CPython's own resizing).

cdef extern from "Python.h":
    ctypedef struct PyByteArrayObject:
        Py_ssize_t ob_alloc      # bytes allocated at ob_bytes
        char* ob_bytes           # the allocation
        char* ob_start           # where the contents start in it
        Py_ssize_t ob_exports    # buffer views held: nothing may move while any is
    void Py_SET_SIZE(object o, Py_ssize_t size)

DEF BIG_OUT = 65536


cdef inline char* reserve(bytearray out, Py_ssize_t extra) except NULL:
    """Grow ``out`` by ``extra`` bytes and return where they start."""
    cdef PyByteArrayObject* o = <PyByteArrayObject*>out
    cdef Py_ssize_t old = PyByteArray_GET_SIZE(out)
    cdef Py_ssize_t need = old + extra
    cdef Py_ssize_t off, alloc
    cdef char* buf
    if need < BIG_OUT or o.ob_exports:
        if PyByteArray_Resize(out, need) < 0:
            return NULL
        return PyByteArray_AS_STRING(out) + old
    off = o.ob_start - o.ob_bytes
    if off + need + 1 > o.ob_alloc:
        if off >= old and need + 1 <= o.ob_alloc:
            memmove(o.ob_bytes, o.ob_start, old)
        else:
            alloc = 2 * need + 1
            buf = <char*>PyObject_Malloc(alloc)
            if buf == NULL:
                raise MemoryError()
            memcpy(buf, o.ob_start, old)
            PyObject_Free(o.ob_bytes)
            o.ob_bytes = buf
            o.ob_alloc = alloc
        o.ob_start = o.ob_bytes
    Py_SET_SIZE(out, need)
    o.ob_start[need] = 0
    return o.ob_start + old


def consume(bytearray out, Py_ssize_t n):
    """``del out[:n]``, the ``n`` bytes written: in a large buffer, only its start moves
    (``reserve`` moves what is left when the room is needed); an emptied buffer gives
    its allocation back."""
    cdef PyByteArrayObject* o = <PyByteArrayObject*>out
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(out)
    if n <= 0:
        return
    if n >= size or o.ob_alloc <= BIG_OUT or o.ob_exports:
        del out[:n]
        return
    o.ob_start += n
    Py_SET_SIZE(out, size - n)


cdef class Sink:
    """An internal subscriber implemented in C (JetStream's stream capture,
    natsjs/_core/jsingest.pyx): a subscription whose ``callback`` is a Sink gets
    ``absorb`` with pointers into the publisher's read buffer instead of a Python call
    with fresh bytes objects.  ``absorb`` must copy what it keeps."""

    cdef int absorb(self, Conn producer, const unsigned char* subj, Py_ssize_t slen,
                    const unsigned char* reply, Py_ssize_t rlen, const unsigned char* msg,
                    Py_ssize_t hdr, Py_ssize_t size) except -1:
        raise NotImplementedError


cdef class Conn(ProtoParser):
    """A connection's parser plus its outbound buffer; subclasses write frames."""

    def __init__(self, on_op, conn=None, int kind=CLIENT, Py_ssize_t max_control_line=4096,
                 Py_ssize_t max_payload=1048576, Py_ssize_t max_pending=MAX_PENDING_SIZE):
        ProtoParser.__init__(self, on_op, kind, max_control_line, max_payload)
        self.out = bytearray()
        self.max_pending = max_pending
        self.pending = False
        self.headers = False
        self.conn = conn
        self.in_msgs = 0
        self.in_bytes = 0
        self.out_msgs = 0
        self.out_bytes = 0
        self.pcd = []
        self.stalled = None
        self.is_route = False
        self.on_trace_out = None
        self.deliver_filter = None
        self.echo = True
        self.rng = <uint64_t>int.from_bytes(os.urandom(8), "little") | 1
        self.dsubj = NULL
        self.dsubj_len = 0

    cdef Py_ssize_t pick(self, Py_ssize_t n):
        """A random index below n (xorshift64: cheap, and good enough to spread load)."""
        self.rng ^= self.rng << 13
        self.rng ^= self.rng >> 7
        self.rng ^= self.rng << 17
        return <Py_ssize_t>(self.rng % <uint64_t>n)

    cdef SublistResult match_cached(self, Sublist sl, const unsigned char* subj,
                                    Py_ssize_t slen):
        """What ``subj`` matches in ``sl``, reusing the last answer while the subject,
        the sublist and its change counter are the same."""
        cdef bytes s = self.last_subject
        # The change counter is per sublist: a connection that moved to another
        # account (a second CONNECT) must not take the old account's result because
        # the two counters happen to be equal.
        if s is not None and self.last_gen == sl.genid and self.last_sublist is sl \
                and PyBytes_GET_SIZE(s) == slen \
                and memcmp(PyBytes_AS_STRING(s), subj, slen) == 0:
            return self.last_result
        s = PyBytes_FromStringAndSize(<const char*>subj, slen)
        self.last_result = sl.match(s)
        self.last_subject = s
        self.last_sublist = sl
        self.last_gen = sl.genid
        return self.last_result

    cdef int deliver(self, Subscription sub, const unsigned char* msg) except -1:
        """One local delivery of the message in ``self.pa``; 1 if it was delivered."""
        cdef Conn target
        cdef object cb, result
        cdef const unsigned char* subj = self.pa.subject
        cdef Py_ssize_t slen = self.pa.subject_len
        cdef bytes subject, reply
        if sub.closed or (sub.max_msgs > 0 and sub.nmsgs >= sub.max_msgs):
            return 0
        if sub.callback is not None:
            sub.nmsgs += 1
            if isinstance(sub.callback, Sink) and self.dsubj == NULL:
                (<Sink>sub.callback).absorb(self, subj, slen, self.pa.reply,
                                            self.pa.reply_len if self.pa.reply != NULL else -1,
                                            msg, self.pa.hdr, self.pa.size)
                return 1
            subject = PyBytes_FromStringAndSize(<const char*>subj, slen)
            reply = PyBytes_FromStringAndSize(<const char*>self.pa.reply, self.pa.reply_len) \
                if self.pa.reply != NULL else None
            if self.dsubj != NULL:
                # Server code gets a JetStream delivery by the subject it was routed on
                # (imports map that one, as in nats-server); the subject to show rides
                # in the reply the way routes carry it: ``reply@shown``.
                reply = (reply or b"") + b"@" + PyBytes_FromStringAndSize(
                    <const char*>self.dsubj, self.dsubj_len)
            cb = sub.callback
            try:
                if type(cb) is WithProducer:
                    result = (<WithProducer>cb).fn(
                        self.conn, sub, subject, reply, self.pa.hdr,
                        PyBytes_FromStringAndSize(<const char*>msg, self.pa.size))
                else:
                    result = cb(sub, subject, reply, self.pa.hdr,
                                PyBytes_FromStringAndSize(<const char*>msg, self.pa.size))
                if result is UNDELIVERED:
                    return 0
            except Exception as exc:
                # A failing handler is its owner's problem (it logs and answers with
                # an error), never the publisher's: the fan-out goes on.
                if sub.owner is None:
                    raise
                try:
                    sub.owner.handler_failed(sub, subject, reply, exc)
                except Exception:
                    pass
            return 1
        if self.dsubj != NULL:
            subj, slen = self.dsubj, self.dsubj_len
        target = <Conn>sub.client
        if target.closed or (target is self and not self.echo):
            return 0
        if target.deliver_filter is not None and not target.deliver_filter(
                PyBytes_FromStringAndSize(<const char*>subj, slen)):
            return 0
        sub.nmsgs += 1
        target.write_msg(sub, subj, slen, self.pa.reply,
                         self.pa.reply_len if self.pa.reply != NULL else -1,
                         msg, self.pa.hdr, self.pa.size)
        target.queued(self)
        if sub.max_msgs > 0 and sub.nmsgs >= sub.max_msgs and target.conn is not None:
            target.conn.auto_unsubscribe(sub)
        return 1

    cdef int deliver_to_group(self, list group, const unsigned char* msg,
                              bint to_routes) except -1:
        """One member of a queue group gets the message; 1 if one did.

        The pick starts at a random member and moves on past members that cannot
        take it.  A member on another server (a route's queue subscription, listed
        once per member there) hands the message to that server with the queue name
        when ``to_routes``; a message that came from a route never goes back out.
        """
        cdef Py_ssize_t n = len(group), start, k, j
        cdef Subscription sub
        start = self.pick(n)
        for k in range(n):
            j = start + k
            if j >= n:
                j -= n
            sub = <Subscription>group[j]
            if sub.callback is None and (<Conn>sub.client).is_route:
                if not to_routes or (<Conn>sub.client).closed:
                    continue
                self.route_queue(<Conn>sub.client, sub.queue)
                return 1
            if self.deliver(sub, msg):
                return 1
        return 0

    cdef int route_queue(self, Conn route, bytes queue) except -1:
        raise NotImplementedError

    cdef int write_msg(self, Subscription sub,
                       const unsigned char* subj, Py_ssize_t slen,
                       const unsigned char* reply, Py_ssize_t rlen,
                       const unsigned char* msg, Py_ssize_t hdr,
                       Py_ssize_t size) except -1:
        raise NotImplementedError

    cdef int queued(self, Conn producer) except -1:
        """Bookkeeping after a frame was appended to ``self.out`` in ``producer``'s batch."""
        cdef Py_ssize_t size = PyByteArray_GET_SIZE(self.out)
        if not self.pending:
            self.pending = True
            producer.pcd.append(self)
        if size > (self.max_pending >> 2) * 3:
            if size > self.max_pending and not self.closed:
                self.closed = True
                if self.conn is not None:
                    self.conn.slow_consumer()
                return 0
            if self is not producer:
                producer.stalled = self
        return 0

    cpdef send_msg(self, Subscription sub, bytes subject, bytes reply, Py_ssize_t hdr,
                   bytes msg):
        """Write one message frame from server code (imports, $SYS replies); no flush."""
        self.write_msg(sub, <const unsigned char*>PyBytes_AS_STRING(subject),
                       PyBytes_GET_SIZE(subject),
                       <const unsigned char*>PyBytes_AS_STRING(reply) if reply is not None else NULL,
                       PyBytes_GET_SIZE(reply) if reply is not None else -1,
                       <const unsigned char*>PyBytes_AS_STRING(msg), hdr, PyBytes_GET_SIZE(msg))
        return None

    def take_pcd(self):
        """The connections written to since the last call (each once), and reset."""
        cdef list pcd = self.pcd
        cdef Conn c
        self.pcd = []
        for c in pcd:
            c.pending = False
        return pcd

    def enqueue(self, data):
        """Append protocol bytes (PONG, INFO, -ERR ...) to this connection's output.

        These count against max_pending like messages do: a peer that pipelines
        PINGs and never reads is a slow consumer too.
        """
        self.out += data
        if PyByteArray_GET_SIZE(self.out) > self.max_pending and not self.closed:
            self.closed = True
            if self.conn is not None:
                self.conn.slow_consumer()


cdef class ClientCore(Conn):
    """The client side of the hot path: PUB/HPUB in, MSG/HMSG out."""

    def __init__(self, on_op, conn=None, Sublist sublist=None, Py_ssize_t max_control_line=4096,
                 Py_ssize_t max_payload=1048576, Py_ssize_t max_pending=MAX_PENDING_SIZE):
        Conn.__init__(self, on_op, conn, CLIENT, max_control_line, max_payload, max_pending)
        self.sublist = sublist
        self.account_name = b"$G"
        self.to_routes = True
        # Made on first use, like ipending: most clients never publish to a route.
        self.rtargets = None
        self.rqueues = None
        # nats-server's defaults before CONNECT says otherwise (server/client.go).
        self.echo = True
        self.verbose = True
        self.pedantic = True
        self.no_responders = False
        self.pub_check = None
        self.on_reply = None
        self.last_subject = None
        self.last_result = None
        self.last_gen = 0
        self.route_reply = None
        self.subs = {}
        self.fast_subs = False
        self.sub_check = None
        self.on_interest = None
        self.max_subs = 0
        self.ipending = None
        self.idelta = 0

    # ---- SUB and UNSUB (server/client.go processSub, processUnsub) -------------------

    cdef int control_op(self, int op, const unsigned char* arg, Py_ssize_t n) except -1:
        if not self.fast_subs:
            return 0
        if op == OP_SUB:
            return self._process_sub(arg, n)
        if op == OP_UNSUB:
            return self._process_unsub(arg, n)
        return 0

    cdef int _process_sub(self, const unsigned char* arg, Py_ssize_t n) except -1:
        """``SUB subject [queue] sid``; 0 hands it to Python (a malformed line, a
        permission refused, the limit reached) so that errors are reported in one
        place."""
        cdef Py_ssize_t starts[4]
        cdef Py_ssize_t lens[4]
        cdef Py_ssize_t c, k
        cdef bytes sid, subject, queue = None
        c = split_args(arg, n, starts, lens, 3)
        if c == 2:
            k = 1
        elif c == 3:
            k = 2
            queue = PyBytes_FromStringAndSize(<const char*>arg + starts[1], lens[1])
        else:
            return 0
        if self.max_subs > 0 and len(self.subs) >= self.max_subs:
            return 0
        subject = PyBytes_FromStringAndSize(<const char*>arg + starts[0], lens[0])
        if self.sub_check is not None and not self.sub_check(subject, queue):
            return 0
        sid = PyBytes_FromStringAndSize(<const char*>arg + starts[k], lens[k])
        if sid in self.subs:
            return self._ok()
        try:
            self.add_sub(subject, queue, sid)
        except ValueError:
            self.out += b"-ERR 'Invalid Subject'\r\n"
            self.queued(self)
            return 1
        return self._ok()

    cpdef Subscription add_sub(self, bytes subject, bytes queue, bytes sid):
        """Subscribe this connection (the checks are the caller's); ValueError for an
        invalid subject.  The interest change waits for ``flush_interest``."""
        cdef Subscription sub = new_sub(subject, queue, sid, self, 1)
        self.sublist.insert(sub)
        self.subs[sid] = sub
        hold_sub(sub)
        self.note_interest(sub, 1)
        return sub

    cdef int _process_unsub(self, const unsigned char* arg, Py_ssize_t n) except -1:
        """``UNSUB sid [max]``: a max the subscription has not reached yet arms it,
        anything else (or a max that is not a number) removes it now."""
        cdef Py_ssize_t starts[3]
        cdef Py_ssize_t lens[3]
        cdef Py_ssize_t c, max_msgs = 0
        cdef Subscription sub
        c = split_args(arg, n, starts, lens, 2)
        if c == 2:
            max_msgs = parse_size(arg + starts[1], lens[1])
        elif c != 1:
            return 0
        sub = self.subs.get(PyBytes_FromStringAndSize(<const char*>arg + starts[0], lens[0]))
        if sub is not None:
            if max_msgs > 0 and sub.nmsgs < max_msgs:
                sub.max_msgs = max_msgs
            else:
                self.unsubscribe(sub)
        return self._ok()

    cdef int _ok(self) except -1:
        cdef char* p
        if self.verbose:
            p = reserve(self.out, 5)
            memcpy(p, b"+OK\r\n", 5)
            self.queued(self)
        return 1

    cpdef bint unsubscribe(self, Subscription sub) except -1:
        """Drop ``sub`` (UNSUB, its max reached, the connection closing); True if it
        was in the sublist.  The interest change waits for ``flush_interest``."""
        if self.subs.get(sub.sid) is sub:
            del self.subs[sub.sid]
        sub.closed = True
        release_sub(sub)
        if self.sublist.remove(sub):
            self.note_interest(sub, -1)
            return True
        return False

    cpdef list drop_all(self, Sublist sublist, bint keep=False):
        """Take every subscription of this connection out of ``sublist`` (the
        connection closed, or moved to another account); returns them.  ``keep``
        leaves them listed in ``subs`` (for /connz of closed connections)."""
        cdef list subs = list(self.subs.values())
        cdef Subscription sub
        for sub in subs:
            sub.closed = True
            release_sub(sub)
            sublist.remove(sub)
        if not keep:
            self.subs.clear()
        return subs

    cdef int note_interest(self, Subscription sub, int delta) except -1:
        if self.ipending and self.idelta != delta:
            self.flush_interest()
        if self.ipending is None:
            self.ipending = []
        self.ipending.append(sub)
        self.idelta = delta
        return 0

    cpdef flush_interest(self):
        """Hand the interest changes gathered so far to ``on_interest``, in one call."""
        cdef list subs = self.ipending
        if not subs:
            return None
        self.ipending = None
        if self.on_interest is not None:
            self.on_interest(subs, self.idelta)
        return None

    cdef int end_batch(self) except -1:
        if self.ipending:
            self.flush_interest()
        return 0

    cdef SublistResult lookup(self, const unsigned char* subj, Py_ssize_t slen):
        return self.match_cached(self.sublist, subj, slen)

    cdef int process_msg(self, const unsigned char* msg) except -1:
        cdef SublistResult r
        cdef Subscription sub
        cdef list group
        cdef Py_ssize_t delivered = 0
        cdef char* p
        if self.pa.hdr >= 0 and not self.headers:
            # server/client.go processHeaderPub: ErrMsgHeadersNotSupported closes the
            # connection without an -ERR.
            raise ProtocolError("message headers not supported")
        if self.ipending:
            # Routes hear of a subscription before any message sent after it (a
            # request's reply subject must be known where the responder is).
            self.flush_interest()
        self.in_msgs += 1
        self.in_bytes += self.pa.size
        if self.pedantic and not literal_ok(self.pa.subject, self.pa.subject_len):
            self.out += b"-ERR 'Invalid Publish Subject'\r\n"
            self.queued(self)
        if self.verbose:
            p = reserve(self.out, 5)
            memcpy(p, b"+OK\r\n", 5)
            self.queued(self)
        if self.pub_check is not None and not self.pub_check(
                PyBytes_FromStringAndSize(<const char*>self.pa.subject, self.pa.subject_len)):
            return 0
        if self.pa.reply != NULL and self.conn is not None \
                and _reserved_reply(self.pa.reply, self.pa.reply_len):
            # A client may answer on these but not ask for answers there: they map
            # service-import responses across accounts (server/client.go
            # isReservedReply).  Server code publishes with conn None.
            self.conn.reply_violation(
                PyBytes_FromStringAndSize(<const char*>self.pa.reply, self.pa.reply_len))
            return 0
        r = self.lookup(self.pa.subject, self.pa.subject_len)
        for sub in r.psubs:
            if sub.callback is None and (<Conn>sub.client).is_route:
                # Interest on another server: one RMSG per route, whatever the number
                # of matching subscriptions there.
                if self.to_routes and not (<Conn>sub.client).closed:
                    self.route_target(<Conn>sub.client)
                continue
            delivered += self.deliver(sub, msg)
        for group in r.qsubs:
            delivered += self.deliver_to_group(group, msg, self.to_routes)
        if self.rtargets:
            delivered += len(self.rtargets)
            self.send_to_routes(msg)
        if delivered == 0 and self.pa.reply != NULL and self.no_responders:
            self.no_responders_reply()
        return 0

    def publish(self, bytes subject, bytes reply, Py_ssize_t hdr, bytes msg):
        """Fan out a message from server code (imports, $SYS replies) as if this
        connection had published it; the caller flushes ``take_pcd()``.  A subject or
        reply that would break a protocol line raises ``UnsafeSubject``."""
        _check_line_safe(subject)
        _check_line_safe(reply)
        self.pa.subject = <const unsigned char*>PyBytes_AS_STRING(subject)
        self.pa.subject_len = PyBytes_GET_SIZE(subject)
        if reply is not None:
            self.pa.reply = <const unsigned char*>PyBytes_AS_STRING(reply)
            self.pa.reply_len = PyBytes_GET_SIZE(reply)
        else:
            self.pa.reply = NULL
            self.pa.reply_len = 0
        self.pa.account = NULL
        self.pa.queues = NULL
        self.pa.hdr = hdr
        self.pa.size = PyBytes_GET_SIZE(msg)
        self.process_msg(<const unsigned char*>PyBytes_AS_STRING(msg))

    def publish_replies(self, list replies, bytes prefix):
        """Publish each ``(subject, out)`` of ``replies`` with no reply subject and no
        header: ``out`` is the message, or an int ``seq`` sent as ``prefix`` +
        decimal ``seq`` + ``}`` (a stream's PubAcks for a batch, natsjs/jetstream/
        stream.py), formatted here without a Python object per message."""
        cdef Py_ssize_t plen = PyBytes_GET_SIZE(prefix)
        cdef bytearray scratch = bytearray(plen + 24)
        cdef char* buf = PyByteArray_AS_STRING(scratch)
        cdef char* p
        cdef bytes subject
        cdef Py_ssize_t v, nd
        memcpy(buf, PyBytes_AS_STRING(prefix), plen)
        self.pa.reply = NULL
        self.pa.reply_len = 0
        self.pa.account = NULL
        self.pa.queues = NULL
        self.pa.hdr = -1
        for item in replies:
            subject = <bytes>(<tuple>item)[0]
            out = (<tuple>item)[1]
            if not _line_safe(<const unsigned char*>PyBytes_AS_STRING(subject),
                              PyBytes_GET_SIZE(subject)):
                continue    # never a client's reply subject: the parser splits on these
            self.pa.subject = <const unsigned char*>PyBytes_AS_STRING(subject)
            self.pa.subject_len = PyBytes_GET_SIZE(subject)
            if type(out) is int:
                v = out
                nd = _ndigits(v)
                p = _put_int(buf + plen, v, nd)
                p[0] = c'}'
                self.pa.size = plen + nd + 1
                self.process_msg(<const unsigned char*>buf)
            else:
                self.pa.size = PyBytes_GET_SIZE(<bytes>out)
                self.process_msg(<const unsigned char*>PyBytes_AS_STRING(<bytes>out))

    def publish_deliver(self, bytes subject, bytes shown, bytes reply, Py_ssize_t hdr,
                        bytes msg):
        """Publish on ``subject`` a message subscribers see as ``shown`` (a JetStream
        delivery: routed by the deliver or inbox subject, shown with the stored
        message's subject).  Routes get the reply as ``reply@shown`` so the server
        on the other side can do the same (server/client.go processMsgResults)."""
        _check_line_safe(shown)
        self.dsubj = <const unsigned char*>PyBytes_AS_STRING(shown)
        self.dsubj_len = PyBytes_GET_SIZE(shown)
        try:
            self.publish(subject, reply, hdr, msg)
        finally:
            self.dsubj = NULL
            self.route_reply = None

    cdef int route_queue(self, Conn route, bytes queue) except -1:
        """A member on another server was picked: that server delivers to one of its
        members of the group (the queue name rides along in the RMSG)."""
        # The index first: route_target makes the lists on a message's first route.
        cdef Py_ssize_t i = self.route_target(route)
        cdef bytearray q = <bytearray>self.rqueues[i]
        if len(q):
            q += b" "
        q += queue
        return 0

    cdef Py_ssize_t route_target(self, Conn route) except -1:
        """Index of ``route``'s server among this message's route targets (added if
        new).  While interest moves from one connection to another (a reload that
        pins an account or resizes the pool, natsjs/cluster.py) the peer's
        subscriptions sit on both for a moment; the first one found carries it."""
        cdef Py_ssize_t i, n
        cdef object peer = (<RouteCore>route).peer
        if self.rtargets is None:
            self.rtargets = []
            self.rqueues = []
        n = len(self.rtargets)
        for i in range(n):
            if (<RouteCore>self.rtargets[i]).peer is peer:
                return i
        self.rtargets.append(route)
        if n < len(self.rqueues):
            del (<bytearray>self.rqueues[n])[:]
        else:
            self.rqueues.append(bytearray())
        return n

    cdef int send_to_routes(self, const unsigned char* msg) except -1:
        cdef Py_ssize_t i
        cdef RouteCore route
        cdef bytearray q
        cdef bytes acc = self.account_name
        cdef const unsigned char* reply = self.pa.reply
        cdef Py_ssize_t rlen = self.pa.reply_len if self.pa.reply != NULL else -1
        if self.dsubj != NULL and self.pa.reply != NULL:
            # A JetStream delivery: the other server shows the stored subject, which
            # rides after the reply (server/client.go: reply@subject).
            self.route_reply = PyBytes_FromStringAndSize(<const char*>self.pa.reply,
                                                         self.pa.reply_len) + b"@" + \
                PyBytes_FromStringAndSize(<const char*>self.dsubj, self.dsubj_len)
            reply = <const unsigned char*>PyBytes_AS_STRING(self.route_reply)
            rlen = PyBytes_GET_SIZE(self.route_reply)
        for i in range(len(self.rtargets)):
            route = <RouteCore>self.rtargets[i]
            q = <bytearray>self.rqueues[i]
            route.write_rmsg(<const unsigned char*>PyBytes_AS_STRING(acc), PyBytes_GET_SIZE(acc),
                             self.pa.subject, self.pa.subject_len,
                             reply, rlen,
                             <const unsigned char*>PyByteArray_AS_STRING(q),
                             PyByteArray_GET_SIZE(q), msg, self.pa.hdr, self.pa.size)
            route.queued(self)
        del self.rtargets[:]
        return 0

    cdef int write_msg(self, Subscription sub,
                       const unsigned char* subj, Py_ssize_t slen,
                       const unsigned char* reply, Py_ssize_t rlen,
                       const unsigned char* msg, Py_ssize_t hdr,
                       Py_ssize_t size) except -1:
        """Append ``MSG subj sid [reply] size`` or ``HMSG ... hdr size`` and the payload."""
        cdef bytes sid = sub.sid
        cdef Py_ssize_t sidlen = PyBytes_GET_SIZE(sid)
        cdef Py_ssize_t nd, hd = 0, total
        cdef char* p
        cdef char* start
        if hdr >= 0 and (hdr == 0 or not self.headers):
            # A client that did not announce headers gets the payload alone, as
            # nats-server strips them for it; an empty header block is no header.
            msg += hdr
            size -= hdr
            hdr = -1
        nd = _ndigits(size)
        total = 4 + slen + 1 + sidlen + 1 + nd + 2 + size + 2
        if rlen >= 0:
            total += rlen + 1
        if hdr >= 0:
            hd = _ndigits(hdr)
            total += 1 + hd + 1
        p = reserve(self.out, total)
        start = p
        if hdr >= 0:
            p = _put(p, b"HMSG ", 5)
        else:
            p = _put(p, b"MSG ", 4)
        p = _put_word(p, subj, slen)
        p = _put_word(p, PyBytes_AS_STRING(sid), sidlen)
        if rlen >= 0:
            p = _put_word(p, reply, rlen)
        p = _put_sizes(p, hdr, hd, size, nd)
        if self.on_trace_out is not None:
            # the callback does not touch self.out, so p stays valid
            self.on_trace_out(PyBytes_FromStringAndSize(start, p - start),
                              PyBytes_FromStringAndSize(<const char*>msg, size))
        _put_payload(p, msg, size)
        self.out_msgs += 1
        self.out_bytes += size
        if self.on_reply is not None and rlen > 0:
            self.on_reply(PyBytes_FromStringAndSize(<const char*>reply, rlen))
        return 0

    cdef int no_responders_reply(self) except -1:
        """Status 503 to the requester's own reply subscription (server/client.go)."""
        cdef bytes reply = PyBytes_FromStringAndSize(<const char*>self.pa.reply, self.pa.reply_len)
        cdef bytes subject = PyBytes_FromStringAndSize(<const char*>self.pa.subject,
                                                       self.pa.subject_len)
        cdef Subscription sub
        cdef SublistResult r = self.sublist.match(reply)
        for sub in r.psubs:
            if sub.client is self:
                hdr = b"NATS/1.0 503\r\nNats-Subject: " + subject + b"\r\n\r\n"
                self.out += b"HMSG %s %s %d %d\r\n%s\r\n" % (reply, sub.sid, len(hdr), len(hdr), hdr)
                self.queued(self)
                return 0
        return 0


cdef class PeerSubs:
    """How many subscriptions a cluster peer holds here, and may hold."""

    def __init__(self, Py_ssize_t limit=0):
        self.count = 0
        self.limit = limit


# A remote queue subscription stands for at most this many members (its weight is
# repeated in match results, natsjs/cluster.py MAX_QUEUE_WEIGHT).
DEF MAX_QUEUE_WEIGHT = 4096


cdef class RouteCore(Conn):
    """A route: RMSG/HMSG in, delivered to local subscribers only (one hop)."""

    def __init__(self, on_op, conn=None, dict sublists=None, Py_ssize_t max_control_line=4096,
                 Py_ssize_t max_payload=1048576, Py_ssize_t max_pending=MAX_PENDING_SIZE):
        Conn.__init__(self, on_op, conn, ROUTER, max_control_line, max_payload, max_pending)
        self.sublists = sublists if sublists is not None else {}
        self.pinned_account = None
        self.headers = True
        self.is_route = True
        self.peer = self
        self.remote_subs = {}
        self.interest_ok = False
        self.peer_subs = None

    # ---- RS+ and RS- (server/route.go processRemoteSub, processRemoteUnsub) ----------

    cdef int control_op(self, int op, const unsigned char* arg, Py_ssize_t n) except -1:
        if not self.interest_ok:
            return 0
        if op == OP_RS_PLUS:
            return self._remote_sub(arg, n)
        if op == OP_RS_MINUS:
            return self._remote_unsub(arg, n)
        return 0

    cdef bytes _interest_key(self, const unsigned char* arg, Py_ssize_t* starts,
                             Py_ssize_t* lens, Py_ssize_t first, Py_ssize_t count):
        """``<account> <subject>[ <queue>]`` from the arguments ``first`` on (the
        account is the pinned one when the line has none)."""
        cdef Py_ssize_t total = 0, k
        cdef bytes key
        cdef char* p
        if self.pinned_account is not None:
            total = PyBytes_GET_SIZE(self.pinned_account) + 1
        for k in range(first, first + count):
            total += lens[k] + 1
        key = PyBytes_FromStringAndSize(NULL, total - 1)
        p = PyBytes_AS_STRING(key)
        if self.pinned_account is not None:
            p = _put_word(p, PyBytes_AS_STRING(self.pinned_account),
                          PyBytes_GET_SIZE(self.pinned_account))
        for k in range(first, first + count):
            if k < first + count - 1:
                p = _put_word(p, arg + starts[k], lens[k])
            else:
                _put(p, arg + starts[k], lens[k])
        return key

    cdef int _remote_sub(self, const unsigned char* arg, Py_ssize_t n) except -1:
        """``RS+ [account] subject [queue weight]``; 0 hands it to Python, which
        reports what is wrong (and handles weight changes and the peer's limit)."""
        cdef Py_ssize_t starts[5]
        cdef Py_ssize_t lens[5]
        cdef Py_ssize_t c, o, weight = 1
        cdef bytes acc, key, queue = None
        cdef Sublist sl
        cdef Subscription sub
        c = split_args(arg, n, starts, lens, 4)
        o = 0 if self.pinned_account is not None else 1
        if c == o + 3:
            weight = parse_size(arg + starts[o + 2], lens[o + 2])
            if weight < 0:
                return 0
            weight = 1 if weight < 1 else (MAX_QUEUE_WEIGHT if weight > MAX_QUEUE_WEIGHT
                                           else weight)
        elif c != o + 1:
            return 0
        acc = self.pinned_account if o == 0 else \
            PyBytes_FromStringAndSize(<const char*>arg + starts[0], lens[0])
        sl = self.sublists.get(acc)
        if sl is None:
            return 0
        key = self._interest_key(arg, starts, lens, 0, c if c == o + 1 else c - 1)
        sub = self.remote_subs.get(key)
        if sub is not None:
            return 1 if c == o + 1 or sub.qweight == weight else 0
        if self.peer_subs is None or self.peer_subs.count >= self.peer_subs.limit:
            return 0
        if c == o + 3:
            queue = PyBytes_FromStringAndSize(<const char*>arg + starts[o + 1], lens[o + 1])
        try:
            self.add_remote(sl, key, PyBytes_FromStringAndSize(<const char*>arg + starts[o],
                                                               lens[o]), queue, weight)
        except ValueError:
            return 0
        return 1

    cdef int _remote_unsub(self, const unsigned char* arg, Py_ssize_t n) except -1:
        """``RS- [account] subject [queue]``."""
        cdef Py_ssize_t starts[4]
        cdef Py_ssize_t lens[4]
        cdef Py_ssize_t c, o
        c = split_args(arg, n, starts, lens, 3)
        o = 0 if self.pinned_account is not None else 1
        if c != o + 1 and c != o + 2:
            return 0
        self.drop_remote(self._interest_key(arg, starts, lens, 0, c))
        return 1

    cpdef Subscription add_remote(self, Sublist sl, bytes key, bytes subject, bytes queue,
                                  int weight):
        """Record the peer's interest ``key`` in ``sl``; ValueError for an invalid
        subject (the checks are the caller's)."""
        cdef Subscription sub = new_sub(subject, queue, key, self, weight)
        sl.insert(sub)
        self.remote_subs[key] = sub
        hold_sub(sub)
        if self.peer_subs is not None:
            self.peer_subs.count += 1
        return sub

    cpdef bint drop_remote(self, bytes key) except -1:
        """Forget the peer's interest ``key``; False if it had none."""
        cdef Subscription sub = self.remote_subs.pop(key, None)
        cdef Sublist sl
        if sub is None:
            return False
        if self.peer_subs is not None:
            self.peer_subs.count -= 1
        sub.closed = True
        release_sub(sub)
        sl = self.sublists.get(key[:key.index(b" ")])
        if sl is not None:
            sl.remove(sub)
        return True

    cdef int process_msg(self, const unsigned char* msg) except -1:
        cdef Sublist sl
        cdef SublistResult r
        cdef Subscription sub
        cdef list group
        cdef bytes acc, qnames
        if self.pinned_account is not None:
            acc = self.pinned_account
            sl = self.sublists.get(acc)
        else:
            acc = self.last_acc
            if acc is not None and PyBytes_GET_SIZE(acc) == self.pa.account_len and \
                    memcmp(PyBytes_AS_STRING(acc), self.pa.account, self.pa.account_len) == 0 \
                    and self.sublists.get(acc) is self.last_acc_sl:
                sl = self.last_acc_sl
            else:
                acc = PyBytes_FromStringAndSize(<const char*>self.pa.account,
                                                self.pa.account_len)
                sl = self.sublists.get(acc)
                self.last_acc = acc
                self.last_acc_sl = sl
        self.in_msgs += 1
        self.in_bytes += self.pa.size
        if sl is None:
            return 0   # an account this server does not have: nobody here to deliver to
        r = self.match_cached(sl, self.pa.subject, self.pa.subject_len)
        self.dsubj = NULL
        if self.pa.reply != NULL and self.pa.reply_len > 8 and \
                memcmp(self.pa.reply, b"$JS.ACK.", 8) == 0:
            self._remap_js_reply()
        for sub in r.psubs:
            # One hop: what came from a route goes to local subscribers only.
            if sub.callback is None and (<Conn>sub.client).is_route:
                continue
            self.deliver(sub, msg)
        if self.pa.queues == NULL or not r.qsubs:
            self.dsubj = NULL
            return 0
        qnames = PyBytes_FromStringAndSize(<const char*>self.pa.queues, self.pa.queues_len)
        names = qnames.split()
        for group in r.qsubs:
            if (<Subscription>group[0]).queue in names:
                self.deliver_to_group(group, msg, False)
        self.dsubj = NULL
        return 0

    cdef int _remap_js_reply(self) except -1:
        """``$JS.ACK.<8 tokens>@<subject>``: a JetStream delivery from another server;
        the part after ``@`` is the subject to show (server/client.go jsAckDeliverIdx)."""
        cdef Py_ssize_t i, dots = 0
        cdef const unsigned char* r = self.pa.reply
        for i in range(self.pa.reply_len):
            if r[i] == c'.':
                dots += 1
            elif r[i] == c'@' and dots >= 8:
                if i + 1 < self.pa.reply_len:
                    self.dsubj = r + i + 1
                    self.dsubj_len = self.pa.reply_len - i - 1
                    self.pa.reply_len = i
                return 0
        return 0

    cdef int write_rmsg(self, const unsigned char* acc, Py_ssize_t alen,
                        const unsigned char* subj, Py_ssize_t slen,
                        const unsigned char* reply, Py_ssize_t rlen,
                        const unsigned char* queues, Py_ssize_t qlen,
                        const unsigned char* msg, Py_ssize_t hdr,
                        Py_ssize_t size) except -1:
        """``RMSG [acc] subj [+ reply q.. | q.. | reply] size`` (HMSG: ``hdr size``)."""
        cdef Py_ssize_t nd = _ndigits(size), hd = 0, total
        cdef char* p
        cdef bint with_acc = self.pinned_account is None
        total = 5 + slen + 1 + nd + 2 + size + 2
        if with_acc:
            total += alen + 1
        if qlen > 0:
            total += 2 + qlen + 1          # "+ " or "| " and the names
            if rlen >= 0:
                total += rlen + 1
        elif rlen >= 0:
            total += rlen + 1
        if hdr >= 0:
            hd = _ndigits(hdr)
            total += hd + 1
        p = reserve(self.out, total)
        p = _put(p, b"HMSG " if hdr >= 0 else b"RMSG ", 5)
        if with_acc:
            p = _put_word(p, acc, alen)
        p = _put_word(p, subj, slen)
        if qlen > 0:
            p = _put_word(p, b"+" if rlen >= 0 else b"|", 1)
            if rlen >= 0:
                p = _put_word(p, reply, rlen)
            p = _put_word(p, queues, qlen)
        elif rlen >= 0:
            p = _put_word(p, reply, rlen)
        p = _put_sizes(p, hdr, hd, size, nd)
        _put_payload(p, msg, size)
        self.out_msgs += 1
        self.out_bytes += size
        return 0

    cpdef send_rmsg(self, bytes account, bytes subject, bytes reply, bytes queues,
                    Py_ssize_t hdr, bytes msg):
        """Forward one message from server code (Server.deliver); no flush."""
        self.write_rmsg(<const unsigned char*>PyBytes_AS_STRING(account), PyBytes_GET_SIZE(account),
                        <const unsigned char*>PyBytes_AS_STRING(subject), PyBytes_GET_SIZE(subject),
                        <const unsigned char*>PyBytes_AS_STRING(reply) if reply is not None else NULL,
                        PyBytes_GET_SIZE(reply) if reply is not None else -1,
                        <const unsigned char*>PyBytes_AS_STRING(queues) if queues else NULL,
                        PyBytes_GET_SIZE(queues) if queues else 0,
                        <const unsigned char*>PyBytes_AS_STRING(msg), hdr, PyBytes_GET_SIZE(msg))
