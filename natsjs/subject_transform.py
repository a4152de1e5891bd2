"""Subject transforms: map a literal subject matched by a source pattern to a destination.

Where they apply: a stream's ``subject_transform`` rewrites each captured subject before
anything else looks at the message (natsjs/jetstream/stream.py), mirrors and sources
rewrite what they take from their origin (natsjs/jetstream/sourcing.py), and republish
builds the subject it publishes to.  Account subject mappings use the same language.

The destination language is nats-server's (server/subject_transform.go): a token may be
a literal, ``$N`` or ``{{wildcard(N)}}`` (the N-th ``*`` of the source), or one of the
functions ``partition(n[, N...])`` (FNV-1a hash of the chosen wildcard tokens, or of
the whole subject, modulo n), ``split(N, sep)``, ``splitfromleft/right(N, pos)``,
``slicefromleft/right(N, size)``, ``left/right(N, len)`` and ``random(n)``; a ``>`` in
the destination takes the rest of the subject.  Function names are case-insensitive
in their first letters as in the reference, and its error texts are kept because
clients show them.
"""
from __future__ import annotations

import random
import re

# The reference's error texts (server/errors.go), shown to users in API errors.
BAD_SUBJECT = "invalid subject"
_MAPPING = "invalid mapping destination"
INVALID_DEST = _MAPPING + ": invalid transform"
UNKNOWN_FUNCTION = _MAPPING + ": unknown function"
INDEX_OUT_OF_RANGE = _MAPPING + ": wildcard index out of range"
NOT_ENOUGH_ARGS = _MAPPING + ": not enough arguments passed to the function"
INVALID_ARG = _MAPPING + ": function argument is invalid or in the wrong format"
TOO_MANY_ARGS = _MAPPING + ": too many arguments passed to the function"
NO_MATCH = "no matching transforms available"

# Token kinds.
LITERAL, WILDCARD, PARTITION, SPLIT_LEFT, SPLIT_RIGHT, SLICE_LEFT, SLICE_RIGHT, SPLIT, \
    LEFT, RIGHT, RANDOM = range(11)


def _fn(name: str) -> re.Pattern:
    # ``{{ Name(args) }}``: the first letter of each word may be upper or lower case.
    pat = "".join("[%s%s]%s" % (w[0].upper(), w[0].lower(), w[1:]) for w in name.split("_"))
    return re.compile(r"{{\s*%s\s*\((.*)\)\s*}}" % pat)


# Tried in this order, as the reference does: "split" would also match the start of
# "splitFromLeft" otherwise (its pattern is anchored on the parenthesis, so the longer
# names go first).
_FUNCTIONS = [
    ("wildcard", _fn("wildcard"), WILDCARD),
    ("partition", _fn("partition"), PARTITION),
    ("splitfromleft", _fn("split_from_left"), SPLIT_LEFT),
    ("splitfromright", _fn("split_from_right"), SPLIT_RIGHT),
    ("slicefromleft", _fn("slice_from_left"), SLICE_LEFT),
    ("slicefromright", _fn("slice_from_right"), SLICE_RIGHT),
    ("right", _fn("right"), RIGHT),
    ("left", _fn("left"), LEFT),
    ("split", _fn("split"), SPLIT),
    ("random", _fn("random"), RANDOM),
]
_ARG_SEP = re.compile(r",\s*")


class TransformError(ValueError):
    """A destination the language cannot express; ``str()`` is the reference's text."""

    def __init__(self, err: str, token: str = ""):
        super().__init__("%s in %s" % (err, token) if token else err)


def _subject_info(subject: str):
    """(valid, tokens, number of '*', has '>') -- server/subject_transform.go subjectInfo."""
    if not subject:
        return False, [], 0, False
    toks = subject.split(".")
    npwc = 0
    fwc = False
    for t in toks:
        if not t or fwc:
            return False, [], 0, False
        if t == ">":
            fwc = True
        elif t == "*":
            npwc += 1
    return True, toks, npwc, fwc


def _int(text: str, token: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise TransformError(INVALID_ARG, token) from None


def _parse_token(token: str):
    """(kind, wildcard indexes, int argument, string argument) of a destination token."""
    n = len(token)
    if n > 1 and token[0] == "$":
        # ``$N``; any other token starting with '$' is a literal.
        if token[1:].isdigit():
            return WILDCARD, [int(token[1:])], -1, ""
        return LITERAL, [], -1, ""
    if not (n > 4 and token.startswith("{{") and token.endswith("}}")):
        return LITERAL, [], -1, ""
    for name, pat, kind in _FUNCTIONS:
        m = pat.search(token)
        if m is None:
            continue
        args = _ARG_SEP.split(m.group(1))
        if kind == WILDCARD:
            if len(args) == 1 and args[0] == "":
                raise TransformError(NOT_ENOUGH_ARGS, token)
            if len(args) > 1:
                raise TransformError(TOO_MANY_ARGS, token)
            return WILDCARD, [_int(args[0], token)], -1, ""
        if kind == PARTITION:
            count = _int(args[0], token)
            if count > 0x7FFFFFFF:
                raise TransformError(INVALID_ARG, token)
            return PARTITION, [_int(a, token) for a in args[1:]], count, ""
        if kind == SPLIT:
            if len(args) < 2:
                raise TransformError(NOT_ENOUGH_ARGS, token)
            if len(args) > 2:
                raise TransformError(TOO_MANY_ARGS, token)
            index = _int(args[0], token)
            if " " in args[1] or "." in args[1]:
                raise TransformError(INVALID_ARG, token)
            return SPLIT, [index], -1, args[1]
        if kind == RANDOM:
            if len(args) != 1:
                raise TransformError(NOT_ENOUGH_ARGS, token)
            ceiling = _int(args[0], token)
            if ceiling > 0x7FFFFFFF:
                raise TransformError(INVALID_ARG, token)
            return RANDOM, [], ceiling, ""
        # The (wildcard index, integer) functions.
        if len(args) < 2:
            raise TransformError(NOT_ENOUGH_ARGS, token)
        if len(args) > 2:
            raise TransformError(TOO_MANY_ARGS, token)
        index = _int(args[0], token)
        value = _int(args[1], token)
        if not -(1 << 31) <= value < (1 << 31):
            raise TransformError(INVALID_ARG, token)
        return kind, [index], value, ""
    raise TransformError(UNKNOWN_FUNCTION, token)


def _fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


class SubjectTransform:
    """One source -> destination mapping, parsed once; ``match`` maps a subject."""

    __slots__ = ("src", "dest", "stoks", "dtoks", "ops", "identity", "literal_src")

    def __init__(self, src: str, dest: str):
        if not src:
            src = ">"
        ok_s, stoks, npwc, sfwc = _subject_info(src)
        ok_d, dtoks, dnpwc, dfwc = _subject_info(dest)
        if not ok_s or not ok_d or dnpwc > 0 or sfwc != dfwc:
            raise TransformError(BAD_SUBJECT)
        self.src = src
        self.dest = dest
        self.stoks = stoks
        self.dtoks = dtoks
        self.identity = src == ">" and dest == ">"
        self.literal_src = npwc == 0 and not sfwc
        # Where each '*' of the source sits among its tokens, by 1-based wildcard number.
        positions = [i for i, t in enumerate(stoks) if t == "*"]
        ops = []
        for t in dtoks:
            kind, idx, iarg, sarg = _parse_token(t)
            if kind in (LITERAL, RANDOM):
                ops.append((kind, [], iarg, sarg, t))
                continue
            if npwc == 0 and not sfwc:
                # Without wildcards only partition is possible, and it hashes the whole
                # subject whatever tokens it names (as the reference does).
                if kind == PARTITION:
                    ops.append((kind, [], iarg, sarg, t))
                    continue
                raise TransformError(INDEX_OUT_OF_RANGE, t)
            mapped = []
            for n in idx:
                if n > npwc:
                    raise TransformError(INDEX_OUT_OF_RANGE, "%s: [%d]" % (t, n))
                # An index below 1 names the subject's first token in the reference
                # (a missing map key reads as position 0); keep that.
                mapped.append(positions[n - 1] if n >= 1 else 0)
            ops.append((kind, mapped, iarg, sarg, t))
        self.ops = ops

    # ---- applying ----------------------------------------------------------------------

    def matches(self, subject: str) -> bool:
        st = subject.split(".")
        pt = self.stoks
        for i, p in enumerate(pt):
            if p == ">":
                return len(st) > i
            if i >= len(st):
                return False
            if p != "*" and p != st[i]:
                return False
        return len(st) == len(pt)

    def match(self, subject: str) -> str:
        """The mapped subject; TransformError(NO_MATCH) when the source does not match."""
        if self.identity:
            return subject
        toks = subject.split(".")
        if any(not t or t in ("*", ">") for t in toks):
            raise TransformError(BAD_SUBJECT)
        if self.src != ">" and not self.matches(subject):
            raise TransformError(NO_MATCH)
        return self.transform_tokens(toks)

    def apply(self, subject: str) -> str:
        """Map ``subject`` if the source matches it, otherwise leave it as it is."""
        try:
            return self.match(subject)
        except TransformError:
            return subject

    def transform_tokens(self, toks: list[str]) -> str:
        out: list[str] = []
        for kind, idx, iarg, sarg, dtok in self.ops:
            if kind == LITERAL:
                if dtok == ">":
                    # The rest of the subject, from where the source's '>' starts.
                    out.extend(toks[len(self.stoks) - 1:])
                    return ".".join(out)
                out.append(dtok)
                continue
            if kind == RANDOM:
                out.append(str(random.randrange(1 << 31) % iarg) if iarg else "0")
                continue
            if kind == PARTITION:
                if idx:
                    key = "".join(toks[i] for i in idx if 0 <= i < len(toks))
                else:
                    key = ".".join(toks)
                out.append(str(_fnv1a32(key.encode()) % iarg) if iarg else "0")
                continue
            i = idx[0] if idx else -1
            if kind == WILDCARD:
                out.append(toks[i] if 0 <= i < len(toks) else "")
                continue
            tok = toks[i] if 0 <= i < len(toks) else ""
            out.append(_apply_function(kind, tok, iarg, sarg))
        return ".".join(out)


def _apply_function(kind: int, tok: str, n: int, sep: str) -> str:
    size = len(tok)
    if kind == SPLIT:
        return ".".join(p for p in tok.split(sep) if p)
    if not 0 < n < size:
        # Too short for the requested split or slice: the token stays whole.
        return tok
    if kind == SPLIT_LEFT:
        return tok[:n] + "." + tok[n:]
    if kind == SPLIT_RIGHT:
        return tok[:size - n] + "." + tok[size - n:]
    if kind == SLICE_LEFT:
        return ".".join(tok[i:i + n] for i in range(0, size, n))
    if kind == SLICE_RIGHT:
        rem = size % n
        parts = [tok[:rem]] if rem else []
        parts += [tok[i:i + n] for i in range(rem, size, n)]
        return ".".join(parts)
    if kind == LEFT:
        return tok[:n]
    if kind == RIGHT:
        return tok[size - n:]
    return tok


def new_transform(src: str, dest: str) -> SubjectTransform | None:
    """A transform, or None for an empty destination (nothing to map)."""
    if not dest:
        return None
    return SubjectTransform(src, dest)


def validate_mapping(src: str, dest: str) -> None:
    """server/sublist.go ValidateMapping: raise TransformError for a bad destination."""
    if not dest:
        return
    fwc = False
    for t in dest.split("."):
        n = len(t)
        if n == 0 or fwc:
            raise TransformError(INVALID_DEST, t)
        if n > 4 and t.startswith("{{") and t.endswith("}}"):
            if not any(pat.search(t) for name, pat, kind in _FUNCTIONS
                       if name not in ("left", "right")):
                raise TransformError(UNKNOWN_FUNCTION, t)
            continue
        if t == ">":
            fwc = True
        elif any(c in t for c in "\t\n\f\r "):
            raise TransformError(INVALID_DEST)
    SubjectTransform(src, dest)


__all__ = ["SubjectTransform", "TransformError", "new_transform", "validate_mapping"]
