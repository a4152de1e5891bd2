"""Times as JetStream puts them on the wire: Go's RFC 3339 with nanoseconds, in UTC.

nats-server writes ``time.Time`` values with Go's encoder (RFC3339Nano: trailing zeros
of the fraction dropped) and the zero time as ``0001-01-01T00:00:00Z``; clients parse
both.  Everything inside natsjs is integer nanoseconds since the epoch.
"""
from __future__ import annotations

import calendar
import re
import time

ZERO_TIME = "0001-01-01T00:00:00Z"


def now_ns() -> int:
    return time.time_ns()


def rfc3339_nano(ns: int) -> str:
    """``2026-11-23T06:13:17.98997Z`` for epoch nanoseconds; 0 is Go's zero time."""
    if ns <= 0:
        return ZERO_TIME
    secs, frac = divmod(ns, 1_000_000_000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    if frac:
        return base + ("." + "%09d" % frac).rstrip("0") + "Z"
    return base + "Z"


_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def parse_rfc3339(text: str) -> int:
    """Epoch nanoseconds of an RFC 3339 time (ValueError if it is not one)."""
    m = _RFC3339.match(text)
    if m is None:
        raise ValueError("parsing time %r as RFC 3339" % text)
    y, mo, d, h, mi, s = (int(m.group(i)) for i in range(1, 7))
    if y == 1 and mo == 1 and d == 1 and h == mi == s == 0:
        return 0
    frac = m.group(7) or ""
    ns = int((frac[1:] + "000000000")[:9]) if frac else 0
    secs = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
    tz = m.group(8)
    if tz not in ("Z", "z"):
        sign = 1 if tz[0] == "+" else -1
        secs -= sign * (int(tz[1:3]) * 3600 + int(tz[4:6]) * 60)
    return secs * 1_000_000_000 + ns


_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000,
          "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
_DUR_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> int:
    """Go's time.ParseDuration (``1h2m3.5s``, ``100ms``, ``-2s``) in nanoseconds."""
    s = text.strip()
    if not s:
        raise ValueError("invalid duration %r" % text)
    sign = 1
    if s[0] in "+-":
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if s == "0":
        return 0
    pos, total = 0, 0.0
    while pos < len(s):
        m = _DUR_PART.match(s, pos)
        if m is None:
            raise ValueError("invalid duration %r" % text)
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * int(round(total))


def _fraction(v: int, unit: int, suffix: str) -> str:
    whole, frac = divmod(v, unit)
    out = str(whole)
    if frac:
        digits = len(str(unit)) - 1
        out += "." + ("%0*d" % (digits, frac)).rstrip("0")
    return out + suffix


def go_duration(ns: int) -> str:
    """Go's time.Duration.String(), exactly: 120s -> '2m0s', 1234567ns -> '1.234567ms',
    0 -> '0s' (the one copy: API error texts, monitoring and the CLI all use it)."""
    ns = int(ns)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1000:
        return sign + "%dns" % ns
    if ns < 1_000_000:
        return sign + _fraction(ns, 1000, "µs")
    if ns < 1_000_000_000:
        return sign + _fraction(ns, 1_000_000, "ms")
    h, rest = divmod(ns, 3600 * 10**9)
    m, rest = divmod(rest, 60 * 10**9)
    out = ""
    if h:
        out += "%dh" % h
    if h or m:
        out += "%dm" % m
    return sign + out + _fraction(rest, 10**9, "s")


def go_uptime(seconds: float) -> str:
    """nats-server's myUptime: 1y2d3h4m5s, every unit below the largest shown."""
    t = max(int(seconds), 0)
    mins, hrs = t // 60, t // 3600
    days = hrs // 24
    yrs = days // 365
    if yrs:
        return "%dy%dd%dh%dm%ds" % (yrs, days % 365, hrs % 24, mins % 60, t % 60)
    if days:
        return "%dd%dh%dm%ds" % (days, hrs % 24, mins % 60, t % 60)
    if hrs:
        return "%dh%dm%ds" % (hrs, mins % 60, t % 60)
    if mins:
        return "%dm%ds" % (mins, t % 60)
    return "%ds" % t
