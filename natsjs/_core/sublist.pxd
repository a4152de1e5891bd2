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
    cdef dict nodes                  # token -> _Node
    cdef _Node pwc
    cdef _Node fwc
    cdef Py_ssize_t num_nodes(self)


cdef class _Node:
    cdef _Level next
    cdef dict psubs                  # Subscription -> None (ordered set)
    cdef dict qsubs                  # queue name -> {Subscription: None}
    cdef bint is_empty(self)


cdef class Sublist:
    cdef _Level root
    cdef dict cache
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
    cdef void _invalidate(self, bytes subject, bint literal)


cdef bint literal_ok(const unsigned char* p, Py_ssize_t n) noexcept nogil
