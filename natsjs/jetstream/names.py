"""The one place where a name or a subject from outside is judged.

Names of streams, consumers, buckets, object stores, mirrors and sources arrive in API
requests, in restored archives and in files read at start-up; each of them later
becomes a directory name under the store and a token of protocol subjects.  Subjects
(stream subjects, filters, deliver subjects, external prefixes) end up inside protocol
lines (``MSG``, ``RMSG``, ``RS+``) sent to clients and peers.  Everything that enters
is checked here, where it enters; inside, names and subjects are trusted (the Cython
encoders refuse CR/LF in a subject once more, natsjs/_core/fanout.pyx).

The rules are nats-server's (server/stream.go isValidAssetName, server/sublist.go
isValidSubject) made strict where a byte could break a file name or a protocol line:
no control characters at all, and text that is valid UTF-8.  JSON requests never bring
lone surrogates here: they are decoded as Go decodes them, each one a U+FFFD
(natsjs/jetstream/schema.py).
"""
from __future__ import annotations

MAX_NAME_LEN = 255          # server/jetstream_api.go JSMaxNameLen, in bytes

# isValidAssetName: no token separators, wildcards, whitespace or path separators.
_NAME_REFUSED = frozenset(".*> \t\r\n\f\\/")


def _printable(text: str) -> bool:
    """No C0 control character, no DEL and no lone surrogate."""
    for c in text:
        o = ord(c)
        if o < 32 or o == 127 or 0xD800 <= o <= 0xDFFF:
            return False
    return True


def valid_asset_name(name) -> bool:
    """A stream's or a consumer's name as nats-server takes it (length aside: too long
    is an error of its own, ``name_too_long``)."""
    return isinstance(name, str) and bool(name) and \
        not any(c in _NAME_REFUSED for c in name) and _printable(name)


def name_len(name: str) -> int:
    """Go's len(): bytes of UTF-8, which is what a file name's limit counts too."""
    return len(name.encode("utf-8", "surrogatepass"))


def name_too_long(name: str) -> bool:
    return name_len(name) > MAX_NAME_LEN


def safe_name(name) -> bool:
    """A valid name that can also be a directory name of its own (archives and files
    read at start-up are held to this before a path is made of them)."""
    return valid_asset_name(name) and not name_too_long(name)


def valid_subject(subject) -> bool:
    """server/sublist.go isValidSubject: non-empty tokens, no whitespace, ``>`` last;
    and no control character, so nothing can end a protocol line early."""
    if not isinstance(subject, str) or not subject or not _printable(subject):
        return False
    fwc = False
    for t in subject.split("."):
        if not t or fwc:
            return False
        if len(t) > 1:
            if " " in t:
                return False
            continue
        if t == ">":
            fwc = True
        elif t == " ":
            return False
    return True


def valid_publish_subject(subject) -> bool:
    """A valid subject with no wildcard token (server/sublist.go IsValidPublishSubject)."""
    return valid_subject(subject) and \
        all(t != "*" and t != ">" for t in subject.split("."))
