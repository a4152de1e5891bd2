# cython: language_level=3
"""A set of subjects that answers nats-server's configuration relations set-wise.

Not on a message's path: this is what JetStream's configuration checks use before a
stream or consumer exists (natsjs/jetstream/subjects.py drives it).  A stream's own
subjects must not collide with each other nor with another stream's, a consumer's
filters must not contain one another, a work-queue consumer's filters must not
collide with its siblings'.  nats-server checks every pair (server/stream.go
checkStreamCfg, server/consumer.go checkConsumerCfg); one request with 10,000 subjects
is then 50 million comparisons.  Here the subjects of one side go into a trie and each
subject of the other side walks it: a literal token follows one branch, a wildcard
fans out, and every node knows the least position stored beneath it, so a walk that
only wants the first offender skips whatever cannot beat what it has.

The relations are nats-server's, quirks included (server/sublist.go):

- ``SubjectsCollide(a, b)``: equal strings collide; two literals only if equal; a
  literal and a wildcard subject by ``isSubsetMatchTokenized`` (the literal inside
  the wildcard one); two wildcard subjects when their lengths fit (equal, or the
  shorter has a ``>`` token) and each token pair ``tokensCanMatch``: non-empty, and
  equal or either starting with ``*`` or ``>``.  "Literal" and "wildcard" are decided
  by whole tokens ``*`` and ``>``, but ``tokensCanMatch`` looks at first characters
  only, so ``*x.*`` collides with ``y.*`` and not with ``y.a``.
- ``subjectIsSubsetMatch(s, t)``: walking ``t``'s tokens, a ``>`` takes the rest of
  ``s`` if any is left, a token starting with ``*`` takes any token of ``s`` except
  ``*`` and ``>`` (a lone ``*`` also takes ``*``), anything else must be equal, and the
  lengths must end together.

The stored subjects must be valid (nats-server IsValidSubject: no empty tokens, ``>``
only last): the walks rely on it.  A query may be any string, valid or not, because
nats-server compares subjects it has not validated yet (a stream's later subjects
against an earlier one).  The walks keep their own stack, so a subject of a million
tokens costs memory, not the C stack.
"""
cimport cython
from cpython.long cimport PyLong_FromSsize_t

cdef Py_ssize_t NONE = 0x7FFFFFFFFFFFFFFF    # no position: larger than any


# The trie has no cycles (a node refers to its children only), and a request builds up
# to a few hundred thousand nodes: untracked by the cyclic garbage collector, they do
# not make its passes grow with them.  Leaves, most of the nodes, get no containers.
@cython.no_gc
@cython.final
cdef class _TNode:
    def __cinit__(self):
        self.children = None
        self.star = None
        self.wild = None
        self.pwc = None
        self.fwc = None
        self.term = NONE
        self.below1 = NONE
        self.below2 = NONE
        self.via_fwc = False

    cdef inline Py_ssize_t least(self):
        return self.term if self.term < self.below1 else self.below1

    cdef inline void note_below(self, Py_ssize_t pos):
        if pos < self.below1:
            self.below2 = self.below1
            self.below1 = pos
        elif pos != self.below1 and pos < self.below2:
            self.below2 = pos

    cdef inline Py_ssize_t below_except(self, Py_ssize_t exclude):
        return self.below2 if self.below1 == exclude else self.below1


cdef inline bint _is_wildcard_subject(list toks):
    cdef str t
    for t in toks:
        if t == "*" or t == ">":
            return True
    return False


cdef class SubjectTrie:
    """Valid subjects, each with a position (its index in a config's list).  A subject
    added again keeps the position it was first added with."""

    def __cinit__(self):
        self.lit_root = _TNode()
        self.wc_root = _TNode()
        self.positions = {}

    def __len__(self):
        return len(self.positions)

    def add(self, str subject, Py_ssize_t pos):
        """Store a valid ``subject`` at ``pos`` (>= 0)."""
        cdef list toks = subject.split(".")
        cdef _TNode node, child
        cdef str t
        cdef object known
        if pos < 0:
            raise ValueError("negative position")
        if subject in self.positions:
            return
        self.positions[subject] = PyLong_FromSsize_t(pos)
        node = self.wc_root if _is_wildcard_subject(toks) else self.lit_root
        for t in toks:
            node.note_below(pos)
            if node.children is None:
                node.children = {}
            child = node.children.get(t)
            if child is None:
                child = _TNode()
                node.children[t] = child
                if t[0] == "*" or t[0] == ">":
                    if node.wild is None:
                        node.wild = []
                    node.wild.append(child)
                    if t[0] == "*":
                        if node.star is None:
                            node.star = []
                        node.star.append(child)
                    if t == "*":
                        node.pwc = child
                    elif t == ">":
                        node.fwc = child
                        child.via_fwc = True
            node = child
        node.term = pos

    def position(self, str subject):
        """The position ``subject`` itself was stored at, or -1."""
        return self.positions.get(subject, -1)

    def first_collision(self, str query, Py_ssize_t bound=NONE):
        """The least position below ``bound`` of a stored subject that collides with
        ``query`` (nats-server SubjectsCollide), or -1."""
        cdef list toks = query.split(".")
        cdef Py_ssize_t lq = len(toks)
        cdef Py_ssize_t best = bound
        cdef object known
        if not _is_wildcard_subject(toks):
            # Two literal subjects collide only when equal.
            known = self.positions.get(query)
            if known is not None and <Py_ssize_t>known < best:
                best = <Py_ssize_t>known
            best = _literal_vs_wildcards(self.wc_root, toks, lq, best)
        else:
            best = _within(self.lit_root, toks, lq, best, -1)
            best = _wildcards_vs_wildcards(self.wc_root, toks, lq, ">" in toks, best)
        return best if best < bound else -1

    def first_within(self, str query, Py_ssize_t exclude=-1, Py_ssize_t bound=NONE):
        """The least position below ``bound``, other than ``exclude``, of a stored
        subject ``s`` with subjectIsSubsetMatch(s, query), or -1."""
        cdef list toks = query.split(".")
        cdef Py_ssize_t lq = len(toks)
        cdef Py_ssize_t best = _within(self.lit_root, toks, lq, bound, exclude)
        best = _within(self.wc_root, toks, lq, best, exclude)
        return best if best < bound else -1


cdef Py_ssize_t _literal_vs_wildcards(_TNode root, list toks, Py_ssize_t lq,
                                      Py_ssize_t best):
    """A query without ``*``/``>`` tokens against stored wildcard subjects: the query
    must lie inside the stored one (isSubsetMatchTokenized(query, stored))."""
    cdef list stack = [(root, 0)]
    cdef _TNode node, c
    cdef Py_ssize_t i
    cdef str t
    while stack:
        node, i = stack.pop()
        if node.least() >= best:
            continue
        if i == lq:
            if node.term < best:
                best = node.term
            continue
        # A stored '>' here takes the rest, even an empty token of the query.
        if node.fwc is not None and node.fwc.term < best:
            best = node.fwc.term
        t = toks[i]
        if not t or node.children is None:
            continue
        if node.star is not None:
            for c in node.star:          # '*' and '*x' take any token
                stack.append((c, i + 1))
        if t[0] != "*":
            c = node.children.get(t)
            if c is not None and c is not node.fwc:
                stack.append((c, i + 1))
    return best


cdef Py_ssize_t _within(_TNode root, list toks, Py_ssize_t lq, Py_ssize_t best,
                        Py_ssize_t exclude):
    """Stored subjects ``s`` with isSubsetMatchTokenized(s, query): the query is the
    pattern, walked token by token."""
    cdef list stack = [(root, 0)]
    cdef _TNode node, c
    cdef Py_ssize_t i, b
    cdef str t
    cdef object child
    while stack:
        node, i = stack.pop()
        if node.least() >= best:
            continue
        if i == lq:
            if node.term < best and node.term != exclude:
                best = node.term
            continue
        t = toks[i]
        if not t or node.children is None:
            continue
        if t == ">":
            b = node.below_except(exclude)
            if b < best:
                best = b
            continue
        if t[0] == "*":
            # '*' takes '*' and any literal; '*x' takes literals only; neither '>'.
            for child in node.children.values():
                c = <_TNode>child
                if c is node.fwc or (c is node.pwc and t != "*"):
                    continue
                stack.append((c, i + 1))
        else:
            c = node.children.get(t)
            if c is not None:
                stack.append((c, i + 1))
    return best


cdef Py_ssize_t _wildcards_vs_wildcards(_TNode root, list toks, Py_ssize_t lq, bint qfwc,
                                        Py_ssize_t best):
    """A query with a ``*``/``>`` token against stored wildcard subjects: lengths fit
    and every token pair can match (tokensCanMatch)."""
    cdef list stack = [(root, 0)]
    cdef _TNode node, c
    cdef Py_ssize_t i
    cdef str t
    cdef object child
    while stack:
        node, i = stack.pop()
        if node.least() >= best:
            continue
        # A stored subject ending here is as long as the query, or shorter and ends
        # in '>'.
        if node.term < best and (i == lq or node.via_fwc):
            best = node.term
        if i == lq:
            # Longer stored subjects fit only if the query has a '>' token.
            if qfwc and node.below1 < best:
                best = node.below1
            continue
        t = toks[i]
        if not t or node.children is None:
            continue
        if t[0] == "*" or t[0] == ">":
            for child in node.children.values():
                stack.append((<_TNode>child, i + 1))
        else:
            if node.wild is not None:
                for c in node.wild:
                    stack.append((c, i + 1))
            c = node.children.get(t)
            if c is not None:
                stack.append((c, i + 1))
    return best
