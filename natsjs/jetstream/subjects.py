"""Subject algebra for JetStream configuration: validity, overlap and containment.

Streams may not capture overlapping subjects, consumer filters must fall inside their
stream's subjects, and KV/objects rely on ``>`` tails; these are the relations
nats-server uses for those checks (server/sublist.go SubjectsCollide,
subjectIsSubsetMatch, IsValidSubject).  Matching a published subject against a
filter on the hot path stays in Cython (natsjs/_core/sublist.pyx subject_matches).
"""
from __future__ import annotations

from natsjs._core.sublist import subject_matches  # noqa: F401  (re-exported)
from natsjs.jetstream.names import valid_publish_subject, valid_subject  # noqa: F401


def tokens(subject: str) -> list[str]:
    return subject.split(".")


def is_literal(subject: str) -> bool:
    return all(t not in ("*", ">") for t in tokens(subject))


def subjects_collide(a: str, b: str) -> bool:
    """True if some literal subject matches both ``a`` and ``b``."""
    if a == b:
        return True
    ta, tb = tokens(a), tokens(b)
    la, lb = len(ta), len(tb)
    for i in range(min(la, lb)):
        x, y = ta[i], tb[i]
        if x == ">" or y == ">":
            return True
        if x != y and x != "*" and y != "*":
            return False
    if la == lb:
        return True
    # Different lengths: only a '>' right after the shorter one's end could join them.
    longer = ta if la > lb else tb
    shorter_len = min(la, lb)
    return longer[shorter_len - 1] == ">" if shorter_len else False


def subset_match(subject: str, test: str) -> bool:
    """True if every subject matched by ``subject`` is also matched by ``test``."""
    ts, tt = tokens(subject), tokens(test)
    for i, t in enumerate(tt):
        if t == ">":
            return len(ts) > i
        if i >= len(ts):
            return False
        s = ts[i]
        if s == ">":
            return False
        if t == "*":
            continue
        if s == "*" or s != t:
            return False
    return len(ts) == len(tt)


def filter_matches(filt: str, subject: str) -> bool:
    """A literal ``subject`` matched by the filter (empty filter: everything)."""
    if not filt or filt == ">":
        return True
    return subject_matches(filt.encode(), subject.encode())
