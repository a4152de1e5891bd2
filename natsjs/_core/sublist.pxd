# Declarations for the subject trie (see sublist.pyx).

cdef class Subscription:
    cdef public bytes subject
    cdef public bytes queue          # None for a plain subscription
    cdef public bytes sid
    # Where matching messages go: a connection core (fanout.Conn) for clients and
    # routes, or None for an internal subscriber, which has ``callback`` instead.
    cdef public object client
    cdef public object callback
    # An internal subscriber's owner binding: owner.handler_failed(sub, subject,
    # reply, exc) is told when ``callback`` raises (natsjs/server.py).
    cdef public object owner
    cdef public long long max_msgs   # 0: no auto-unsubscribe limit
    cdef public long long nmsgs
    cdef public int qweight          # queue weight of a remote (route) queue sub
    cdef public bint closed


cdef class SublistResult:
    cdef public list psubs           # [Subscription]
    cdef public list qsubs           # [[Subscription]], one list per queue group


cdef class _Level:
    cdef dict nodes                  # token -> _Node, or the lone Subscription there
    cdef _Node pwc
    cdef _Node fwc
    cdef Py_ssize_t num_nodes(self)


cdef class _Node:
    cdef _Level next
    cdef dict psubs                  # Subscription -> None (ordered set), or None
    cdef dict qsubs                  # queue name -> {Subscription: None}, or None
    cdef bint is_empty(self)


cdef class Sublist:
    cdef _Level root
    cdef dict cache
    cdef dict seen                   # subjects matched once, not cached yet
    cdef public unsigned long long genid
    cdef public Py_ssize_t count
    cdef public Py_ssize_t cache_max
    cdef public unsigned long long matches
    cdef public unsigned long long cache_hits
    cdef public unsigned long long inserts
    cdef public unsigned long long removes
    cpdef insert(self, Subscription sub)
    cpdef bint remove(self, Subscription sub)
    cpdef SublistResult match(self, bytes subject)
    cdef void _added(self, bytes subject, bint literal)
    cdef void _removed(self, bytes subject, bint literal)
    cdef void _prune(self, list path)
    cdef void _invalidate(self, bytes subject, bint literal)


cdef bint literal_ok(const unsigned char* p, Py_ssize_t n) noexcept nogil


# A client's or a route's subscription is referenced by its connection and by the trie
# for as long as it is registered; while it is, the cyclic GC has nothing to find in it,
# so it is taken out of the GC's lists (as CPython does for tuples and dicts that hold
# no containers) and put back when it leaves them.  Full collections then cost nothing
# per subscription.  A subscription that left must be released again, or the
# connection it points to could never be collected.
cdef extern from "Python.h":
    void PyObject_GC_Track(void* op)
    void PyObject_GC_UnTrack(void* op)
    int PyObject_GC_IsTracked(object op)


cdef inline void hold_sub(Subscription sub) noexcept:
    if PyObject_GC_IsTracked(sub):
        PyObject_GC_UnTrack(<void*>sub)


cdef inline void release_sub(Subscription sub) noexcept:
    if not PyObject_GC_IsTracked(sub):
        PyObject_GC_Track(<void*>sub)


cdef inline Subscription new_sub(bytes subject, bytes queue, bytes sid, object client,
                                 int qweight):
    """A connection's subscription, without the Python call of the constructor."""
    cdef Subscription sub = Subscription.__new__(Subscription)
    sub.subject = subject
    sub.queue = queue
    sub.sid = sid
    sub.client = client
    sub.qweight = qweight
    return sub
