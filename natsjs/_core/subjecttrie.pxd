# Declarations for the configuration-check subject set (see subjecttrie.pyx).

cdef class _TNode:
    cdef dict children               # token -> _TNode (None: a leaf)
    cdef list star                   # children whose token starts with '*' (or None)
    cdef list wild                   # ... with '*' or '>' (or None)
    cdef _TNode pwc                  # the child of the token '*', or None
    cdef _TNode fwc                  # the child of the token '>', or None
    cdef Py_ssize_t term             # position of the subject ending here, or NONE
    cdef Py_ssize_t below1           # least position of the subjects ending deeper
    cdef Py_ssize_t below2           # the next least (to leave one position out)
    cdef bint via_fwc                # reached through a '>' token
    cdef Py_ssize_t least(self)
    cdef void note_below(self, Py_ssize_t pos)
    cdef Py_ssize_t below_except(self, Py_ssize_t exclude)


cdef class SubjectTrie:
    cdef _TNode lit_root             # subjects without a '*' or '>' token
    cdef _TNode wc_root              # subjects with one
    cdef dict positions              # subject -> its position
