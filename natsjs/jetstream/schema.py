"""Decoding JetStream API request bodies the way nats-server's Go structs do.

Clients build requests from nats-server's JSON schema, and they parse the errors:
a field of the wrong type, an unknown field (the reference decodes strictly, with
``DisallowUnknownFields``: server/jetstream_api.go unmarshalRequest) or a bad enum
value is refused with Go's ``encoding/json`` wording inside the API error
``invalid JSON: ...``.  A schema here is a dict of JSON field name -> type; decoding
checks types, folds field names case-insensitively (as Go does), and returns plain
Python values with the zero values Go would leave for absent fields left out, so the
callers apply nats-server's defaults themselves.

Types: "string", "bool", "int" (Go int), "int32", "int64", "uint64", "duration"
(int64 nanoseconds), "float64", ``Enum(go_name, values)``, ``ListOf(t)``,
``MapOf(t)`` (string keys), ``Struct(go_name, fields)``, ``Raw`` (any JSON value,
kept as is).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from natsjs.jetstream import gojson

_INT_RANGES = {
    "int": (-(1 << 63), (1 << 63) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
    "duration": (-(1 << 63), (1 << 63) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "uint64": (0, (1 << 64) - 1),
}
_GO_TYPE = {"duration": "time.Duration"}


class DecodeError(ValueError):
    """The text nats-server puts after ``invalid JSON: ``."""


@dataclass(frozen=True)
class Enum:
    go_name: str
    values: tuple[str, ...]
    lower: bool = False            # DiscardPolicy compares case-insensitively
    # The error of its UnmarshalJSON for another value: {raw} is the JSON text as
    # given, {quoted} that text in Go's %q.  ``string_first``: the text is decoded as a
    # Go string before it is compared (StoreCompression), so a non-string is a type
    # error.
    unknown: str = "can not unmarshal {quoted}"
    string_first: bool = False
    # Other texts its UnmarshalJSON takes, as (text, value) pairs: PersistModeType reads
    # "default" and "" alike, as its zero value, which the encoder then leaves out.
    aliases: tuple = ()


class GoFloat(float):
    """A JSON number with a fraction or an exponent, with its text (Go quotes the text
    when such a number does not fit an integer field)."""

    def __new__(cls, text: str):
        obj = super().__new__(cls, text)
        obj.text = text
        return obj


@dataclass(frozen=True)
class ListOf:
    elem: object


@dataclass(frozen=True)
class MapOf:
    elem: object


@dataclass(frozen=True)
class Struct:
    go_name: str
    fields: dict


RAW = "raw"


def _json_kind(v) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "null"


def _go_name(t) -> str:
    if isinstance(t, str):
        return _GO_TYPE.get(t, t)
    if isinstance(t, Enum):
        return "server." + t.go_name
    if isinstance(t, ListOf):
        return "[]" + _go_name(t.elem)
    if isinstance(t, MapOf):
        return "map[string]" + _go_name(t.elem)
    if isinstance(t, Struct):
        return "server." + t.go_name
    return "interface {}"


def _number_text(value) -> str:
    return value.text if isinstance(value, GoFloat) else json.dumps(value)


def _type_error(value, t, where: str) -> DecodeError:
    kind = _json_kind(value)
    if kind == "number" and isinstance(t, str) and (t in _INT_RANGES or t == "float64"):
        # Only a number that does not fit a numeric field is quoted (encoding/json
        # literalStore); any other field says just "number".
        kind = "number " + _number_text(value)
    if where:
        return DecodeError("json: cannot unmarshal %s into Go struct field %s of type %s"
                           % (kind, where, _go_name(t)))
    return DecodeError("json: cannot unmarshal %s into Go value of type %s" % (kind, _go_name(t)))


def _decode(value, t, where: str):
    if value is None:
        return None
    if t == RAW:
        return value
    if isinstance(t, str):
        if t == "string":
            if not isinstance(value, str):
                raise _type_error(value, t, where)
            return value
        if t == "bool":
            if not isinstance(value, bool):
                raise _type_error(value, t, where)
            return value
        if t == "float64":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    math.isinf(float(value)):
                raise _type_error(value, t, where)
            return float(value)
        lo, hi = _INT_RANGES[t]
        # A fraction or an exponent does not go into an integer, even 1.0 or 1e3.
        if isinstance(value, (bool, float)) or not isinstance(value, int):
            raise _type_error(value, t, where)
        if not lo <= value <= hi:
            raise _type_error(value, t, where)
        return value
    if isinstance(t, Enum):
        if t.string_first and not isinstance(value, str):
            raise _type_error(value, "string", "")
        for text, alias in t.aliases:
            if value == text:
                return alias
        if not isinstance(value, str) or (value.lower() if t.lower else value) not in t.values:
            raw = _number_text(value) if isinstance(value, float) else \
                json.dumps(value, separators=(",", ":"))
            raise DecodeError(t.unknown.format(raw=raw, quoted=go_quote(raw)))
        return value.lower() if t.lower else value
    if isinstance(t, ListOf):
        if not isinstance(value, list):
            raise _type_error(value, t, where)
        return [_decode(v, t.elem, where) for v in value]
    if isinstance(t, MapOf):
        if not isinstance(value, dict):
            raise _type_error(value, t, where)
        return {k: _decode(v, t.elem, where) for k, v in value.items()}
    if isinstance(t, Struct):
        if not isinstance(value, dict):
            raise _type_error(value, t, where)
        return decode_struct(value, t, where or t.go_name)
    raise TypeError("bad schema type %r" % (t,))


def decode_struct(obj: dict, t: Struct, where: str = "", strict: bool = True) -> dict:
    """Check ``obj`` against ``t``: types checked, unknown fields refused (``strict``)
    or skipped."""
    where = where or t.go_name
    out = {}
    folded = None
    for key, value in obj.items():
        ft = t.fields.get(key)
        name = key
        if ft is None:
            if folded is None:
                folded = {k.lower(): k for k in t.fields}
            name = folded.get(key.lower())
            if name is None:
                if not strict:
                    continue
                raise DecodeError('json: unknown field "%s"' % key)
            ft = t.fields[name]
        v = _decode(value, ft, where + "." + name)
        if v is not None:
            out[name] = v
    return out


def decode_request(body: bytes, t: Struct) -> dict:
    """Parse a request body into ``t``'s fields the way nats-server's unmarshalRequest
    does: a json.Decoder reads value after value into the same struct (a later value's
    fields win; ``null`` leaves it as it is), so the first error in reading order is
    the one reported.  An empty body is an empty request."""
    if not body or not body.strip():
        return {}
    try:
        # The common case: one well-formed value (Python's grammar is Go's once the
        # non-standard constants are refused and no encoding is guessed).
        single = loads(body, strict=True)
    except (ValueError, RecursionError):
        pass
    else:
        return _decode_top(single, t, {})
    out: dict = {}
    try:
        for start, end in gojson.values(body):
            value = _loads_deep(body[start:end])
            out = _decode_top(value, t, out)
    except gojson.GoSyntaxError as exc:
        raise DecodeError(str(exc)) from None
    return out


def unmarshal(body: bytes, t: Struct) -> dict:
    """``body`` decoded the way Go's json.Unmarshal fills ``t`` (one value, unknown
    fields skipped, Go's error texts), for requests nats-server reads that way."""
    try:
        # The common case: well-formed (see decode_request); Go's scanner only for the
        # words of an error.
        value = loads(body, strict=True)
    except (ValueError, RecursionError):
        try:
            gojson.check_valid(body)
        except gojson.GoSyntaxError as exc:
            raise DecodeError(exc.unmarshal_text()) from None
        value = _loads_deep(body)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _type_error(value, t, "")
    return decode_struct(value, t, strict=False)


def loads(data: bytes, strict: bool = False):
    """JSON text decoded into the strings Go would hold: a byte that is not UTF-8 and
    an escaped lone surrogate (``"\\udc80"``) each become U+FFFD, as encoding/json
    makes them, so no string taken from outside fails to encode later (as a file name,
    a subject, a log line).  ``strict``: invalid UTF-8 and NaN/Infinity raise
    ValueError instead (the caller then asks Go's scanner for the error's words)."""
    value = (_STRICT if strict else _LENIENT).decode(
        data.decode("utf-8") if strict else data.decode("utf-8", "replace"))
    if b"\\u" in data and _SURROGATE_ESCAPE.search(data):
        value = _without_surrogates(value)
    return value


def _loads_deep(data: bytes):
    """``loads`` of a value Go's scanner has passed, which may nest deeper (up to
    gojson.MAX_DEPTH, 10,000) than Python's decoder can recurse: the arrays and objects
    below ``_DEEPEST`` levels are read as empty ones of their kind.  Decoding into a
    struct then fails where Go's fails (a type mismatch or an unknown field is found
    at the level where the nesting starts), instead of with a RecursionError."""
    try:
        return loads(data)
    except RecursionError:
        return loads(bytes(_flattened(data)))


_DEEPEST = 200


def _flattened(data: bytes) -> bytearray:
    out = bytearray()
    depth = 0
    skipping = 0            # how deep inside an emptied container, 0 when not
    in_string = escaped = False
    for c in data:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:                         # backslash
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x5B, 0x7B):                     # [ {
            depth += 1
            if skipping:
                skipping += 1
                continue
            if depth > _DEEPEST:
                skipping = 1
                out += b"[]" if c == 0x5B else b"{}"
                continue
        elif c in (0x5D, 0x7D):                     # ] }
            depth -= 1
            if skipping:
                skipping -= 1
                continue
        if not skipping:
            out.append(c)
    return out


# An escape of a high or low surrogate: \uD800-\uDFFF, in either case.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE = re.compile("[\ud800-\udfff]")


def _without_surrogates(value):
    if isinstance(value, str):
        return _LONE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    return value


def _refuse_constant(name: str):
    raise ValueError(name)


# Numbers with a fraction or an exponent keep their text (GoFloat).  _STRICT refuses
# NaN and Infinity, which Go does not read; _LENIENT parses what Go's scanner passed.
_STRICT = json.JSONDecoder(parse_float=GoFloat, parse_constant=_refuse_constant)
_LENIENT = json.JSONDecoder(parse_float=GoFloat)


def _decode_top(value, t: Struct, into: dict) -> dict:
    if value is None:
        return into
    if not isinstance(value, dict):
        raise _type_error(value, t, "")
    return _merge(into, decode_struct(value, t))


def _merge(into: dict, new: dict) -> dict:
    """Go decoding into a struct that already holds values: objects (structs and
    maps) are filled in further, everything else is replaced."""
    for k, v in new.items():
        old = into.get(k)
        into[k] = _merge(dict(old), v) if isinstance(old, dict) and isinstance(v, dict) else v
    return into


def go_quote(s: str) -> str:
    """Go's %q of a string."""
    return json.dumps(s, ensure_ascii=False)


MAPOF_STRING = MapOf("string")


_ZERO = {"string": "", "bool": False, "int": 0, "int32": 0, "int64": 0, "uint64": 0,
         "duration": 0, "float64": 0.0}


def zero_values(fields: dict, enum_defaults: dict, struct_defaults: dict | None = None) -> dict:
    """A configuration dict with every field at Go's zero value (enums at their first
    value, nested structs absent unless given)."""
    out = {}
    for name, t in fields.items():
        if name in enum_defaults:
            out[name] = enum_defaults[name]
        elif struct_defaults and name in struct_defaults:
            out[name] = struct_defaults[name]()
        elif isinstance(t, str) and t in _ZERO:
            out[name] = _ZERO[t]
        else:
            out[name] = None
    return out


def merged(blank: dict, req: dict) -> dict:
    """``blank`` with the known fields of a decoded request filled in."""
    for k, v in req.items():
        if k in blank:
            blank[k] = v
    return blank


def is_empty(v) -> bool:
    """What Go's encoder treats as empty for ``omitempty``."""
    return v is None or v == "" or v == 0 or v is False or v == [] or v == {}


def is_empty_request(body: bytes) -> bool:
    """server/jetstream_api.go isEmptyRequest: no body, or a JSON object with nothing in
    it."""
    if not body or body == b"{}":
        return True
    try:
        v = json.loads(body)
    except ValueError:
        return False
    return isinstance(v, dict) and not v
