"""How the admin CLI prints: natscli's number, size, duration and time formats, its
column layout for ``info`` screens and its tables for ``ls`` and ``report`` screens.

The formats follow natscli's ``columns`` package and go-humanize (``IBytes``,
``Comma``); the layouts follow the output the NATS documentation shows (JetStream
clustering, Administration): right-aligned labels with a colon, section titles with
a colon and a blank line, and ASCII tables drawn with ``+``, ``-`` and ``|``.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import re
import sys

from natsjs.jetstream.jstime import go_duration, go_uptime, parse_rfc3339

NS = 1_000_000_000
MS = 1_000_000
US = 1_000

# ---- numbers and sizes ------------------------------------------------------------------


def comma(n) -> str:
    """go-humanize Comma: 1385 -> '1,385' (floats keep up to three decimals)."""
    if isinstance(n, float) and not n.is_integer():
        return "{:,.3f}".format(n).rstrip("0").rstrip(".")
    return "{:,}".format(int(n))


_IEC = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
_SI = ("B", "kB", "MB", "GB", "TB", "PB", "EB")


def _humanate(n: float, base: int, sizes) -> str:
    if n < 10:
        return "%d B" % n
    e = int(math.floor(math.log(n) / math.log(base)))
    e = min(e, len(sizes) - 1)
    val = math.floor(n / base ** e * 10 + 0.5) / 10
    return ("%.1f %s" if val < 10 else "%.0f %s") % (val, sizes[e])


def ibytes(n) -> str:
    """go-humanize IBytes: 13631488 -> '13 MiB', 0 -> '0 B'."""
    n = int(n or 0)
    if n < 0:
        return "-" + ibytes(-n)
    return _humanate(n, 1024, _IEC)


_SIZE_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "ki": 1024, "kib": 1024,
    "m": 1000 ** 2, "mb": 1000 ** 2, "mi": 1024 ** 2, "mib": 1024 ** 2,
    "g": 1000 ** 3, "gb": 1000 ** 3, "gi": 1024 ** 3, "gib": 1024 ** 3,
    "t": 1000 ** 4, "tb": 1000 ** 4, "ti": 1024 ** 4, "tib": 1024 ** 4,
}


def parse_bytes(text: str) -> int:
    """A size as natscli takes it: '-1' (unlimited), '1024', '256MB', '1GiB'."""
    text = str(text).strip()
    if text in ("-1", ""):
        return -1
    m = _SIZE_RE.match(text)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError("invalid size %r" % text)
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


# ---- durations ----------------------------------------------------------------------------

_DUR_RE = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h|d|w|M|y)")
_DUR_UNITS = {"ns": 1, "us": US, "µs": US, "ms": MS, "s": NS, "m": 60 * NS, "h": 3600 * NS,
              "d": 24 * 3600 * NS, "w": 7 * 24 * 3600 * NS, "M": 30 * 24 * 3600 * NS,
              "y": 365 * 24 * 3600 * NS}


def parse_duration(text: str) -> int:
    """Nanoseconds from a Go duration ('1m30s', '500ms') or natscli's extra units
    (d, w, M, y); a bare number is seconds, '-1' and '0' mean none."""
    text = str(text).strip()
    if text in ("", "-1", "0"):
        return 0
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return int(float(text) * NS)
    pos, total = 0, 0
    for m in _DUR_RE.finditer(text):
        if m.start() != pos:
            break
        total += int(float(m.group(1)) * _DUR_UNITS[m.group(2)])
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise ValueError("invalid duration %r" % text)
    return total


def duration(ns) -> str:
    """natscli columns.HumanizeDuration: '178µs', '70ms', '1m2s', '3d4h0m0s', 'never'."""
    ns = int(ns)
    if ns >= (1 << 63) - 1:
        return "never"
    if ns < MS:
        return go_duration(round(ns / US) * US)
    if ns < NS:
        return go_duration(round(ns / MS) * MS)
    return go_uptime(ns // NS)


def seconds2(ns) -> str:
    """The documentation's '0.07s' form for how long ago a peer was seen."""
    return "%.2fs" % (int(ns) / NS)


# ---- times --------------------------------------------------------------------------------

def parse_time(text: str | None) -> _dt.datetime | None:
    """An RFC 3339 time from the server (nanosecond fractions allowed); None for the zero
    time Go sends as 0001-01-01T00:00:00Z."""
    if not text:
        return None
    try:
        ns = parse_rfc3339(text)
    except ValueError:
        return None
    if ns <= 0:
        return None
    return _dt.datetime.fromtimestamp(ns // NS, _dt.timezone.utc).replace(
        microsecond=(ns % NS) // 1000)


def local_time(text: str | None) -> str:
    """columns.F(time.Time): local time as '2006-01-02 15:04:05'."""
    t = parse_time(text)
    return t.astimezone().strftime("%Y-%m-%d %H:%M:%S") if t else ""


def local_rfc3339(text: str | None) -> str:
    """The documentation's heading time: '2021-02-05T12:07:34+01:00' in local time."""
    t = parse_time(text)
    return t.astimezone().replace(microsecond=0).isoformat() if t else ""


def since(text: str | None, now: _dt.datetime | None = None) -> int:
    """Nanoseconds between a server time and now (or the server's own timestamp)."""
    t = parse_time(text)
    if t is None:
        return 0
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return max(0, int((now - t).total_seconds() * NS))


def log(msg: str) -> None:
    """natscli's log.Printf with Go's Ltime flag: '14:32:17 message', on stderr."""
    sys.stderr.write("%s %s\n" % (_dt.datetime.now().strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def print_json(value) -> None:
    print(json.dumps(value, indent=2))


def emit(value, as_json: bool, screen) -> None:
    """The server's JSON with --json, else the screen built from it."""
    if as_json:
        print_json(value)
    else:
        screen(value).print()


# ---- values -------------------------------------------------------------------------------


def fmt(value) -> str:
    """columns.F for the values the screens hold."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return comma(value)
    if isinstance(value, float):
        return comma(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    if value is None:
        return ""
    return str(value)


# ---- column screens -----------------------------------------------------------------------


class Columns:
    """An info screen: a heading, then label/value rows grouped under section titles.

    Labels are right-aligned one space past the longest label, so a screen whose
    longest label is 'Maximum Message Size' lines up as the documentation prints
    stream info ('             Replicas: 3').
    """

    def __init__(self, heading: str = ""):
        self.heading = heading
        self.rows: list[tuple[str, str | None]] = []   # (label, value) or (title, None)

    def title(self, text: str) -> None:
        self.rows.append((text, None))

    def row(self, label: str, value) -> None:
        self.rows.append((label, fmt(value)))

    def row_if(self, label: str, value, cond) -> None:
        if cond:
            self.row(label, value)

    def row_nonempty(self, label: str, value) -> None:
        if value:
            self.row(label, value)

    def render(self) -> str:
        labels = [lbl for lbl, v in self.rows if v is not None]
        width = max((len(lbl) for lbl in labels), default=0) + 1
        out = []
        if self.heading:
            out += [self.heading, ""]
        prev = None
        for i, (label, value) in enumerate(self.rows):
            if value is None:
                if i and prev != "title":
                    out.append("")
                out.append(label if label.endswith(":") else label + ":")
                out.append("")
                prev = "title"
                continue
            if label:
                out.append("%s: %s" % (label.rjust(width), value))
            else:
                out.append("%s  %s" % (" " * width, value))
            prev = "row"
        return "\n".join(out) + "\n"

    def print(self) -> None:
        sys.stdout.write(self.render())


# ---- tables -------------------------------------------------------------------------------


class Table:
    """An ASCII table as the documentation's reports print them: an optional centered
    title box, a header row, body rows, optional separators and an optional footer."""

    SEP = object()

    def __init__(self, title: str = "", headers=()):
        self.title = title
        self.headers = [str(h) for h in headers]
        self.rows: list = []
        self.footer: list[str] | None = None

    def add(self, *cells) -> None:
        self.rows.append([fmt(c) if not isinstance(c, str) else c for c in cells])

    def separator(self) -> None:
        self.rows.append(self.SEP)

    def set_footer(self, *cells) -> None:
        self.footer = [fmt(c) if not isinstance(c, str) else c for c in cells]

    def render(self) -> str:
        body = [r for r in self.rows if r is not self.SEP]
        ncol = max([len(self.headers)] + [len(r) for r in body] +
                   [len(self.footer or [])])
        widths = [0] * ncol
        for r in [self.headers] + body + ([self.footer] if self.footer else []):
            for i, c in enumerate(r):
                widths[i] = max(widths[i], len(c))
        if self.title:
            # a title wider than the columns widens the last one, as go-pretty does
            short = len(self.title) + 2 - (sum(widths) + 3 * ncol - 1)
            if short > 0:
                widths[-1] += short
        line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

        def fmt_row(r):
            cells = list(r) + [""] * (ncol - len(r))
            return "|" + "|".join(" %s " % c.ljust(w) for c, w in zip(cells, widths)) + "|"

        out = []
        if self.title:
            inner = len(line) - 2
            pad = inner - len(self.title)
            left = pad // 2
            out.append("+" + "-" * inner + "+")
            out.append("|" + " " * left + self.title + " " * (pad - left) + "|")
        out.append(line)
        if self.headers:
            out.append(fmt_row(self.headers))
            out.append(line)
        for r in self.rows:
            out.append(line if r is self.SEP else fmt_row(r))
        out.append(line)
        if self.footer:
            out.append(fmt_row(self.footer))
            out.append(line)
        return "\n".join(out) + "\n"

    def print(self) -> None:
        sys.stdout.write(self.render())
