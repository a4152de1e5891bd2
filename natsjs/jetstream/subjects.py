"""Subject algebra for JetStream configuration: validity, overlap and containment.

Streams may not capture overlapping subjects, consumer filters must fall inside their
stream's subjects, and KV/objects rely on ``>`` tails; these are the relations
nats-server uses for those checks (server/sublist.go SubjectsCollide,
subjectIsSubsetMatch, IsValidSubject).  Matching a published subject against a
filter on the hot path stays in Cython (natsjs/_core/sublist.pyx subject_matches).
"""
from __future__ import annotations

from natsjs._core.sublist import subject_matches  # noqa: F401  (re-exported)
from natsjs._core.subjecttrie import SubjectTrie
from natsjs.jetstream.names import valid_publish_subject, valid_subject  # noqa: F401


def tokens(subject: str) -> list[str]:
    return subject.split(".")


def is_literal(subject: str) -> bool:
    return all(t not in ("*", ">") for t in tokens(subject))


def subjects_collide(a: str, b: str) -> bool:
    """True if some literal subject could match both ``a`` and ``b``: nats-server's
    SubjectsCollide (server/sublist.go), quirks included (see _core/subjecttrie.pyx:
    two wildcard subjects compare tokens by their first character, so ``*x.*``
    collides with ``y.*``).  Either may be invalid; nats-server compares a stream's
    later subjects before it has validated them."""
    if a == b:
        return True
    ta, tb = tokens(a), tokens(b)
    wa, fa = "*" in ta, ">" in ta
    wb, fb = "*" in tb, ">" in tb
    lit_a, lit_b = not (wa or fa), not (wb or fb)
    if lit_a and lit_b:
        return False
    if lit_a:
        return _subset_tokens(ta, tb)
    if lit_b:
        return _subset_tokens(tb, ta)
    la, lb = len(ta), len(tb)
    if la != lb and ((la < lb and not fa) or (lb < la and not fb)):
        return False
    for x, y in zip(ta, tb):
        if not x or not y:
            return False
        if x[0] in "*>" or y[0] in "*>":
            continue
        if x != y:
            return False
    return True


def subset_match(subject: str, test: str) -> bool:
    """True if every subject matched by ``subject`` is also matched by ``test``:
    nats-server's subjectIsSubsetMatch (server/sublist.go isSubsetMatchTokenized),
    where a token of ``test`` starting with ``*`` takes any token but ``*``/``>``."""
    return _subset_tokens(tokens(subject), tokens(test))


def _subset_tokens(ts: list[str], tt: list[str]) -> bool:
    for i, t in enumerate(tt):
        if i >= len(ts) or not t:
            return False
        if t == ">":
            return True
        s = ts[i]
        if not s or s == ">":
            return False
        if s == "*":
            if t != "*":
                return False
            continue
        if t[0] != "*" and s != t:
            return False
    return len(ts) == len(tt)


# ---- set-wise: what nats-server checks pair by pair -----------------------------------
# The loops below answer exactly what nats-server's nested loops answer (the same
# first offender where the error names it), but each subject walks a SubjectTrie of
# the others instead of meeting each of them: linear for the usual lists, however
# long.  Lists that defeat the trie (wildcards fanning out over many branches) still
# cost less than the pairs; the API runs long checks off the event loop.

def first_overlap(subjects: list[str], upto: int | None = None) -> tuple[int, int] | None:
    """server/stream.go checkStreamCfg's loop over a stream's subjects: the first
    ``i`` (below ``upto``, where that loop stops on an earlier error) for which a later
    subject collides, and the first such later ``j``; None if there is none.  The
    subjects before ``upto`` must be valid and distinct; later ones may be anything."""
    n = len(subjects)
    upto = n if upto is None else min(upto, n)
    trie = SubjectTrie()
    best = upto
    for j, s in enumerate(subjects):
        if j:
            found = trie.first_collision(s, best)
            if found >= 0:
                best = found
        if j < best:
            trie.add(s, j)
    if best >= upto:
        return None
    first = subjects[best]
    return best, next(j for j in range(best + 1, n) if subjects_collide(subjects[j], first))


def any_collide(ours: list[str], theirs) -> bool:
    """Does any of ``ours`` (valid subjects) collide with any of ``theirs`` (an
    iterable of subjects)?  jsAccount.subjectsOverlap: a new stream against the
    others; a work-queue consumer's filters against a sibling's."""
    if not ours:
        return False
    trie = SubjectTrie()
    for i, s in enumerate(ours):
        trie.add(s, i)
    return any(trie.first_collision(s) >= 0 for s in theirs)


def filters_overlap(filters: list[str], upto: int | None = None) -> bool:
    """server/consumer.go checkConsumerCfg's loop over a consumer's filters: is some
    filter before ``upto`` (where that loop stops on an invalid one) a subset of another
    filter of the list?  Filters before ``upto`` must be valid."""
    n = len(filters)
    upto = n if upto is None else min(upto, n)
    trie = SubjectTrie()
    seen: dict[str, int] = {}
    for i, f in enumerate(filters):
        first = seen.setdefault(f, i)
        if first != i and first < upto:
            return True             # a subject is a subset of itself
        if i < upto:
            trie.add(f, i)
    for j, f in enumerate(filters):
        me = seen[f] if seen[f] < upto else -1
        if trie.first_within(f, me) >= 0:
            return True
    return False


def filter_matches(filt: str, subject: str) -> bool:
    """A literal ``subject`` matched by the filter (empty filter: everything)."""
    if not filt or filt == ">":
        return True
    return subject_matches(filt.encode(), subject.encode())
