"""Parser for the nats-server configuration file format.

Where this sits::

    server.conf --(natsjs.conf.parse_file)--> ConfMap of plain values
                --(natsjs.options)--> typed, frozen server options

This module only understands the *syntax* of the format; deciding which keys
mean what (and warning about unknown ones) is the job of ``natsjs.options``.
It accepts and rejects the same texts as nats-server's own parser
(``conf/lex.go`` + ``conf/parse.go``, in the "pedantic" mode the server uses)
and produces the same values, including that parser's odd corners, so a
config file behaves identically under both servers.

Format summary
--------------
* ``key = value``, ``key: value`` or ``key value``; keys may be quoted with
  ``"`` or ``'`` (no escapes in keys).  Keys keep their original spelling
  (nats-server lower-cases them only when it interprets options).
* Maps ``{ ... }`` (the ``=``/``:`` before ``{`` is optional), arrays
  ``[ ... ]``; entries separated by newlines, ``,`` or ``;``.  A whole file
  may also be wrapped in ``{ ... }`` (JSON style).
* Comments: ``#`` and ``//`` to end of line.
* Strings: ``"double"`` (escapes ``\\t \\n \\r \\" \\\\ \\xHH``), ``'single'``
  (verbatim), bare words (``nats-route://h:4248``, ``/a/dir``; the same escapes
  as double quotes apply), and block strings: ``(`` up to a line holding only
  ``)``.
* ``true/yes/on`` and ``false/no/off`` (any case, unquoted) are booleans.
* Integers, with optional size suffix: ``k m g t p e`` are powers of 1000;
  ``kb``/``ki``/``kib`` (and the same for m, g, t, p, e) are powers of 1024.
  So ``1K`` is 1000 but ``1KB`` is 1024.  Floats need digits on both sides of
  the dot (``1.5``; no exponent form).  ``YYYY-MM-DDTHH:MM:SSZ`` is a UTC
  ``datetime``.
* Durations are *not* a value type: ``2s`` is just the string "2s";
  :func:`parse_duration` / :func:`to_duration` convert later, the way
  nats-server's opts.go does (a bare integer given for a duration means
  seconds and draws a "should be converted to a duration" warning there).
  Beware that an unquoted ``2m`` is the *integer* 2000000 (mega suffix),
  exactly as in nats-server; minute durations must be quoted.
* ``include path`` (unquoted key ``include``, any case) merges another file
  into the current map.  The path is joined onto the directory of the
  including file *even when it is absolute* (nats-server uses Go's
  ``filepath.Join``, so ``include /etc/x.conf`` inside ``/srv/a.conf`` reads
  ``/srv/etc/x.conf``).
* ``$name`` (unquoted) is replaced by the value of ``name`` defined earlier in
  the current map or any enclosing map, else by environment variable
  ``name`` (whose text is itself parsed as a value, so ``PORT=4222`` gives an
  int).  Quoted strings are never expanded, ``${name}`` is not a form the
  reference knows (it looks up ``{name``), and a bare ``$2a$...`` bcrypt hash
  stays a string.  Unknown names are an error.

Result structure
----------------
:func:`parse` and :func:`parse_file` return a :class:`ConfMap`: a ``dict``
(insertion ordered, later duplicates overwrite earlier ones) whose values are
``str``, ``bool``, ``int``, ``float``, ``datetime``, :class:`ConfMap` or
:class:`ConfList`.  Check ``bool`` before ``int`` when dispatching on type.

* ``ConfMap.positions[key]`` / ``ConfMap.pos(key)`` -> :class:`Pos` of the
  key (values are reported at their key, as nats-server does).
* ``ConfMap.is_used_variable(key)``: the key's value was referenced as
  ``$key``; nats-server does not call such keys unknown fields.
* ``ConfMap.get_ci`` / ``ConfMap.key_ci``: case-insensitive lookups.
* ``ConfList.positions[i]`` -> :class:`Pos` of element ``i``'s first char.
* :func:`to_plain` strips the subclasses.

:class:`Pos` is ``(file, line, col)`` with 1-based line and column.
nats-server prints columns 0-based on the first line of a file and 1-based
after it (an artefact of its lexer); ``Pos.nats_col`` / ``Pos.nats()`` give
that spelling for messages that must match its output byte for byte.

Errors
------
Every failure raises :class:`ConfigError`; ``str(err)`` is
``"file:line:col: message"`` (``err.pos`` holds the :class:`Pos`), where the
message is nats-server's own sentence for the error, so tools that read a
server's error find the words they know: ``Parse error on line N: '...'``
for syntax errors, ``config is invalid (file:line:col)``, ``variable
reference for 'x' on line N can not be found``, ``error parsing include file
'f', <the included file's error>`` (positioned in the included file), and
``open <path>: no such file or directory``.  ``err.reason`` is the bare cause.
Where nats-server prints the end of input as a raw NUL byte ("but got '\\x00'
instead") natsjs says ``EOF``.

Deliberate differences from the reference (it crashes or silently corrupts):
an integer with an unknown suffix such as ``1kbb`` or a size overflowing
int64 is an error rather than being dropped/wrapped, and include cycles are
an error rather than a stack overflow.
"""

from __future__ import annotations

import datetime as _dt
import os
import posixpath
import re
from bisect import bisect_left
from typing import Any, Iterator, Mapping, NamedTuple, Optional

__all__ = [
    "ConfigError",
    "ConfList",
    "ConfMap",
    "Pos",
    "parse",
    "parse_duration",
    "parse_file",
    "to_duration",
    "to_plain",
]


class Pos(NamedTuple):
    """Where something sits in a config file; line and col are 1-based."""

    file: str
    line: int
    col: int

    @property
    def nats_col(self) -> int:
        # nats-server measures from the previous newline, which does not
        # exist on the first line, hence its 0-based first-line columns.
        return self.col - 1 if self.line == 1 else self.col

    def nats(self) -> str:
        return f"{self.file}:{self.line}:{self.nats_col}"

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class ConfigError(Exception):
    """A configuration file could not be read or parsed.

    ``reason`` says what is wrong; ``message`` says it in the words of
    nats-server (what ``nats-server -t`` prints after its name, e.g.
    ``Parse error on line 2: 'Unexpected EOF.'``), which tools that start a
    server and read its error look for; ``str(err)`` is natsjs's
    ``file:line:col`` followed by ``message``.
    """

    def __init__(self, reason: str, pos: Optional[Pos] = None, message: Optional[str] = None):
        self.reason = reason
        self.pos = pos
        self.message = reason if message is None else message
        super().__init__(f"{pos}: {self.message}" if pos is not None else self.message)

    @property
    def file(self) -> Optional[str]:
        return self.pos.file if self.pos else None

    @property
    def line(self) -> Optional[int]:
        return self.pos.line if self.pos else None

    @property
    def col(self) -> Optional[int]:
        return self.pos.col if self.pos else None


class ConfMap(dict):
    """A config map: a dict that also knows where each key was written."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.positions: dict[str, Pos] = {}
        self.used_variables: set[str] = set()

    def _put(self, key: str, value: Any, pos: Pos, used: bool) -> None:
        self[key] = value
        self.positions[key] = pos
        # A redefinition is a fresh value that nobody has referenced yet.
        if used:
            self.used_variables.add(key)
        else:
            self.used_variables.discard(key)

    def pos(self, key: str) -> Optional[Pos]:
        return self.positions.get(key)

    def is_used_variable(self, key: str) -> bool:
        return key in self.used_variables

    def key_ci(self, name: str) -> Optional[str]:
        """The spelling of ``name`` used in the file, ignoring case."""
        want = name.lower()
        found = None
        for k in self:
            if k.lower() == want:
                found = k
        return found

    def get_ci(self, name: str, default: Any = None) -> Any:
        k = self.key_ci(name)
        return default if k is None else self[k]

    def items_ci(self) -> Iterator[tuple[str, str, Any]]:
        """Yield ``(lowercased key, key as written, value)`` in file order."""
        for k, v in self.items():
            yield k.lower(), k, v


class ConfList(list):
    """A config array; ``positions[i]`` is where element ``i`` starts."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.positions: list[Pos] = []


def to_plain(value: Any) -> Any:
    """Recursively turn ConfMap/ConfList into plain dict/list."""
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    return value


# ---------------------------------------------------------------------------
# Character classes, mirroring Go's unicode.IsSpace / unicode.IsDigit, which
# differ from Python's str methods (e.g. Python counts \x1c-\x1f as space).

_USPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_NL = ("\n", "\r")
_WS = (" ", "\t")
_SEP = ("=", ":")
_SIZE_LETTERS = frozenset("kKmMgGtTpPeE")
_EOF = ""
# Characters that end a number; anything else turns it into a bare string.
_NUM_END = frozenset(("", "\n", "\r", "}", ";", ",", " ", "\t"))
_BARE_END = frozenset(("", "\n", "\r", ";", ",", "]", "}", " ", "\t"))
_INCLUDE_END = frozenset(("", "\n", "\r", ";", "}", " ", "\t"))
_BOOLS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", '"': '"', "\\": "\\"}
_HEX = frozenset("0123456789abcdefABCDEF")
_DATE_SHAPE = "00-00T00:00:00Z"  # what follows "YYYY-"; 0 means any digit

_SIZE_MULT = {"": 1}
for _i, _letter in enumerate("kmgtpe", start=1):
    _SIZE_MULT[_letter] = 1000**_i
    for _tail in ("b", "i", "ib"):
        _SIZE_MULT[_letter + _tail] = 1024**_i
del _i, _letter, _tail

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT_RE = re.compile(r"-?[0-9]+")
_FLOAT_RE = re.compile(r"-?[0-9]+\.[0-9]+")
# \xHH escapes produce raw bytes; bytes >= 0x80 are parked in the
# surrogate-escape range until the string is complete, so that sequences
# such as \xc3\xa9 come out as the UTF-8 character they spell.
_BYTE_MARK = re.compile("[\udc80-\udcff]")


def _isdigit(c: str) -> bool:
    return "0" <= c <= "9" or (c > "\xff" and c.isdecimal())


def _show(c: str) -> str:
    if c == _EOF:
        return "EOF"
    return "\\n" if c == "\n" else c


def _join_include(base_dir: str, path: str) -> str:
    # Go's filepath.Join: concatenate, then clean.  An absolute include path
    # is therefore still placed under base_dir.
    joined = posixpath.normpath(f"{base_dir or '.'}/{path}" if path else (base_dir or "."))
    if joined.startswith("//") and not joined.startswith("///"):
        joined = joined[1:]
    return joined


class _Done(Exception):
    """The input ended where the reference lexer quietly stops."""


class _Parser:
    def __init__(
        self,
        text: str,
        filename: str,
        base_dir: str,
        env: Optional[Mapping[str, str]],
        include_chain: tuple[str, ...],
        env_refs: Optional[set] = None,
    ):
        self.s = text
        self.n = len(text)
        self.i = 0
        self.file = filename
        self.base_dir = base_dir
        self.env = env
        self.include_chain = include_chain
        self.env_refs = env_refs if env_refs is not None else set()
        self._newlines = [m.start() for m in re.finditer("\n", text)]
        self.root = ConfMap()
        self.ctxs: list = [self.root]
        self.keys: list[tuple[str, Pos]] = []
        self.opened_at: list[Pos] = []
        # nats-server rejects input that ends right after a key, unless the
        # key is a lone "}" (it tolerates a stray closing brace).
        self.dangling_key = False

    # -- positions and errors ------------------------------------------------

    def pos(self, offset: int) -> Pos:
        line = bisect_left(self._newlines, offset)
        line_start = self._newlines[line - 1] + 1 if line else 0
        return Pos(self.file, line + 1, offset - line_start + 1)

    def error(self, reason: str, offset: Optional[int] = None) -> ConfigError:
        if offset is None:
            offset = self.i
        # The reference counts a newline as soon as it has read it, so an
        # error about a newline belongs to the line that follows.
        if offset < self.n and self.s[offset] == "\n":
            offset += 1
        pos = self.pos(min(offset, self.n))
        # conf/parse.go processItem: every lexer error becomes this sentence.
        return ConfigError(reason, pos, f"Parse error on line {pos.line}: '{reason}'")

    # -- low-level reading ----------------------------------------------------

    def next(self) -> str:
        if self.i >= self.n:
            return _EOF
        c = self.s[self.i]
        self.i += 1
        return c

    def peek(self) -> str:
        return self.s[self.i] if self.i < self.n else _EOF

    def backup(self, c: str) -> None:
        if c != _EOF:
            self.i -= 1

    def comment(self) -> None:
        j = self.i
        while j < self.n and self.s[j] not in _NL:
            j += 1
        self.i = j
        self.dangling_key = False

    def slash_comment(self) -> bool:
        """After a '/', consume a '//' comment if this is one."""
        if self.peek() == "/":
            self.i += 1
            self.comment()
            return True
        return False

    # -- driver ----------------------------------------------------------------

    def run(self) -> ConfMap:
        try:
            self.top()
        except _Done:
            pass
        if self.dangling_key:
            key, _ = self.keys[-1]
            pos = self.pos(self.n)
            raise ConfigError(f"key '{key}' has no value", pos,
                              f"config is invalid ({pos.nats()})")
        return self.root

    def finish(self) -> None:
        raise _Done

    def top(self) -> None:
        # The top level may be bare key/values or wrapped in (possibly
        # nested) braces; `returns` remembers where each '}' leads back to.
        returns: list[str] = []
        state = "top"
        while True:
            if state in ("top", "block"):
                while self.peek() in _USPACE:
                    self.i += 1
                c = self.peek()
                if c == "{":
                    self.i += 1
                    returns.append("top" if state == "top" else "block_end")
                    state = "block"
                    continue
                if c == "}" and state == "block":
                    self.i += 1
                    state = returns.pop()
                    continue
                if c == "#":
                    self.i += 1
                    self.comment()
                    continue
                if c == "/":
                    self.i += 1
                    if self.slash_comment():
                        continue
                    raise self.error("Unexpected EOF.", self.i - 1)
                if c == _EOF:
                    self.finish()
                self.key_and_value()
                state = "top_end" if state == "top" else "block_value_end"
            elif state == "top_end":
                c = self.next()
                if c == "#":
                    self.comment()
                    state = "top"
                elif c == "/":
                    if self.slash_comment():
                        state = "top"
                    # otherwise a lone '/' is skipped like a blank
                elif c in _WS:
                    pass
                elif c in _NL or c in (_EOF, ";", ",", "}"):
                    state = "top"
                else:
                    raise self.error(
                        "Expected a top-level value to end with a new line, comment "
                        f"or EOF, but got '{_show(c)}' instead.",
                        self.i - 1,
                    )
            elif state == "block_value_end":
                c = self.next()
                if c == "#":
                    self.comment()
                elif c == "/":
                    self.slash_comment()
                elif c in _WS:
                    pass
                elif c in _NL or c in (";", ","):
                    state = "block"
                elif c == "}":
                    self.backup(c)
                    state = "block_end"
                else:
                    raise self.error(
                        "Expected a block-level value to end with a new line, "
                        f"comment or EOF, but got '{_show(c)}' instead.",
                        self.i - 1 if c else self.n,
                    )
            else:  # block_end: only a '}' (or a separator) may come next
                c = self.next()
                if c == "#":
                    self.comment()
                    state = "block"
                elif c == "/":
                    if self.slash_comment():
                        state = "block"
                elif c in _NL or c in _WS:
                    pass
                elif c in (";", ","):
                    state = "block"
                elif c == "}":
                    state = returns.pop()
                else:
                    raise self.error(
                        f"Expected a block-level to end with a '}}', but got '{_show(c)}' instead.",
                        self.i - 1 if c else self.n,
                    )

    # -- keys --------------------------------------------------------------

    def quoted_key(self, quote: str, eof_msg: Optional[str]) -> None:
        # eof_msg is None for top-level keys, where the reference quietly
        # stops at EOF if nothing followed the opening quote.
        start = self.i
        end = self.s.find(quote, start)
        if end < 0:
            self.i = self.n
            if eof_msg is None:
                if self.n > start:
                    raise self.error("Unexpected EOF.", self.n)
                self.finish()
            raise self.error(eof_msg, self.n)
        self.on_key(self.s[start:end], start)
        self.i = end + 1

    def key_and_value(self) -> None:
        c = self.peek()
        if c in _SEP:
            raise self.error(f"Unexpected key separator '{c}'")
        if c in ('"', "'"):
            self.i += 1
            self.quoted_key(c, None)
        else:
            start = self.i
            self.i += 1
            while True:
                c = self.peek()
                if c in _USPACE:
                    if self.s[start : self.i].lower() == "include":
                        self.include(start)
                        return
                    break
                if c in _SEP or c == _EOF:
                    break
                self.i += 1
            self.on_key(self.s[start : self.i], start)
        while True:
            c = self.next()
            if c in _USPACE:
                continue
            if c in _SEP:
                break
            if c == _EOF:
                self.finish()
            self.backup(c)
            break
        self.value()

    def include(self, key_start: int) -> None:
        while self.peek() in _WS:
            self.i += 1
        c = self.next()
        if c in ("'", '"'):
            start = self.i
            end = self.s.find(c, start)
            if end < 0:
                which = "quoted" if c == "'" else "double quoted"
                raise self.error(f"Unexpected EOF in {which} include", self.n)
            path = self.s[start:end]
            self.i = end + 1
        else:
            what = {"[": "start of an array", "{": "start of a map", "(": "start of a block",
                    "-": "start of a number", "\\": "escape sequence", "\n": "new line",
                    "\r": "new line"}.get(c)
            if what is None and _isdigit(c):
                what = "start of a number"
            if what is not None:
                raise self.error(f"Expected include value but found {what}", self.i - 1)
            self.backup(c)
            start = self.i
            while True:
                c = self.next()
                if c in _INCLUDE_END:
                    self.backup(c)
                    path = self.s[start : self.i]
                    break
                if c == "'":
                    path = self.s[start : self.i - 1]
                    break
        self.on_include(path, key_start)

    # -- values ----------------------------------------------------------------

    def value(self) -> None:
        while True:
            c = self.next()
            if c not in _WS:
                break
        start = self.i - 1
        if c == "[":
            self.on_open(ConfList(), start)
            self.array()
        elif c == "{":
            self.on_open(ConfMap(), start)
            self.map()
        elif c == "'":
            end = self.s.find("'", self.i)
            if end < 0:
                if self.n > self.i:
                    raise self.error("Unexpected EOF.", self.n)
                self.finish()
            self.on_value(self.s[self.i : end], start)
            self.i = end + 1
        elif c == '"':
            self.dq_string(start)
        elif c == "-":
            self.negative(start)
        elif c == "(":
            self.block_string(start)
        elif _isdigit(c):
            self.number(start)
        elif c == ".":
            raise self.error("Floats must start with a digit", start)
        elif c in _NL:
            raise self.error("Expected value but found new line", start)
        else:
            self.backup(c)
            start = self.i
            self.bare_string(start)

    def escape(self) -> str:
        c = self.next()
        if c == "x":
            digits = ""
            for _ in range(2):
                d = self.next()
                if d in _NL:
                    raise self.error(
                        "Expected two hexadecimal digits after '\\x', but hit end of line",
                        self.i - 1,
                    )
                digits += d
            if len(digits) != 2 or not all(d in _HEX for d in digits):
                raise self.error(
                    f"Expected two hexadecimal digits after '\\x', but got '{digits}'",
                    self.i - 1,
                )
            b = int(digits, 16)
            return chr(b) if b < 0x80 else chr(0xDC00 + b)
        if c in _ESCAPES:
            return _ESCAPES[c]
        raise self.error(
            f"Invalid escape character '{_show(c)}'. Only the following escape "
            "characters are allowed: \\xXX, \\t, \\n, \\r, \\\", \\\\.",
            self.i - 1 if c else self.n,
        )

    def dq_string(self, start: int) -> None:
        parts: list[str] = []
        seg = self.i
        while True:
            c = self.next()
            if c == "\\":
                parts.append(self.s[seg : self.i - 1])
                parts.append(self.escape())
                seg = self.i
            elif c == '"':
                parts.append(self.s[seg : self.i - 1])
                self.on_value(_finish_string(parts), start)
                return
            elif c == _EOF:
                if self.n > seg:
                    raise self.error("Unexpected EOF.", self.n)
                self.finish()

    def bare_string(self, start: int) -> None:
        """Scan an unquoted word from self.i; text so far began at start."""
        parts: list[str] = []
        seg = start
        while True:
            c = self.next()
            if c == "\\":
                parts.append(self.s[seg : self.i - 1])
                parts.append(self.escape())
                seg = self.i
            elif c in _BARE_END:
                self.backup(c)
                if parts:
                    parts.append(self.s[seg : self.i])
                    self.on_value(_finish_string(parts), start)
                    return
                raw = self.s[start : self.i]
                lowered = raw.lower()
                if lowered in _BOOLS:
                    self.on_value(_BOOLS[lowered], start)
                elif raw.startswith("$"):
                    self.on_variable(raw[1:], start)
                else:
                    self.on_value(raw, start)
                return
            elif c == "'":
                # A quote ends a bare word (and is swallowed); the word is
                # then always a plain string, never a bool or variable.
                parts.append(self.s[seg : self.i - 1])
                self.on_value(_finish_string(parts), start)
                return

    def number(self, start: int) -> None:
        while True:
            c = self.next()
            if _isdigit(c):
                continue
            if c == "-":
                if len(self.s[start : self.i].encode()) != 5:
                    raise self.error("All ISO8601 dates must be in full Zulu form.", self.i - 1)
                self.datetime(start)
                return
            if c == ".":
                self.fraction(start)
                return
            if c in _SIZE_LETTERS:
                self.size_suffix(start)
                return
            if c in _NUM_END:
                self.backup(c)
                self.on_integer(self.s[start : self.i], start)
                return
            # e.g. 4222abc, 1], 1#x: the rest is an ordinary bare word
            self.bare_string(start)
            return

    def negative(self, start: int) -> None:
        c = self.next()
        if not _isdigit(c):
            if c == ".":
                raise self.error("Floats must start with a digit, not '.'.", self.i - 1)
            raise self.error(f"Expected a digit but got '{_show(c)}'.", self.i - 1 if c else self.n)
        while True:
            c = self.next()
            if _isdigit(c):
                continue
            if c == ".":
                self.fraction(start)
            elif c in _SIZE_LETTERS:
                self.size_suffix(start)
            else:
                self.backup(c)
                self.on_integer(self.s[start : self.i], start)
            return

    def size_suffix(self, start: int) -> None:
        while True:
            c = self.next()
            if c not in ("b", "B", "i", "I"):
                break
        self.backup(c)
        if c in _NUM_END or _isdigit(c):
            self.on_integer(self.s[start : self.i], start)
        else:
            self.bare_string(start)

    def fraction(self, start: int) -> None:
        c = self.next()
        if not _isdigit(c):
            raise self.error(
                f"Floats must have a digit after the '.', but got '{_show(c)}' instead.",
                self.i - 1 if c else self.n,
            )
        while True:
            c = self.next()
            if _isdigit(c):
                continue
            if c == ".":
                # A second dot: an IP address (maybe with :port), as a string.
                while True:
                    c = self.next()
                    if not (_isdigit(c) or c in (".", ":", "-")):
                        break
                self.backup(c)
                self.on_value(self.s[start : self.i], start)
                return
            self.backup(c)
            self.on_float(self.s[start : self.i], start)
            return

    def datetime(self, start: int) -> None:
        for want in _DATE_SHAPE:
            c = self.next()
            at = self.i - 1 if c else self.n
            if want == "0":
                if not _isdigit(c):
                    raise self.error(
                        f"Expected digit in ISO8601 datetime, but found '{_show(c)}' instead.", at
                    )
            elif c != want:
                raise self.error(
                    f"Expected '{want}' in ISO8601 datetime, but found '{_show(c)}' instead.", at
                )
        text = self.s[start : self.i]
        try:
            if not text.isascii():
                raise ValueError
            value = _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
                tzinfo=_dt.timezone.utc
            )
        except ValueError:
            raise self.error(f"expected Zulu formatted DateTime, but got '{text}'", start) from None
        self.on_value(value, start)

    def block_string(self, start: int) -> None:
        body = self.i
        j = self.i
        while True:
            j = self.s.find(")", j)
            if j < 0:
                raise self.error("Unexpected EOF processing block.", self.n)
            # Only a ')' alone on its line closes the block.
            if self.s[j - 1] == "\n":
                if j + 1 == self.n:
                    # The reference keeps the ')' when the file ends there.
                    self.i = j + 1
                    self.on_value(self.s[body : j + 1], start)
                    return
                if self.s[j + 1] == "\n":
                    self.i = j + 1
                    self.on_value(self.s[body:j], start)
                    return
            j += 1

    def array(self) -> None:
        while True:
            c = self.next()
            if c in _USPACE:
                continue
            if c == "#":
                self.comment()
                continue
            if c == "/":
                if self.slash_comment():
                    continue
                raise self.error("Unexpected array value terminator ','.", self.i - 1)
            if c == ",":
                raise self.error("Unexpected array value terminator ','.", self.i - 1)
            if c == "]":
                self.on_close(self.i - 1)
                return
            self.backup(c)
            self.value()
            while True:
                c = self.next()
                if c in _WS:
                    continue
                if c == "#":
                    self.comment()
                    continue
                if c == "/":
                    if self.slash_comment():
                        continue
                    break  # a lone '/' separates values like ','
                if c == "," or c in _NL:
                    break
                if c == "]":
                    self.on_close(self.i - 1)
                    return
                raise self.error(
                    'Expected an array value terminator "," or an array terminator '
                    f'"]", but got \'{_show(c)}\' instead.',
                    self.i - 1 if c else self.n,
                )

    def map(self) -> None:
        while True:
            c = self.peek()
            if c in _SEP:
                raise self.error(f"Unexpected key separator '{c}'.")
            if c == "]":
                raise self.error("Unexpected array end ']' processing map.")
            if c in _USPACE:
                self.i += 1
                continue
            if c == "}":
                self.i += 1
                self.on_close(self.i - 1)
                return
            if c == "#":
                self.i += 1
                self.comment()
                continue
            if c == _EOF:
                raise self.error("Unexpected EOF processing map.", self.n)
            included = False
            if c in ("'", '"'):
                self.i += 1
                which = "quoted" if c == "'" else "double quoted"
                self.quoted_key(c, f"Unexpected EOF processing {which} map key.")
            else:
                if c == "/":
                    self.i += 1
                    if self.slash_comment():
                        continue
                    # The reference drops a lone '/' and starts the key after it.
                start = self.i
                if self.i < self.n:
                    self.i += 1  # the key's first character is taken as is
                while True:
                    c = self.peek()
                    if c == _EOF:
                        raise self.error("Unexpected EOF processing map key.", self.n)
                    if c in _USPACE:
                        if self.s[start : self.i].lower() == "include":
                            self.include(start)
                            included = True
                        break
                    if c in _SEP:
                        break
                    self.i += 1
                if not included:
                    self.on_key(self.s[start : self.i], start)
            if not included:
                while True:
                    c = self.next()
                    if c in _USPACE:
                        continue
                    if c not in _SEP:
                        self.backup(c)
                    break
                while True:
                    c = self.next()
                    if c in _USPACE:
                        continue
                    if c == ",":
                        raise self.error('Unexpected map value terminator ",".', self.i - 1)
                    if c == "}":
                        # "k = }" closes the map; the pending key k receives it.
                        self.on_close(self.i - 1)
                        return
                    self.backup(c)
                    self.value()
                    break
            while True:
                c = self.next()
                if c in _WS:
                    continue
                if c == "#":
                    self.comment()
                    continue
                if c == "/":
                    if self.slash_comment():
                        continue
                    break  # a lone '/' separates entries
                if c in (";", ",") or c in _NL:
                    break
                if c == "}":
                    self.on_close(self.i - 1)
                    return
                raise self.error(
                    'Expected a map value terminator "," or a map terminator "}", '
                    f"but got '{_show(c)}' instead.",
                    self.i - 1 if c else self.n,
                )

    # -- building the result ---------------------------------------------------

    def on_key(self, key: str, offset: int) -> None:
        self.keys.append((key, self.pos(offset)))
        self.dangling_key = key != "}"

    def set_value(self, value: Any, pos: Pos, used: bool = False) -> None:
        self.dangling_key = False
        ctx = self.ctxs[-1]
        if isinstance(ctx, ConfList):
            ctx.append(value)
            ctx.positions.append(pos)
            return
        if not self.keys:
            raise ConfigError("internal error: value without a key", pos)
        key, key_pos = self.keys.pop()
        ctx._put(key, value, key_pos, used)

    def on_value(self, value: Any, offset: int) -> None:
        self.set_value(value, self.pos(offset))

    def on_open(self, container: Any, offset: int) -> None:
        self.dangling_key = False
        self.ctxs.append(container)
        self.opened_at.append(self.pos(offset))

    def on_close(self, offset: int) -> None:
        container = self.ctxs.pop()
        self.set_value(container, self.opened_at.pop())

    def on_integer(self, text: str, offset: int) -> None:
        pos = self.pos(offset)
        digits = 0
        for ch in text:
            if not (_isdigit(ch) or ch == "-"):
                break
            digits += 1
        number, suffix = text[:digits], text[digits:].strip().lower()
        if not _INT_RE.fullmatch(number):
            raise ConfigError(f"expected integer, but got '{text}'", pos)
        value = int(number)
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ConfigError(f"integer '{text}' is out of the range", pos)
        mult = _SIZE_MULT.get(suffix)
        if mult is None:
            raise ConfigError(
                f"invalid size suffix in '{text}' (use k, m, g, t, p, e for powers "
                "of 1000, or kb/ki/kib etc. for powers of 1024)",
                pos,
            )
        value *= mult
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ConfigError(f"integer '{text}' is out of the range", pos)
        self.set_value(value, pos)

    def on_float(self, text: str, offset: int) -> None:
        pos = self.pos(offset)
        if not _FLOAT_RE.fullmatch(text):
            raise ConfigError(f"expected float, but got '{text}'", pos)
        value = float(text)
        if value in (float("inf"), float("-inf")):
            raise ConfigError(f"float '{text}' is out of the range", pos)
        self.set_value(value, pos)

    def on_variable(self, name: str, offset: int) -> None:
        pos = self.pos(offset)
        # Bcrypt hashes look like variables; nats-server lets them through
        # unquoted as long as they use the $2a$ prefix.
        if name.startswith("2a$"):
            self.set_value("$" + name, pos)
            return
        for ctx in reversed(self.ctxs):
            if isinstance(ctx, ConfMap) and name in ctx:
                ctx.used_variables.add(name)
                self.set_value(ctx[name], pos)
                return
        # The reference's sentences name the variable's line (conf/parse.go).
        unparsable = f"variable reference for '{name}' on line {pos.line} could not be parsed: "
        if name in self.env_refs:
            reason = f"variable reference cycle for '{name}'"
            raise ConfigError(reason, pos, unparsable + reason)
        env = os.environ if self.env is None else self.env
        raw = env.get(name)
        if raw is None:
            self.variable_not_found(name, pos)
        # The environment text is parsed like a config value, so PORT=4222
        # yields an int and it may itself refer to other variables.
        self.env_refs.add(name)
        try:
            sub = _Parser(f"pk={raw}", f"<env ${name}>", ".", self.env, self.include_chain, self.env_refs)
            found = sub.run()
        except ConfigError as exc:
            raise ConfigError(f"variable reference for '{name}' could not be parsed: "
                              f"{exc.reason}", pos, unparsable + exc.message) from None
        finally:
            self.env_refs.discard(name)
        if "pk" not in found:
            self.variable_not_found(name, pos)
        self.set_value(found["pk"], pos)

    @staticmethod
    def variable_not_found(name: str, pos: Pos) -> None:
        raise ConfigError(f"variable reference for '{name}' can not be found", pos,
                          f"variable reference for '{name}' on line {pos.line} can not be found")

    def on_include(self, path: str, offset: int) -> None:
        pos = self.pos(offset)
        target = _join_include(self.base_dir, path)
        ident = os.path.realpath(target)
        failed = f"error parsing include file '{path}', "
        if ident in self.include_chain:
            raise ConfigError("include cycle", pos, failed + "include cycle")
        try:
            included = _parse_path(target, self.env, self.include_chain + (ident,))
        except ConfigError as exc:
            # Reported where the included file went wrong, when it says where.
            raise ConfigError(exc.reason, exc.pos or pos, failed + exc.message) from None
        self.dangling_key = False
        for key, value in included.items():
            self.keys.append((key, included.positions[key]))
            self.set_value(value, included.positions[key], key in included.used_variables)


def _finish_string(parts: list[str]) -> str:
    text = "".join(parts)
    if _BYTE_MARK.search(text):
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return text


def _parse_path(path: str, env: Optional[Mapping[str, str]], chain: tuple[str, ...]) -> ConfMap:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        # Go's wording for the failed os.ReadFile: "open <path>: <errno text>"
        # (lower case), or "read <path>: is a directory".
        text = exc.strerror or str(exc)
        text = text[:1].lower() + text[1:]
        op = "read" if isinstance(exc, IsADirectoryError) else "open"
        raise ConfigError(f"error opening config file {path}: {text}",
                          message=f"{op} {path}: {text}") from None
    text = data.decode("utf-8", "replace")
    return _Parser(text, path, os.path.dirname(path) or ".", env, chain).run()


def parse(
    text: str,
    filename: str = "<string>",
    env: Optional[Mapping[str, str]] = None,
) -> ConfMap:
    """Parse config text.  Includes resolve against filename's directory
    (the current directory for the default "<string>").  ``env`` replaces
    ``os.environ`` for ``$VAR`` lookups."""
    chain = (os.path.realpath(filename),) if os.path.exists(filename) else ()
    return _Parser(text, filename, os.path.dirname(filename) or ".", env, chain).run()


def parse_file(path: str, env: Optional[Mapping[str, str]] = None) -> ConfMap:
    """Read and parse a config file (positions name it as given)."""
    return _parse_path(os.fspath(path), env, (os.path.realpath(path),))


# ---------------------------------------------------------------------------
# Durations, as Go's time.ParseDuration reads them.

_DURATION_UNITS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string such as "2s", "1h30m", "500ms",
    "1.5h" or "-2m".  Raises ValueError with Go's wording on bad input."""
    bad = ValueError(f'time: invalid duration "{text}"')
    s = text
    negative = False
    if s[:1] in ("+", "-"):
        negative = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise bad
    total = 0  # nanoseconds
    while s:
        m = _DURATION_PART.match(s)
        whole, frac, unit = m.group(1), m.group(2), m.group(3)
        if not whole and not frac:
            raise bad
        if not unit:
            raise ValueError(f'time: missing unit in duration "{text}"')
        if unit not in _DURATION_UNITS:
            raise ValueError(f'time: unknown unit "{unit}" in duration "{text}"')
        scale = _DURATION_UNITS[unit]
        ns = int(whole or "0") * scale
        if frac:
            # Go truncates sub-nanosecond remainders.
            ns += int(frac) * scale // 10 ** len(frac)
        total += ns
        if total > 1 << 63:
            raise bad
        s = s[m.end():]
    if total > (1 << 63) - 1 and not negative:
        raise bad
    return (-total if negative else total) / 1e9


def parse_size(value) -> int:
    """``1048576``, ``"1MB"``, ``"64MiB"`` -> bytes, with the config format's suffix rules."""
    if isinstance(value, bool):
        raise ValueError("invalid size %r" % value)
    if isinstance(value, int):
        return value
    parsed = parse("v: %s" % str(value).strip()).get("v")
    if isinstance(parsed, bool) or not isinstance(parsed, int):
        raise ValueError("invalid size %r" % value)
    return parsed


def to_duration(value: Any) -> float:
    """Seconds for a duration option value, as nats-server's opts.go reads
    it: a string goes through :func:`parse_duration`; an integer is a count
    of seconds (nats-server accepts it but warns "<option> should be
    converted to a duration").  Anything else is a TypeError."""
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"expected a duration string or seconds, got {type(value).__name__}")
