# cython: language_level=3
"""The subject trie: step 3 of a message's path.

Before it: the parser has recognised a PUB (or a route's RMSG) and the fan-out core
(``fanout.pyx``) asks ``Sublist.match(subject)`` who is interested.  After it: the
fan-out core appends a frame to each subscriber's outbound buffer and picks one
member of each queue group.

Subjects are split on ``.`` into tokens; each level of the trie maps literal tokens
to nodes and keeps the ``*`` (one token) and ``>`` (one or more trailing tokens)
nodes apart, so a match walks one path per wildcard instead of every subscription.
Validity follows nats-server (server/sublist.go IsValidSubject): no empty tokens,
``>`` only as the last token, no whitespace inside a token; a ``*`` or ``>`` that is
part of a longer token is a literal character.

Matches are cached per subject; inserting or removing a subscription drops exactly
the cached subjects it could change (a literal subscription touches one entry, a
wildcard one is checked against each cached subject), and bumps ``genid`` so that
per-connection caches in the fan-out core know to look again.  Results are never
modified after they are built, so a caller may hold one while the trie changes.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

_PWC = b"*"
_FWC = b">"


cdef class Subscription:
    """One interest: a client's SUB, a route's RS+ or an internal subscriber."""

    def __init__(self, bytes subject, bytes queue=None, bytes sid=b"", client=None,
                 callback=None, long long max_msgs=0, int qweight=1, owner=None):
        self.subject = subject
        self.queue = queue if queue else None
        self.sid = sid
        self.client = client
        self.callback = callback
        self.owner = owner
        self.max_msgs = max_msgs
        self.nmsgs = 0
        self.qweight = qweight
        self.closed = False

    def __repr__(self):
        return "Subscription(%r, queue=%r, sid=%r)" % (self.subject, self.queue, self.sid)


cdef class SublistResult:
    def __init__(self, list psubs=None, list qsubs=None):
        self.psubs = psubs if psubs is not None else []
        self.qsubs = qsubs if qsubs is not None else []

    def __len__(self):
        return len(self.psubs) + len(self.qsubs)


cdef class _Level:
    """One token position: literal tokens map to a ``_Node``, or straight to the
    ``Subscription`` when that is the only (plain) subscription there and nothing lies
    below it: a subject that one client subscribes to costs no node of its own."""

    def __cinit__(self):
        self.nodes = {}
        self.pwc = None
        self.fwc = None

    cdef Py_ssize_t num_nodes(self):
        return len(self.nodes) + (self.pwc is not None) + (self.fwc is not None)


cdef class _Node:
    def __cinit__(self):
        self.next = None
        self.psubs = None
        self.qsubs = None

    cdef bint is_empty(self):
        return not self.psubs and not self.qsubs and \
            (self.next is None or self.next.num_nodes() == 0)


cdef inline bint _valid_subject(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i = 0, start = 0, tl
    cdef bint seen_fwc = False
    if n == 0:
        return False
    while i <= n:
        if i == n or p[i] == c'.':
            tl = i - start
            if tl == 0 or seen_fwc:
                return False
            if tl == 1 and p[start] == c'>':
                seen_fwc = True
            start = i + 1
        elif p[i] == c' ' or p[i] == c'\t' or p[i] == c'\r' or p[i] == c'\n' or p[i] == c'\f':
            return False
        i += 1
    return True


def valid_subject(bytes subject):
    """True if ``subject`` may be subscribed to (wildcards allowed)."""
    return _valid_subject(<const unsigned char*>PyBytes_AS_STRING(subject),
                          PyBytes_GET_SIZE(subject))


def valid_literal_subject(bytes subject):
    """True if ``subject`` is valid and has no wildcard tokens (a publish subject)."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(subject)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(subject)
    return literal_ok(p, n) and _valid_subject(p, n)


cdef bint literal_ok(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    """No empty token and no token that is exactly ``*`` or ``>``."""
    cdef Py_ssize_t i = 0, start = 0, tl
    if n == 0:
        return False
    while i <= n:
        if i == n or p[i] == c'.':
            tl = i - start
            if tl == 0:
                return False
            if tl == 1 and (p[start] == c'*' or p[start] == c'>'):
                return False
            start = i + 1
        i += 1
    return True


def subject_is_literal(bytes subject):
    cdef list toks = subject.split(b".")
    return _PWC not in toks and _FWC not in toks


cpdef bint subject_matches(bytes pattern, bytes subject):
    """True if the literal ``subject`` is matched by ``pattern`` (which may have wildcards)."""
    cdef list pt = pattern.split(b".")
    cdef list st = subject.split(b".")
    cdef Py_ssize_t i, np = len(pt), ns = len(st)
    for i in range(np):
        tok = pt[i]
        if tok == _FWC and i == np - 1:
            return ns > i
        if i >= ns:
            return False
        if tok != _PWC and tok != st[i]:
            return False
    return np == ns


cdef void _add_node(_Node node, list psubs, dict groups):
    cdef list g
    cdef Subscription m
    cdef int k
    if node.psubs:
        psubs.extend(node.psubs)
    if node.qsubs:
        for q, members in (<dict>node.qsubs).items():
            g = groups.get(q)
            if g is None:
                g = []
                groups[q] = g
            for m in members:
                # A route's queue subscription stands for ``qweight`` members on the
                # other server; it is listed that many times so that a uniform pick
                # over the group is a fair pick over all members cluster-wide
                # (server/sublist.go addNodeToResults).
                if m.qweight > 1:
                    for k in range(m.qweight):
                        g.append(m)
                else:
                    g.append(m)


cdef void _match_level(_Level level, list toks, Py_ssize_t i, list psubs, dict groups):
    cdef object v
    cdef _Node n = None
    cdef _Node pwc = None
    cdef Py_ssize_t ntoks = len(toks)
    while i < ntoks:
        if level is None:
            return
        if level.fwc is not None:
            _add_node(level.fwc, psubs, groups)
        pwc = level.pwc
        if pwc is not None:
            _match_level(pwc.next, toks, i + 1, psubs, groups)
        v = level.nodes.get(toks[i])
        if type(v) is Subscription:
            # A lone subscription: it matches when this is the last token, and
            # nothing lies below it.
            if i == ntoks - 1:
                psubs.append(v)
                if pwc is not None:
                    _add_node(pwc, psubs, groups)
            return
        n = <_Node>v
        level = n.next if n is not None else None
        i += 1
    if n is not None:
        _add_node(n, psubs, groups)
    if pwc is not None:
        _add_node(pwc, psubs, groups)


cdef void _add_all(_Node node, list out):
    if node.psubs:
        out.extend(node.psubs)
    if node.qsubs:
        for members in (<dict>node.qsubs).values():
            out.extend(members)


cdef inline void _bounded(dict d, Py_ssize_t cap):
    """Make room in ``d``: at ``cap`` entries the oldest quarter goes, rather than
    everything, so hot subjects that are added again stay cheap (nats-server prunes its
    cache in the same spirit)."""
    cdef Py_ssize_t k
    if len(d) < cap:
        return
    for k, s in enumerate(list(d)):
        if k >= cap // 4:
            break
        del d[s]


cdef class Sublist:
    """Subscriptions of one account (or of the server's internal clients)."""

    def __init__(self, Py_ssize_t cache_max=1024):
        self.root = _Level()
        self.cache = {}
        self.seen = {}
        self.genid = 0
        self.count = 0
        self.cache_max = cache_max
        self.matches = 0
        self.cache_hits = 0
        self.inserts = 0
        self.removes = 0

    cpdef insert(self, Subscription sub):
        """Add ``sub``; raises ValueError for an invalid subject."""
        cdef list toks
        cdef _Level level = self.root
        cdef _Node node = None
        cdef Py_ssize_t i, nt
        cdef bint literal = True
        cdef dict members
        cdef bytes subject = sub.subject
        cdef object v
        if not _valid_subject(<const unsigned char*>PyBytes_AS_STRING(subject),
                              PyBytes_GET_SIZE(subject)):
            raise ValueError("invalid subject %r" % subject)
        toks = subject.split(b".")
        nt = len(toks)
        for i in range(nt):
            tok = toks[i]
            if tok == _PWC:
                literal = False
                if level.pwc is None:
                    level.pwc = _Node()
                node = level.pwc
            elif tok == _FWC:
                literal = False
                if level.fwc is None:
                    level.fwc = _Node()
                node = level.fwc
            else:
                v = level.nodes.get(tok)
                if v is None:
                    if i == nt - 1 and sub.queue is None:
                        level.nodes[tok] = sub
                        self._added(subject, literal)
                        return
                    node = _Node()
                    level.nodes[tok] = node
                elif type(v) is Subscription:
                    if v is sub:
                        return
                    # A second interest at this token: the lone subscription gets
                    # the node it did without.
                    node = _Node()
                    node.psubs = {v: None}
                    level.nodes[tok] = node
                else:
                    node = <_Node>v
            if i < nt - 1:
                if node.next is None:
                    node.next = _Level()
                level = node.next
        if sub.queue is None:
            if node.psubs is None:
                node.psubs = {}
            elif sub in node.psubs:
                return
            node.psubs[sub] = None
        else:
            if node.qsubs is None:
                node.qsubs = {}
            members = node.qsubs.get(sub.queue)
            if members is None:
                members = {}
                node.qsubs[sub.queue] = members
            if sub in members:
                return
            members[sub] = None
        self._added(subject, literal)

    cdef void _added(self, bytes subject, bint literal):
        self.count += 1
        self.inserts += 1
        self._invalidate(subject, literal)

    cpdef bint remove(self, Subscription sub):
        """Remove ``sub``; False if it was not there."""
        cdef list toks, path = []
        cdef _Level level = self.root
        cdef _Node node = None
        cdef bint literal = True
        cdef dict members
        cdef Py_ssize_t i, nt
        cdef object v
        if sub.subject is None:
            return False
        toks = sub.subject.split(b".")
        nt = len(toks)
        for i in range(nt):
            tok = toks[i]
            if level is None:
                return False
            if tok == _PWC:
                literal = False
                node = level.pwc
            elif tok == _FWC:
                literal = False
                node = level.fwc
            else:
                v = level.nodes.get(tok)
                if type(v) is Subscription:
                    if v is not sub or i != nt - 1:
                        return False
                    del level.nodes[tok]
                    self._prune(path)
                    self._removed(sub.subject, literal)
                    return True
                node = <_Node>v
            if node is None:
                return False
            path.append((level, node, tok))
            level = node.next
        if sub.queue is None:
            if node.psubs is None or sub not in node.psubs:
                return False
            del node.psubs[sub]
        else:
            members = node.qsubs.get(sub.queue) if node.qsubs is not None else None
            if members is None or sub not in members:
                return False
            del members[sub]
            if not members:
                del node.qsubs[sub.queue]
        self._prune(path)
        self._removed(sub.subject, literal)
        return True

    cdef void _prune(self, list path):
        """Drop the nodes a removal left empty, deepest first."""
        cdef Py_ssize_t i
        cdef _Level level
        cdef _Node node
        for i in range(len(path) - 1, -1, -1):
            level, node, tok = path[i]
            if not node.is_empty():
                break
            if tok == _PWC:
                level.pwc = None
            elif tok == _FWC:
                level.fwc = None
            else:
                del level.nodes[tok]

    cdef void _removed(self, bytes subject, bint literal):
        self.count -= 1
        self.removes += 1
        self._invalidate(subject, literal)

    cdef void _invalidate(self, bytes subject, bint literal):
        self.genid += 1
        if not self.cache:
            return
        if literal:
            self.cache.pop(subject, None)
            return
        stale = [s for s in self.cache if subject_matches(subject, s)]
        for s in stale:
            del self.cache[s]

    cpdef SublistResult match(self, bytes subject):
        """Everything interested in the literal ``subject``."""
        cdef SublistResult r
        cdef list psubs
        cdef dict groups
        cdef Py_ssize_t k
        self.matches += 1
        r = self.cache.get(subject)
        if r is not None:
            self.cache_hits += 1
            return r
        psubs = []
        groups = {}
        _match_level(self.root, subject.split(b"."), 0, psubs, groups)
        r = SublistResult(psubs, list(groups.values()))
        # A result is cached the second time its subject is matched.  Subjects seen
        # once are mostly unique (reply inboxes: every request, every PubAck); caching
        # them would keep each result alive through the young collections only to be
        # pruned from the old generation later, which with one per message is where a
        # route's time went.  ``seen`` holds bytes only, which the collector ignores.
        if self.seen.pop(subject, 0) is None:
            _bounded(self.cache, self.cache_max)
            self.cache[subject] = r
        else:
            _bounded(self.seen, self.cache_max)
            self.seen[subject] = None
        return r

    def subscriptions(self):
        """Every subscription, in no particular order (for monitoring and route sync)."""
        cdef list out = []
        cdef list stack = [self.root]
        cdef _Level level
        cdef _Node node
        while stack:
            level = <_Level>stack.pop()
            for v in level.nodes.values():
                if type(v) is Subscription:
                    out.append(v)
                    continue
                node = <_Node>v
                _add_all(node, out)
                if node.next is not None:
                    stack.append(node.next)
            for node in (level.pwc, level.fwc):
                if node is not None:
                    _add_all(node, out)
                    if node.next is not None:
                        stack.append(node.next)
        return out

    def clear(self):
        """Forget every subscription (a server that has stopped)."""
        self.root = _Level()
        self.cache = {}
        self.seen = {}
        self.genid += 1
        self.count = 0

    def cache_size(self):
        return len(self.cache)

    def stats(self):
        """Counters with nats-server's /subsz names.

        Fan-out is measured over the cached results, as nats-server does
        (server/sublist.go Stats): how many subscriptions and queue groups a match
        reaches, at most and on average.
        """
        cdef SublistResult r
        cdef Py_ssize_t fan, max_fan = 0, total = 0
        for r in self.cache.values():
            fan = len(r.psubs) + len(r.qsubs)
            total += fan
            if fan > max_fan:
                max_fan = fan
        return {
            "num_subscriptions": self.count,
            "num_cache": len(self.cache),
            "num_inserts": self.inserts,
            "num_removes": self.removes,
            "num_matches": self.matches,
            "cache_hit_rate": (self.cache_hits / self.matches) if self.matches else 0.0,
            "max_fanout": max_fan,
            "avg_fanout": (<double>total / len(self.cache)) if self.cache else 0.0,
        }
