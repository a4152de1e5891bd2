"""Cron patterns of message schedules (``Nats-Schedule: 0 30 * * * *``): when one fires next.

Six fields (seconds, minutes, hours, day of month, month, day of week), each a comma list
of ``*``/``?``, numbers or names, ``a-b`` ranges and ``/step``; the day fields match
together only when one of them is ``*``, else either matches.  This is server/cron.go
(itself after robfig/cron), used by natsjs/jetstream/schedules.py.
"""
from __future__ import annotations

import datetime as dt

_STAR = 1 << 63
_MONTHS = {n: i + 1 for i, n in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))}
_DAYS = {n: i for i, n in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
# (min, max, names) of each field
_BOUNDS = ((0, 59, None), (0, 59, None), (0, 23, None), (1, 31, None), (1, 12, _MONTHS),
           (0, 6, _DAYS))
_ONE_SECOND = dt.timedelta(seconds=1)


class CronError(ValueError):
    pass


def _int(expr: str) -> int:
    """Go's strconv.Atoi, and no negatives."""
    body = expr[1:] if expr[:1] in "+-" else expr
    if not body.isdigit() or not body.isascii():
        raise CronError("failed to parse int from %s" % expr)
    num = int(expr)
    if num < 0:
        raise CronError("negative number (%d) not allowed: %s" % (num, expr))
    return num


def _int_or_name(expr: str, names) -> int:
    if names and expr.lower() in names:
        return names[expr.lower()]
    return _int(expr)


def _range(expr: str, lo: int, hi: int, names) -> int:
    range_and_step = expr.split("/")
    low_high = range_and_step[0].split("-")
    extra = 0
    if low_high[0] in ("*", "?"):
        start, end, extra = lo, hi, _STAR
    else:
        start = _int_or_name(low_high[0], names)
        if len(low_high) == 1:
            end = start
        elif len(low_high) == 2:
            end = _int_or_name(low_high[1], names)
        else:
            raise CronError("too many hyphens: %s" % expr)
    if len(range_and_step) == 1:
        step = 1
    elif len(range_and_step) == 2:
        step = _int(range_and_step[1])
        if len(low_high) == 1:
            end = hi           # "N/step" is "N-max/step"
        if step > 1:
            extra = 0
    else:
        raise CronError("too many slashes: %s" % expr)
    if start < lo or end > hi or start > end or step == 0:
        raise CronError("invalid range: %s" % expr)
    bits = 0
    for i in range(start, end + 1, step):
        bits |= 1 << i
    return bits | extra


def _field(text: str, bounds) -> int:
    bits = 0
    for expr in (e for e in text.split(",") if e):
        bits |= _range(expr, *bounds)
    return bits


def _day_matches(dom: int, dow: int, t: dt.datetime) -> bool:
    dom_match = bool(1 << t.day & dom)
    dow_match = bool(1 << ((t.weekday() + 1) % 7) & dow)
    if dom & _STAR or dow & _STAR:
        return dom_match and dow_match
    return dom_match or dow_match


def _add_months(t: dt.datetime, n: int) -> dt.datetime:
    """Go's AddDate(0, n, 0): a day past the month's end runs into the next."""
    y, m = divmod(t.month - 1 + n, 12)
    first = t.replace(year=t.year + y, month=m + 1, day=1)
    return first + dt.timedelta(days=t.day - 1)


def next_time(pattern: str, tz: dt.tzinfo | None, ts_ns: int) -> dt.datetime:
    """The first time after ``ts_ns`` (whole seconds) the pattern matches, in ``tz``
    (UTC when None); CronError for a bad pattern or none within five years."""
    fields = pattern.split()
    if len(fields) != 6:
        raise CronError("pattern requires 6 fields, got %d" % len(fields))
    second, minute, hour, dom, month, dow = (_field(f, b) for f, b in zip(fields, _BOUNDS))
    tz = tz or dt.timezone.utc
    t = dt.datetime.fromtimestamp(ts_ns // 1_000_000_000, tz) + _ONE_SECOND
    truncated = False
    year_limit = t.year + 5
    while True:
        if t.year > year_limit:
            raise CronError("pattern exceeds maximum range")
        wrapped = False
        while not 1 << t.month & month:
            if not truncated:
                truncated = True
                t = t.replace(day=1, hour=0, minute=0, second=0)
            t = _add_months(t, 1)
            if t.month == 1:
                wrapped = True
                break
        if wrapped:
            continue
        while not _day_matches(dom, dow, t):
            if not truncated:
                truncated = True
                t = t.replace(hour=0, minute=0, second=0)
            t = (t + dt.timedelta(days=1)).replace(tzinfo=tz)
            if t.day == 1:
                wrapped = True
                break
        if wrapped:
            continue
        while not 1 << t.hour & hour:
            if not truncated:
                truncated = True
                t = t.replace(minute=0, second=0)
            t = _after(t, dt.timedelta(hours=1), tz)
            if t.hour == 0:
                wrapped = True
                break
        if wrapped:
            continue
        while not 1 << t.minute & minute:
            if not truncated:
                truncated = True
                t = t.replace(second=0)
            t = _after(t, dt.timedelta(minutes=1), tz)
            if t.minute == 0:
                wrapped = True
                break
        if wrapped:
            continue
        while not 1 << t.second & second:
            truncated = True
            t = _after(t, _ONE_SECOND, tz)
            if t.second == 0:
                wrapped = True
                break
        if wrapped:
            continue
        return t


def _after(t: dt.datetime, d: dt.timedelta, tz: dt.tzinfo) -> dt.datetime:
    """Go's Time.Add: elapsed time, whatever the wall clock does meanwhile."""
    return (t.astimezone(dt.timezone.utc) + d).astimezone(tz)


__all__ = ["CronError", "next_time"]
