"""natsjs/jetstream/cron.py: when six-field cron patterns fire next (server/cron.go)."""
from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from natsjs.jetstream.cron import CronError, next_time

UTC = dt.timezone.utc


def ns(*args, tz=UTC) -> int:
    return int(dt.datetime(*args, tzinfo=tz).timestamp()) * 1_000_000_000


@pytest.mark.parametrize("pattern,start,want", [
    ("0 0 * * * *", (2026, 1, 1, 10, 30), (2026, 1, 1, 11, 0)),
    ("*/15 * * * * *", (2026, 1, 1, 10, 30, 7), (2026, 1, 1, 10, 30, 15)),
    ("0 0 0 1 1 *", (2026, 3, 1), (2027, 1, 1)),
    ("0 30 9 * * mon-fri", (2026, 11, 28, 12), (2026, 11, 30, 9, 30)),   # a Saturday
    ("0 0 0 29 feb *", (2026, 3, 1), (2028, 2, 29)),
    ("0 0 12 13 * fri", (2026, 1, 1), (2026, 1, 2, 12)),       # either day field matches
    ("0 0 12 13 * ?", (2026, 1, 1), (2026, 1, 13, 12)),
    ("0 0 0 31 * *", (2026, 1, 31, 1), (2026, 3, 31)),          # February has none
    ("5 5 5 5 5 *", (2026, 5, 5, 5, 5, 5), (2027, 5, 5, 5, 5, 5)),  # strictly after
])
def test_next_time(pattern, start, want):
    assert next_time(pattern, None, ns(*start)) == dt.datetime(*want, tzinfo=UTC)


def test_time_zone():
    tz = ZoneInfo("America/New_York")
    got = next_time("0 0 9 * * *", tz, ns(2026, 7, 1, 12))
    assert got == dt.datetime(2026, 7, 1, 9, tzinfo=tz)     # 12:00 UTC is 08:00 there
    assert got.utcoffset() == dt.timedelta(hours=-4)


@pytest.mark.parametrize("pattern", [
    "* * * * *", "* * * * * * *", "60 * * * * *", "* * 24 * * *", "* * * 0 * *",
    "* * * * 13 *", "* * * * * 7", "5-1 * * * * *", "*/0 * * * * *", "1-2-3 * * * * *",
    "1/2/3 * * * * *", "x * * * * *", "-1 * * * * *", "0 0 0 30 2 *"])
def test_refused(pattern):
    with pytest.raises(CronError):
        next_time(pattern, None, ns(2026, 1, 1))
