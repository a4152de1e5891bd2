"""Go's JSON syntax checking, for the errors nats-server's API answers with.

nats-server reads an API request with a ``json.Decoder`` (server/jetstream_api.go
unmarshalRequest): one JSON value after another until the input ends, every value
decoded into the same request struct.  A syntax error is reported in the words of
Go's ``encoding/json`` scanner (``invalid character 'o' in literal null (expecting
'u')``) followed by `` at offset N``, N counting the bytes read up to and including
the offending one; input that ends inside a value is ``unexpected EOF``.  Clients show
these texts, so they are wire facts.

``values(data)`` yields the ``(start, end)`` byte range of each value in turn and
raises ``GoSyntaxError`` where Go's decoder would stop.  The state machine follows the
grammar and the error contexts of Go's scanner (encoding/json/scanner.go); Python's
``json`` parses a value once it has been checked.
"""
from __future__ import annotations

import json

MAX_DEPTH = 10000

_SPACE = frozenset(b" \t\r\n")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'bfnrt\\/"')

# What a step returns: go on, an error, the value ended with this byte (a container's
# closing bracket), the value ended before this byte (a scalar, which only the next byte
# ends; the byte belongs to what follows).
_CONTINUE, _ERROR, _END_WITH, _END_BEFORE = 0, 1, 2, 3

_OBJ_KEY, _OBJ_VALUE, _ARRAY = 0, 1, 2


class GoSyntaxError(ValueError):
    """A syntax error: ``msg`` in Go's words, ``offset`` the count of bytes read up to
    and including the offending one (None: the input ended inside a value).

    ``str()`` is what a json.Decoder reports (nats-server appends the offset);
    ``unmarshal_text()`` what json.Unmarshal says."""

    def __init__(self, msg: str | None, offset: int | None = None):
        self.msg = msg
        self.offset = offset
        super().__init__("unexpected EOF" if offset is None
                         else "%s at offset %d" % (msg, offset))

    def unmarshal_text(self) -> str:
        # At the end of the input json.Unmarshal feeds the scanner a space: a literal
        # or a number cut short complains about that space.
        return self.msg or "unexpected end of JSON input"


def quote_char(c: int) -> str:
    """Go's quoteChar: a byte as a quoted character literal."""
    if c == 0x27:
        return "'\\''"
    if c == 0x22:
        return "'\"'"
    if c == 0x5C:
        return "'\\\\'"
    ch = chr(c)
    if 0x20 <= c < 0x7F or (c >= 0xA1 and c != 0xAD):
        return "'%s'" % ch
    short = {0x07: "\\a", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t",
             0x0B: "\\v"}
    if c in short:
        return "'%s'" % short[c]
    if c < 0x80:
        return "'\\x%02x'" % c
    return "'\\u%04x'" % c


class _Scanner:
    """One value at a time, byte by byte (encoding/json scanner's states as methods)."""

    def __init__(self):
        self.stack: list[int] = []
        self.step = self.begin_value
        self.err: str | None = None
        self.offset = 0

    def error(self, c: int, context: str) -> int:
        self.step = self.stopped
        self.err = "invalid character %s %s" % (quote_char(c), context)
        return _ERROR

    def stopped(self, c: int) -> int:
        return _ERROR

    def push(self, kind: int, c: int) -> bool:
        self.stack.append(kind)
        if len(self.stack) > MAX_DEPTH:
            self.error(c, "exceeded max depth")
            return False
        return True

    # -- values ---------------------------------------------------------------------

    def begin_value_or_empty(self, c: int) -> int:
        if c in _SPACE:
            return _CONTINUE
        if c == 0x5D:   # ]
            return self.end_value(c)
        return self.begin_value(c)

    def begin_value(self, c: int) -> int:
        if c in _SPACE:
            return _CONTINUE
        if c == 0x7B:   # {
            if not self.push(_OBJ_KEY, c):
                return _ERROR
            self.step = self.begin_string_or_empty
        elif c == 0x5B:   # [
            if not self.push(_ARRAY, c):
                return _ERROR
            self.step = self.begin_value_or_empty
        elif c == 0x22:
            self.step = self.in_string
        elif c == 0x2D:   # -
            self.step = self.neg
        elif c == 0x30:
            self.step = self.zero
        elif 0x31 <= c <= 0x39:
            self.step = self.one
        elif c == 0x74:
            self.step = self._literal(b"rue", "true")
        elif c == 0x66:
            self.step = self._literal(b"alse", "false")
        elif c == 0x6E:
            self.step = self._literal(b"ull", "null")
        else:
            return self.error(c, "looking for beginning of value")
        return _CONTINUE

    def begin_string_or_empty(self, c: int) -> int:
        if c in _SPACE:
            return _CONTINUE
        if c == 0x7D:   # }
            self.stack[-1] = _OBJ_VALUE
            return self.end_value(c)
        return self.begin_string(c)

    def begin_string(self, c: int) -> int:
        if c in _SPACE:
            return _CONTINUE
        if c == 0x22:
            self.step = self.in_string
            return _CONTINUE
        return self.error(c, "looking for beginning of object key string")

    def end_value(self, c: int) -> int:
        if not self.stack:
            self.step = self.end_top
            return self.end_top(c)
        if c in _SPACE:
            self.step = self.end_value
            return _CONTINUE
        top = self.stack[-1]
        if top == _OBJ_KEY:
            if c == 0x3A:   # :
                self.stack[-1] = _OBJ_VALUE
                self.step = self.begin_value
                return _CONTINUE
            return self.error(c, "after object key")
        if top == _OBJ_VALUE:
            if c == 0x2C:   # ,
                self.stack[-1] = _OBJ_KEY
                self.step = self.begin_string
                return _CONTINUE
            if c == 0x7D:
                return self.pop(c)
            return self.error(c, "after object key:value pair")
        if c == 0x2C:
            self.step = self.begin_value
            return _CONTINUE
        if c == 0x5D:
            return self.pop(c)
        return self.error(c, "after array element")

    def pop(self, c: int) -> int:
        self.stack.pop()
        if not self.stack:
            self.step = self.end_top
            return _END_WITH
        self.step = self.end_value
        return _CONTINUE

    def end_top(self, c: int) -> int:
        return _END_BEFORE

    # -- strings ----------------------------------------------------------------------

    def in_string(self, c: int) -> int:
        if c == 0x22:
            self.step = self.end_value
        elif c == 0x5C:
            self.step = self.in_string_esc
        elif c < 0x20:
            return self.error(c, "in string literal")
        return _CONTINUE

    def in_string_esc(self, c: int) -> int:
        if c in _ESCAPES:
            self.step = self.in_string
            return _CONTINUE
        if c == 0x75:   # u
            self.step = self._hex(4)
            return _CONTINUE
        return self.error(c, "in string escape code")

    def _hex(self, left: int):
        def step(c: int) -> int:
            if c not in _HEX:
                return self.error(c, "in \\u hexadecimal character escape")
            self.step = self.in_string if left == 1 else self._hex(left - 1)
            return _CONTINUE
        return step

    # -- numbers and literals ---------------------------------------------------------

    def neg(self, c: int) -> int:
        if c == 0x30:
            self.step = self.zero
            return _CONTINUE
        if 0x31 <= c <= 0x39:
            self.step = self.one
            return _CONTINUE
        return self.error(c, "in numeric literal")

    def one(self, c: int) -> int:
        if c in _DIGITS:
            return _CONTINUE
        return self.zero(c)

    def zero(self, c: int) -> int:
        if c == 0x2E:   # .
            self.step = self.dot
            return _CONTINUE
        if c in (0x65, 0x45):
            self.step = self.exp
            return _CONTINUE
        return self.end_value(c)

    def dot(self, c: int) -> int:
        if c in _DIGITS:
            self.step = self.dot_digits
            return _CONTINUE
        return self.error(c, "after decimal point in numeric literal")

    def dot_digits(self, c: int) -> int:
        if c in _DIGITS:
            return _CONTINUE
        if c in (0x65, 0x45):
            self.step = self.exp
            return _CONTINUE
        return self.end_value(c)

    def exp(self, c: int) -> int:
        if c in (0x2B, 0x2D):
            self.step = self.exp_sign
            return _CONTINUE
        return self.exp_sign(c)

    def exp_sign(self, c: int) -> int:
        if c in _DIGITS:
            self.step = self.exp_digits
            return _CONTINUE
        return self.error(c, "in exponent of numeric literal")

    def exp_digits(self, c: int) -> int:
        if c in _DIGITS:
            return _CONTINUE
        return self.end_value(c)

    def _literal(self, rest: bytes, name: str):
        def step(c: int) -> int:
            if c != rest[0]:
                return self.error(c, "in literal %s (expecting %s)"
                                  % (name, quote_char(rest[0])))
            self.step = self.end_value if len(rest) == 1 else self._literal(rest[1:], name)
            return _CONTINUE
        return step


def values(data: bytes):
    """The (start, end) of each JSON value in ``data``, as Go's json.Decoder reads
    them; GoSyntaxError where it would stop."""
    n = len(data)
    pos = 0
    while True:
        sc = _Scanner()
        i = pos
        while i < n and data[i] in _SPACE:
            i += 1
        if i == n:
            return          # only whitespace left: the input is over
        start = i
        end = -1
        while i < n:
            r = sc.step(data[i])
            if r == _CONTINUE:
                i += 1
                continue
            if r == _ERROR:
                raise GoSyntaxError(sc.err, i + 1)
            end = i + 1 if r == _END_WITH else i
            break
        if end < 0:
            # The input ends inside the value: a scalar may end there, nothing else can.
            if sc.step(0x20) != _END_BEFORE:
                raise GoSyntaxError(sc.err)
            end = n
        yield start, end
        pos = end


def check_valid(data: bytes) -> None:
    """json.Unmarshal's check of the whole input: exactly one value, then only
    whitespace; GoSyntaxError otherwise (use ``unmarshal_text()``)."""
    it = values(data)
    try:
        first = next(it)
    except StopIteration:
        raise GoSyntaxError(None) from None
    i = first[1]
    while i < len(data) and data[i] in _SPACE:
        i += 1
    if i < len(data):
        raise GoSyntaxError("invalid character %s after top-level value"
                            % quote_char(data[i]), i + 1)


def go_json(obj) -> bytes:
    """JSON as Go's encoder writes it: compact, UTF-8, with <, >, & and the line and
    paragraph separators escaped inside strings (they cannot occur outside)."""
    try:
        text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
        data = text.encode()
    except UnicodeEncodeError:      # a lone surrogate: leave it escaped
        text = json.dumps(obj, separators=(",", ":"))
        data = text.encode()
    if b"<" in data or b">" in data or b"&" in data or "\u2028" in text or "\u2029" in text:
        text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026") \
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
        data = text.encode()
    return data
