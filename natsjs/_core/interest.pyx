# cython: language_level=3
"""Local interest as routes see it: what a cluster peer must be told when subscriptions
come and go.

Before it: a client's SUB or UNSUB changed its account's sublist (fanout.pyx handles
them in C and gathers the changes of a read batch; natsjs/client.py hands them on).
After it: natsjs/cluster.py sends the RS+/RS- lines built here to the connections that
carry the account to each peer.

An account counts its local subscriptions per subject (plain) and per subject and
queue group (server/route.go ``acc.rm``).  A plain subject is announced when its count
goes from 0 to 1 and withdrawn when it drops back to 0; a queue group is announced
with its count on every change (the weight a peer gives it when it picks a member).
The map's keys are the subject itself for plain interest and ``(subject, queue)`` for a
queue group, so a plain subscription costs the map one entry and no new object.

Everything here works on whole batches, so a client that subscribes to 200,000
subjects in one go costs one Python call per read, not one per subscription.
"""
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.string cimport memcpy

from natsjs._core.sublist cimport Subscription


cdef inline int _put(bytearray out, const char* p, Py_ssize_t n) except -1:
    cdef Py_ssize_t old = PyByteArray_GET_SIZE(out)
    PyByteArray_Resize(out, old + n)
    memcpy(PyByteArray_AS_STRING(out) + old, p, n)
    return 0


cdef inline int _put_bytes(bytearray out, bytes b) except -1:
    return _put(out, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))


cdef int _line(bytearray out, bint add, bytes prefix, bytes subject, bytes queue,
               Py_ssize_t n) except -1:
    """``RS+ [acc ]subject[ queue n]`` or ``RS- [acc ]subject[ queue]``."""
    cdef bytes weight
    _put(out, b"RS+ " if add else b"RS- ", 4)
    _put_bytes(out, prefix)
    _put_bytes(out, subject)
    if queue is not None:
        _put(out, b" ", 1)
        _put_bytes(out, queue)
        if add:
            weight = b" %d" % n
            _put_bytes(out, weight)
    _put(out, b"\r\n", 2)
    return 0


cpdef list count_interest(dict rm, list subs, int delta):
    """Count ``subs`` (all added, ``delta`` 1, or all removed, -1) in ``rm``.

    Returns the subscriptions routes must hear about: plain ones whose subject's count
    went from 0 to 1 (or back to 0), and one per queue group that changed.
    """
    cdef list changed = []
    cdef set groups = None
    cdef Subscription sub
    cdef object key, have
    cdef Py_ssize_t n
    for sub in subs:
        key = sub.subject if sub.queue is None else (sub.subject, sub.queue)
        have = rm.get(key)
        n = (0 if have is None else <Py_ssize_t>have) + delta
        if n > 0:
            rm[key] = n
        elif have is not None:
            del rm[key]
            n = 0
        else:
            n = 0
        if sub.queue is None:
            if (delta > 0 and n == 1) or (delta < 0 and n == 0):
                changed.append(sub)
        else:
            if groups is None:
                groups = set()
            if key not in groups:
                groups.add(key)
                changed.append(sub)
    return changed


cpdef bytearray interest_lines(list subs, dict rm, bytes prefix, int delta):
    """The RS+/RS- lines for ``subs`` as ``count_interest`` returned them; ``prefix``
    is ``b"<account> "``, or empty on a connection dedicated to the account."""
    cdef bytearray out = bytearray()
    cdef Subscription sub
    cdef object have
    for sub in subs:
        if sub.queue is None:
            _line(out, delta > 0, prefix, sub.subject, None, 0)
        else:
            have = rm.get((sub.subject, sub.queue))
            _line(out, have is not None, prefix, sub.subject, sub.queue,
                  0 if have is None else <Py_ssize_t>have)
    return out


cpdef bytearray rm_lines(dict rm, bytes prefix, bint add):
    """Every local interest of an account as RS+ lines (``add``), or its withdrawal
    as RS- lines: what a connection that starts or stops carrying the account gets."""
    cdef bytearray out = bytearray()
    cdef object key, n
    for key, n in rm.items():
        if type(key) is bytes:
            _line(out, add, prefix, <bytes>key, None, 0)
        else:
            _line(out, add, prefix, <bytes>(<tuple>key)[0], <bytes>(<tuple>key)[1],
                  <Py_ssize_t>n)
    return out


def rm_items(dict rm):
    """``(subject, queue, count)`` for every entry of ``rm`` (queue None when plain)."""
    for key, n in rm.items():
        if type(key) is bytes:
            yield key, None, n
        else:
            yield key[0], key[1], n
