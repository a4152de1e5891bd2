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
from dataclasses import dataclass

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


def _type_error(value, t, where: str) -> DecodeError:
    kind = _json_kind(value)
    if kind == "number":
        kind = "number " + json.dumps(value)
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
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _type_error(value, t, where)
            return float(value)
        lo, hi = _INT_RANGES[t]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _type_error(value, t, where)
        if isinstance(value, float):
            if not value.is_integer():
                raise _type_error(value, t, where)
            value = int(value)
        if not lo <= value <= hi:
            raise _type_error(value, t, where)
        return value
    if isinstance(t, Enum):
        if not isinstance(value, str) or (value.lower() if t.lower else value) not in t.values:
            raise DecodeError("can not unmarshal %s" % _go_quote(json.dumps(value)))
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


def decode_struct(obj: dict, t: Struct, where: str = "") -> dict:
    """Check ``obj`` against ``t``: unknown fields refused, types checked."""
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
                raise DecodeError('json: unknown field "%s"' % key)
            ft = t.fields[name]
        v = _decode(value, ft, where + "." + name)
        if v is not None:
            out[name] = v
    return out


def decode_request(body: bytes, t: Struct) -> dict:
    """Parse a request body into ``t``'s fields; an empty body is an empty request."""
    if not body or not body.strip():
        return {}
    try:
        obj = json.loads(body)
    except UnicodeDecodeError:
        raise DecodeError("invalid character looking for beginning of value") from None
    except json.JSONDecodeError as exc:
        raise DecodeError(_go_syntax_error(exc, body)) from None
    if not isinstance(obj, dict):
        raise _type_error(obj, t, "")
    return decode_struct(obj, t)


def _go_syntax_error(exc: json.JSONDecodeError, body: bytes) -> str:
    """Go's wording for the common syntax errors, with its ``at offset N`` suffix."""
    pos = exc.pos
    if pos >= len(exc.doc.rstrip()):
        return "unexpected EOF"
    ch = exc.doc[pos]
    if exc.msg.startswith("Expecting value"):
        what = "looking for beginning of value"
    elif exc.msg.startswith("Expecting property name"):
        what = "looking for beginning of object key string"
    elif exc.msg.startswith("Expecting ':'"):
        what = "after object key"
    elif exc.msg.startswith("Expecting ',' delimiter"):
        what = "after object key:value pair" if exc.doc.lstrip().startswith("{") else \
            "after array element"
    elif exc.msg.startswith("Extra data"):
        what = "after top-level value"
    else:
        what = "looking for beginning of value"
    return "invalid character %s %s at offset %d" % (_go_char(ch), what, pos + 1)


def _go_char(ch: str) -> str:
    if ch == "'":
        return "'\\''"
    if ch == '"':
        return "'\"'"
    return "'%s'" % ch


def _go_quote(s: str) -> str:
    """Go's %q of a string."""
    return json.dumps(s)


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
