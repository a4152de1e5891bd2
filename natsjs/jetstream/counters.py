"""Distributed counters: streams with ``allow_msg_counter`` (ADR-49), as nats-server has them.

A counter stream takes only increments: a publish carries ``Nats-Incr: <signed decimal
integer of any size>`` and no payload, and the stream stores, in its place, the subject's
new total as ``{"val":"<sum>"}`` (the increment header kept as it came); the PubAck
carries the total too (``"val":"<sum>"``).  The total is the last stored message of the
subject plus the increment, so every replica of a replicated stream, applying the same
entries to the same store, computes the same value (natsjs/jetstream/replicated.py runs
``Stream.process`` on each).

A counter stream that sources other counter streams aggregates them: a sourced message
(its ``Nats-Stream-Source`` names the origin stream and subject) carries the origin's
total; what is added is its difference from the last total seen from that origin
subject, and those totals are kept in the ``Nats-Counter-Sources`` header
(``{"<stream>":{"<subject>":"<total>"}}``), which the next message of the subject
carries on.  The ``Nats-Incr`` header of a sourced message is rewritten to that
difference.

server/stream.go processJetStreamMsg and server/jetstream_batching.go
checkMsgHeadersPreClusteredProposal.  ``check_incr`` is the header check made first,
``apply`` the increment made after every other check.
"""
from __future__ import annotations

import json
import re

from natsjs.jetstream import headers as H
from natsjs.jetstream.errors import ApiError
from natsjs.jetstream.gojson import go_json

INCR = b"Nats-Incr"
COUNTER_SOURCES = b"Nats-Counter-Sources"

# Go's big.Int SetString(s, 10): an optional sign and decimal digits, nothing else.
_BIG_INT = re.compile(rb"[+-]?[0-9]+\Z")
# What big.Int's scanner takes before it stops, when a stored value is read and its
# failure ignored (the digits read so far remain).
_BIG_INT_PREFIX = re.compile(r"([+-]?)([0-9]*)")
# A total as a counter stream stores it (``apply``'s body).
_STORED = re.compile(rb'\{"val":"(-?[0-9]+)"\}\Z')

# Headers an increment cannot come with (each only when not empty, as nats-server reads them).
_INCOMPATIBLE = (H.ROLLUP, H.EXPECTED_STREAM, H.EXPECTED_LAST_MSG_ID,
                 H.EXPECTED_LAST_SUBJ_SEQ_SUBJ, H.EXPECTED_LAST_SEQ, H.EXPECTED_LAST_SUBJ_SEQ)


_ONLY_INCR = H.HDR_LINE + INCR + b":"
_END = H.CRLF + H.CRLF


def only_incr(hdr: bytes) -> int | None:
    """The increment of a header block that holds one ``Nats-Incr`` line and nothing
    else, as counter clients send it, when it is a valid one; else None (and the full
    checks decide).  With no other header there is nothing else to check."""
    if not hdr.endswith(_END) or not hdr.startswith(_ONLY_INCR):
        return None
    raw = hdr[len(_ONLY_INCR):-4].lstrip(b" ")
    return int(raw) if _BIG_INT.match(raw) is not None else None


def check_incr(cfg: dict, hdr: bytes, msg: bytes, sourced: bool):
    """The increment a message's headers carry (None: none), or the ApiError refusing it."""
    raw = H.get(hdr, INCR)
    if not raw:
        return None
    if _BIG_INT.match(raw) is None:
        return ApiError.of("JSMessageIncrInvalidErr")
    incr = int(raw)
    if sourced:
        return incr        # stored as the origin had it (aggregated by ``apply``)
    if not cfg["allow_msg_counter"]:
        return ApiError.of("JSMessageIncrDisabledErr")
    if msg:
        return ApiError.of("JSMessageIncrPayloadErr")
    if b"Nats-Expected-" in hdr or H.ROLLUP in hdr:
        for key in _INCOMPATIBLE:
            if H.get(hdr, key):
                return ApiError.of("JSMessageIncrInvalidErr")
    return incr


def clustered_missing(hdr: bytes) -> bytes | None:
    """The headers of a message without an increment to a replicated counter stream, less
    those nats-server checks only after refusing it for the missing increment (a clustered
    stream's leader checks the expected stream, TTL, message id and source header first,
    server/jetstream_batching.go checkMsgHeadersPreClusteredProposal; the expected last
    sequences, message id and rollup come after).  The message is refused either way."""
    for key in (H.EXPECTED_LAST_SEQ, H.EXPECTED_LAST_SUBJ_SEQ, H.EXPECTED_LAST_SUBJ_SEQ_SUBJ,
                H.EXPECTED_LAST_MSG_ID, H.ROLLUP):
        hdr = H.remove(hdr, key)
    return hdr


def apply(store, subject: bytes, hdr: bytes | None, msg: bytes, incr: int | None,
          max_payload: int):
    """The message a counter stream stores instead: ``(hdr, payload, total)``, or the
    ApiError refusing it."""
    if incr is None:
        return ApiError.of("JSMessageIncrMissingErr")
    total = 0
    sources = None
    last = store.load_last(subject)
    if last is not None:
        try:
            total = _stored_total(last[3])
            if last[2] and COUNTER_SOURCES in last[2]:
                raw = H.get(last[2], COUNTER_SOURCES)
                if raw:
                    sources = _parse_sources(raw)
        except ValueError:
            return ApiError.of("JSMessageCounterBrokenErr")
    origin = H.get(hdr, H.STREAM_SOURCE) if H.STREAM_SOURCE in hdr else None
    if origin:
        # A total from a sourced counter: add what changed since the last one seen.
        fields = origin.decode("utf-8", "replace").split(" ")
        ostream = fields[0]
        osubject = fields[4] if len(fields) >= 5 else subject.decode("utf-8", "replace")
        try:
            sourced = _stored_total(msg)
        except ValueError:
            return ApiError.of("JSMessageCounterBrokenErr")
        if sources is None:
            sources = {}
        per = sources.get(ostream)
        if per is None:
            per = sources[ostream] = {}
        previous = _lenient_int(per.get(osubject, ""))
        per[osubject] = str(sourced)
        incr = sourced - previous
        hdr = H.set_first(hdr, INCR, str(incr).encode())
    total += incr
    body = b'{"val":"%d"}' % total
    if sources:
        hdr = H.set_first(hdr, COUNTER_SOURCES,
                        go_json({k: v if v is None else dict(sorted(v.items()))
                                 for k, v in sorted(sources.items())}))
    hlen = len(hdr) if hdr else 0
    if hlen > max_payload or len(body) > max_payload - hlen:
        return ApiError.of("JSStreamMessageExceedsMaximumErr")
    return hdr, body, total


def pub_ack_tail(seq: int, total: int) -> bytes:
    """The end of a counter stream's PubAck, after ``{"stream":..,"seq":``."""
    return b'%d,"val":"%d"}' % (seq, total)


def _stored_total(payload: bytes) -> int:
    """json.Unmarshal(payload, &CounterValue) and big.Int SetString of its ``val``
    (ValueError where Unmarshal fails)."""
    m = _STORED.match(payload)
    if m is not None:
        return int(m.group(1))     # the form a counter stream stores: no JSON parser
    val = ""
    obj = _go_unmarshal(payload)
    if obj is None:
        return 0
    if obj.__class__ is not _Object:
        raise ValueError("not an object")
    for k, v in obj:
        # encoding/json matches a field name exactly or else case-insensitively;
        # the last of duplicate keys wins.
        if k.lower() != "val" or v is None:
            continue
        if v.__class__ is not str:
            raise ValueError("val is not a string")
        val = v
    return _lenient_int(val)


def _parse_sources(raw: bytes) -> dict:
    """json.Unmarshal into map[string]map[string]string (a null inner map stays None)."""
    obj = _go_unmarshal(raw)
    out: dict = {}
    if obj is None:
        return out
    if obj.__class__ is not _Object:
        raise ValueError("not an object")
    for k, inner in obj:
        if inner is None:
            out[k] = None
            continue
        if inner.__class__ is not _Object:
            raise ValueError("not an object")
        m = {}
        for sk, sv in inner:
            if sv is not None and sv.__class__ is not str:
                raise ValueError("not a string")
            m[sk] = sv or ""
        out[k] = m
    return out


class _Object(list):
    """A JSON object as its (key, value) pairs, in order."""


def _go_unmarshal(data: bytes):
    """A JSON value (objects as ``_Object``), or ValueError.  Go reads invalid UTF-8 in
    strings as U+FFFD."""
    try:
        return json.loads(data.decode("utf-8", "replace"), object_pairs_hook=_Object,
                          parse_constant=_no_constant)
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def _no_constant(name: str):
    raise ValueError("invalid literal %s" % name)


def _lenient_int(text: str) -> int:
    """big.Int SetString with its failure ignored: the digits scanned before it stopped."""
    m = _BIG_INT_PREFIX.match(text)
    if not m.group(2):
        return 0
    n = int(m.group(2))
    return -n if m.group(1) == "-" else n
